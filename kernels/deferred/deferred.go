// Package deferred is a test double for the GPU backend on machines
// without one: a [kernels.Backend] and [kernels.Memory] that runs another
// backend's kernels (the CPU's) as late as an asynchronous device may.
//
// Every kernel call is queued and runs only at the next Sync — or
// Download, or Free, which sync first — in call order. When a kernel is
// queued, its outputs are poisoned: the host reads NaN in them until the
// kernel has run (float64 outputs read NaN too, int32 ones [Poison32]).
// Its inputs are read when it runs, not when it is called. So an engine
// that reads a kernel's output before synchronising reads NaN, and one
// that writes a kernel's input (or output) before the kernel has run
// changes the kernel's result — where the CPU backend, which has finished
// every kernel when the method returns, lets both pass silently. A
// communicator tied to the backend as its stream (comm.World.Fabric)
// syncs it before touching a buffer, as a GPU's would wait for its stream.
//
// The results are exact, the CPU backend's to the bit: a queued kernel
// keeps a copy of what of its outputs no kernel queued before it writes,
// and Sync puts these copies back before it runs the queue, so each
// kernel sees what the kernels before it left — an output that
// accumulates (+=) adds to its true previous contents, and an input a
// later kernel overwrites still holds its value. Buffers come from Float32s, Int32s
// and Float64s; a kernel given other memory panics, as the GPU backend
// does, and a buffer given back with Free is poisoned, so a stale view of
// it reads NaN.
//
// # Sealed memory
//
// A Backend from [NewSealed] also keeps its buffers where the host cannot
// touch them, as a GPU's device memory (cuMemAlloc) is. Its memory is
// mapped twice: the buffers the engine gets are addresses in the host's
// view, which is PROT_NONE; the kernels, Upload, Download and the
// double's own poisoning work on the device's view of the same pages,
// which [Backend.Alias] gives — where a communicator tied to the backend
// as its stream moves a buffer's data (comm's DeviceStream), as a GPU's
// copy engine or NCCL's kernels would. Any other read or write of a
// buffer — an engine that reads a loss out of the backend's memory after
// a Sync instead of downloading it, or fills weights with a host loop
// instead of an upload, even while a communicator's operation is in
// flight — faults: the process dies with "unexpected fault address" and
// the stack of the line that touched it (in a goroutine that has called
// runtime/debug.SetPanicOnFault, it panics instead with a runtime.Error
// whose Addr is the address). Slicing a buffer, taking its length or
// passing it to a kernel does not touch its memory and stays allowed.
// The host's view is never opened, so sealing costs no system call once
// the memory is mapped. Sealing needs Linux (memfd, mmap); on other
// systems NewSealed's buffers are Go memory and [Backend.Sealed] reports
// false.
//
// A Backend is for one goroutine (a rank's training loop), as the GPU
// backend is; its methods lock, so that a communicator's goroutines may
// sync it.
package deferred

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sync"
	"unsafe"

	"github.com/gptui/gptui/kernels"
)

// Poison32 is what the host reads in an int32 output of a kernel that has
// not run: far outside any vocabulary.
const Poison32 = math.MinInt32 + 0x7fc0

// Backend queues the kernels of an inner synchronous backend until Sync.
type Backend struct {
	inner kernels.Backend
	mem   *arena // the buffers' memory when sealed; nil: the Go heap

	mu     sync.Mutex
	allocs []*alloc // by base address
	queue  []op
	counts Counts
}

// Counts are what a Backend has done so far, for tests that bound the
// host's traffic with the device.
type Counts struct {
	Kernels   int // kernel calls, uploads and copies queued
	Syncs     int // Sync calls, Download's and Free's included
	Uploads   int
	Downloads int
}

// alloc is one buffer of the backend.
type alloc struct {
	base unsafe.Pointer // the buffer's address, the host's
	dev  unsafe.Pointer // where the double reads and writes it: base unless sealed
	size int            // bytes
	keep any            // the slice, so that it stays allocated (nil: the sealed arena keeps it)
	half bool           // bfloat16 activations, marked in the inner backend (Activations)

	// written are the byte ranges [lo, hi) of the buffer that queued
	// kernels write, sorted and merged.
	written [][2]int
}

// op is a queued kernel: the saved contents of its outputs to put back,
// then the call.
type op struct {
	name  string
	saved []saved
	run   func()
}

// saved is a byte range of a buffer as it was when a kernel was queued.
type saved struct {
	a    *alloc
	off  int
	data []byte
}

// region is a slice of a buffer: its bytes and the element type that
// poisons it.
type region struct {
	a    *alloc
	off  int
	n    int  // bytes
	kind byte // 'f' float32, 'i' int32, 'd' float64
}

// New returns a Backend that runs inner's kernels. inner must compute
// synchronously (not implement kernels.Memory): the CPU backend.
func New(inner kernels.Backend) *Backend {
	if _, ok := inner.(kernels.Memory); ok {
		panic("deferred: the inner backend must be synchronous")
	}
	return &Backend{inner: inner}
}

// NewSealed returns a Backend that runs inner's kernels, as New does, on
// sealed buffers: memory the host can read and write only through Upload
// and Download (see the package doc). A host access faults.
func NewSealed(inner kernels.Backend) *Backend {
	b := New(inner)
	seal(b)
	return b
}

// Sealed reports whether the backend's buffers are sealed: from
// NewSealed, on Linux.
func (b *Backend) Sealed() bool { return b.mem != nil }

// Alias returns the device's address of the host's address p, where the
// double's kernels and copies touch a sealed buffer; p itself when p is
// not a sealed buffer's. A communicator tied to the backend as its stream
// (comm.DeviceStream) moves a buffer's data there, as a GPU's copy engine
// or NCCL's kernels would; nothing else should read or write through it.
func (b *Backend) Alias(p unsafe.Pointer) unsafe.Pointer { return b.mem.dev(p) }

// Name is the inner backend's, marked deferred.
func (b *Backend) Name() string { return "deferred " + b.inner.Name() }

// PeakFLOPS is the inner backend's.
func (b *Backend) PeakFLOPS() float64 { return b.inner.PeakFLOPS() }

// Counts returns what the backend has done so far.
func (b *Backend) Counts() Counts {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.counts
}

// ---- kernels.Memory ----

// Float32s returns n zeroed float32s of the backend's memory.
func (b *Backend) Float32s(n int) []float32 {
	if b.mem != nil && n > 0 {
		x := unsafe.Slice((*float32)(b.mem.alloc(4*n)), n)
		b.register(unsafe.Pointer(unsafe.SliceData(x)), 4*n, nil)
		return x
	}
	x := make([]float32, n)
	b.register(unsafe.Pointer(unsafe.SliceData(x)), 4*n, x)
	return x
}

// Int32s returns n zeroed int32s of the backend's memory.
func (b *Backend) Int32s(n int) []int32 {
	if b.mem != nil && n > 0 {
		x := unsafe.Slice((*int32)(b.mem.alloc(4*n)), n)
		b.register(unsafe.Pointer(unsafe.SliceData(x)), 4*n, nil)
		return x
	}
	x := make([]int32, n)
	b.register(unsafe.Pointer(unsafe.SliceData(x)), 4*n, x)
	return x
}

// Float64s returns n zeroed float64s of the backend's memory.
func (b *Backend) Float64s(n int) []float64 {
	if b.mem != nil && n > 0 {
		x := unsafe.Slice((*float64)(b.mem.alloc(8*n)), n)
		b.register(unsafe.Pointer(unsafe.SliceData(x)), 8*n, nil)
		return x
	}
	x := make([]float64, n)
	b.register(unsafe.Pointer(unsafe.SliceData(x)), 8*n, x)
	return x
}

func (b *Backend) register(p unsafe.Pointer, size int, keep any) {
	if size == 0 {
		return // nothing to address; a kernel given it touches nothing
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	a := &alloc{base: p, dev: b.mem.dev(p), size: size, keep: keep}
	i, _ := slices.BinarySearchFunc(b.allocs, uintptr(p), func(a *alloc, x uintptr) int { return cmp.Compare(uintptr(a.base), x) })
	b.allocs = slices.Insert(b.allocs, i, a)
}

// Free syncs, then gives x back and poisons it: a view of it that is
// still used reads NaN, and a kernel given one panics.
func (b *Backend) Free(x any) {
	b.Sync()
	r, ok := b.find(x)
	if !ok || r.off != 0 {
		return
	}
	if r.a.half {
		b.inner.(activationMarker).UnmarkActivations(dev(b, unsafe.Slice((*float32)(r.a.base), r.a.size/4)))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r.n = r.a.size
	poison(r)
	b.allocs = slices.DeleteFunc(b.allocs, func(a *alloc) bool { return a == r.a })
}

// activationMarker is the inner backend's side of Activations: the CPU's
// kernels round what they store into the buffers it marks (kernels/cpu's
// MarkActivations).
type activationMarker interface {
	MarkActivations(x []float32) bool
	UnmarkActivations(x []float32)
}

// Activations returns n zeroed float32s of the backend's memory that the
// inner backend's kernels treat as bfloat16 activations when it does
// (kernels.ActivationMemory): a CPU backend under bf16 rounds what its
// kernels store there, so the double computes the CPU's numbers to the
// bit. Otherwise they are Float32s'.
func (b *Backend) Activations(n int) []float32 {
	x := b.Float32s(n)
	m, ok := b.inner.(activationMarker)
	if !ok || n == 0 || !m.MarkActivations(dev(b, x)) {
		return x
	}
	if r, ok := b.find(x); ok {
		b.mu.Lock()
		r.a.half = true
		b.mu.Unlock()
	}
	return x
}

// Upload queues dst = src: src is copied now, into the backend's queue,
// and lands in dst when the queue runs.
func (b *Backend) Upload(dst, src any) {
	if _, ok := b.find(src); ok {
		panic(fmt.Sprintf("deferred: Upload from the backend's own memory (a %T)", src))
	}
	data := bytesOf(src)
	if len(data) != len(bytesOf(dst)) {
		panic(fmt.Sprintf("deferred: Upload of a %T of %d bytes into a %T of %d", src, len(data), dst, len(bytesOf(dst))))
	}
	data = slices.Clone(data)
	b.enqueue("Upload", func() { copy(b.devBytes(bytesOf(dst)), data) }, []any{dst}, nil)
	b.mu.Lock()
	b.counts.Uploads++
	b.mu.Unlock()
}

// Download syncs, then copies src into dst.
func (b *Backend) Download(dst, src any) error {
	b.check("Download", src)
	if _, ok := b.find(dst); ok {
		panic(fmt.Sprintf("deferred: Download into the backend's own memory (a %T)", dst))
	}
	err := b.Sync()
	d, s := bytesOf(dst), bytesOf(src)
	if len(d) != len(s) || fmt.Sprintf("%T", dst) != fmt.Sprintf("%T", src) {
		panic(fmt.Sprintf("deferred: Download of a %T of %d bytes into a %T of %d", src, len(s), dst, len(d)))
	}
	copy(d, b.devBytes(s))
	b.mu.Lock()
	b.counts.Downloads++
	b.mu.Unlock()
	return err
}

// Sync runs the queued kernels in order.
func (b *Backend) Sync() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.counts.Syncs++
	q := b.queue
	b.queue = nil
	// Back to what the buffers held before the queued kernels poisoned
	// them — each byte a kernel writes was saved by the first kernel that
	// writes it — and then the kernels in order: each sees what the ones
	// before it left, as on one stream.
	for _, o := range q {
		for _, s := range o.saved {
			copy(bytesAt(s.a, s.off, len(s.data)), s.data)
		}
	}
	for _, o := range q {
		o.run()
	}
	for _, a := range b.allocs {
		a.written = a.written[:0]
	}
	return nil
}

// ---- queueing ----

// enqueue queues a kernel that writes outs and reads ins (slices of the
// backend's memory; nil or empty ones are skipped): it saves what of outs
// no queued kernel writes, poisons outs, and appends run to the queue.
func (b *Backend) enqueue(name string, run func(), outs, ins []any) {
	var ro []region
	for _, x := range outs {
		if r, ok := b.check(name, x); ok {
			ro = append(ro, r)
		}
	}
	for _, x := range ins {
		b.check(name, x)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	o := op{name: name, run: run}
	for _, r := range ro {
		for _, u := range uncovered(r.a.written, r.off, r.off+r.n) {
			o.saved = append(o.saved, saved{r.a, u[0], slices.Clone(bytesAt(r.a, u[0], u[1]-u[0]))})
		}
	}
	for _, r := range ro {
		poison(r)
		r.a.written = addRange(r.a.written, r.off, r.off+r.n)
	}
	b.queue = append(b.queue, o)
	b.counts.Kernels++
}

// check returns the region of x, which must be nil, empty, or lie in one
// buffer of the backend: like the GPU backend, it panics on other memory.
func (b *Backend) check(op string, x any) (region, bool) {
	r, ok := b.find(x)
	if !ok && len(bytesOf(x)) > 0 {
		panic(fmt.Sprintf("deferred: %s: a %T of %d bytes is not the backend's memory (allocate it with kernels.Float32s)", op, x, len(bytesOf(x))))
	}
	return r, ok
}

// find returns the region x covers, if it lies in one buffer.
func (b *Backend) find(x any) (region, bool) {
	data := bytesOf(x)
	if len(data) == 0 {
		return region{}, false
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	b.mu.Lock()
	defer b.mu.Unlock()
	i, found := slices.BinarySearchFunc(b.allocs, p, func(a *alloc, x uintptr) int { return cmp.Compare(uintptr(a.base), x) })
	if !found {
		i--
	}
	if i < 0 {
		return region{}, false
	}
	a := b.allocs[i]
	off := int(p - uintptr(a.base))
	if off < 0 || off+len(data) > a.size {
		return region{}, false
	}
	return region{a: a, off: off, n: len(data), kind: kindOf(x)}, true
}

// uncovered returns the parts of [lo, hi) outside the sorted, merged
// ranges rs.
func uncovered(rs [][2]int, lo, hi int) [][2]int {
	var out [][2]int
	for _, r := range rs {
		if r[1] <= lo {
			continue
		}
		if r[0] >= hi {
			break
		}
		if r[0] > lo {
			out = append(out, [2]int{lo, r[0]})
		}
		lo = max(lo, r[1])
	}
	if lo < hi {
		out = append(out, [2]int{lo, hi})
	}
	return out
}

// addRange adds [lo, hi) to the sorted, merged ranges rs.
func addRange(rs [][2]int, lo, hi int) [][2]int {
	i, _ := slices.BinarySearchFunc(rs, lo, func(r [2]int, x int) int { return cmp.Compare(r[0], x) })
	rs = slices.Insert(rs, i, [2]int{lo, hi})
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && r[0] <= out[n-1][1] {
			out[n-1][1] = max(out[n-1][1], r[1])
			continue
		}
		out = append(out, r)
	}
	return out
}

// poison fills a region with what the host reads in a kernel's output
// before the kernel has run.
func poison(r region) {
	p := unsafe.Add(r.a.dev, r.off)
	switch r.kind {
	case 'f':
		x := unsafe.Slice((*float32)(p), r.n/4)
		for i := range x {
			x[i] = float32(math.NaN())
		}
	case 'd':
		x := unsafe.Slice((*float64)(p), r.n/8)
		for i := range x {
			x[i] = math.NaN()
		}
	default:
		x := unsafe.Slice((*int32)(p), r.n/4)
		for i := range x {
			x[i] = Poison32
		}
	}
}

// bytesAt returns the device's view of n bytes of a at off.
func bytesAt(a *alloc, off, n int) []byte {
	return unsafe.Slice((*byte)(unsafe.Add(a.dev, off)), n)
}

// devBytes returns the device's view of x, bytes of the backend's memory.
func (b *Backend) devBytes(x []byte) []byte {
	if b.mem == nil || len(x) == 0 {
		return x
	}
	return unsafe.Slice((*byte)(b.mem.dev(unsafe.Pointer(unsafe.SliceData(x)))), len(x))
}

// dev returns the device's view of x, a slice of the backend's memory (nil
// and empty slices as they are), for the inner backend's kernels.
func dev[T float32 | int32 | float64](b *Backend, x []T) []T {
	if b.mem == nil || len(x) == 0 {
		return x
	}
	return unsafe.Slice((*T)(b.mem.dev(unsafe.Pointer(unsafe.SliceData(x)))), len(x))
}

// bytesOf returns the memory of a []float32, []int32 or []float64.
func bytesOf(x any) []byte {
	switch v := x.(type) {
	case []float32:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
	case []int32:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
	case []float64:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 8*len(v))
	case nil:
		return nil
	}
	panic(fmt.Sprintf("deferred: a %T is not a buffer", x))
}

func kindOf(x any) byte {
	switch x.(type) {
	case []float32:
		return 'f'
	case []float64:
		return 'd'
	}
	return 'i'
}

var (
	_ kernels.Backend = (*Backend)(nil)
	_ kernels.Memory  = (*Backend)(nil)
)
