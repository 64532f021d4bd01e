package cuda

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/units"
)

// Precision is the element type the GEMMs multiply in. Under bf16 the
// activations are bfloat16 too (activations.go); everything else —
// parameters (the fp32 master weights), gradients, optimizer moments —
// stays fp32, every kernel computes in fp32, and the GEMMs accumulate in
// fp32.
type Precision int

const (
	// PrecisionFP32 multiplies in IEEE fp32 (never TF32), as the CPU does.
	PrecisionFP32 Precision = iota
	// PrecisionBF16 rounds both GEMM inputs to bfloat16 (the GPU default).
	PrecisionBF16
	// PrecisionFP16 rounds both GEMM inputs to IEEE half; the engine scales the loss.
	PrecisionFP16
)

// ParsePrecision maps Engine.mix_precision.dtype ("fp32", "bf16", "fp16")
// to a Precision.
func ParsePrecision(dtype string) (Precision, error) {
	switch dtype {
	case "fp32", "float32":
		return PrecisionFP32, nil
	case "bf16", "bfloat16":
		return PrecisionBF16, nil
	case "fp16", "float16":
		return PrecisionFP16, nil
	}
	return 0, fmt.Errorf("mix_precision dtype %q: want fp32, bf16 or fp16", dtype)
}

// PrecisionOn is the precision the GEMMs of a device of compute
// capability major.x use for p: p itself, but fp16 for bf16 before 8.0
// (Volta and Turing have no bf16 tensor cores, and cuBLAS refuses bf16
// GEMMs there). Precision reports the backend's.
func PrecisionOn(p Precision, major int) Precision {
	if p == PrecisionBF16 && major < 8 {
		return PrecisionFP16
	}
	return p
}

func (p Precision) String() string {
	switch p {
	case PrecisionBF16:
		return "bf16"
	case PrecisionFP16:
		return "fp16"
	}
	return "fp32"
}

// dataType is the GEMM input type of p.
func (p Precision) dataType() DataType {
	switch p {
	case PrecisionBF16:
		return BF16
	case PrecisionFP16:
		return F16
	}
	return F32
}

// Options configure New.
type Options struct {
	Ordinal   int       // the GPU (CUDA device ordinal)
	Precision Precision // the GEMMs' input type
	CacheDir  string    // compiled kernels; DefaultCacheDir() when ""
	Log       io.Writer // a line on compiling or finding the kernels and one on their variants; nil for none
	// Need is the device memory the caller will allocate (the engine's
	// accounting of its buffers); New refuses a device with less free, with
	// a *MemoryError, before it compiles or allocates anything. 0: no
	// check.
	Need int64
}

// MemoryError is New's refusal of a device with less free memory than
// Options.Need.
type MemoryError struct {
	Device      string // its name and ordinal
	Need        int64
	Free, Total int64
}

func (e *MemoryError) Error() string {
	return fmt.Sprintf("cuda: %s has %s free of %s, and %s is needed", e.Device, units.Bytes(e.Free), units.Bytes(e.Total), units.Bytes(e.Need))
}

// Backend runs the engine's layers on one GPU: it implements
// kernels.Backend with the kernels of [Source] and cuBLAS, kernels.Memory
// with device memory (cuMemAlloc), and kernels.AttentionStore (the
// flash-style attention keeps one log-sum-exp per row).
//
// Buffers are device memory returned to the engine as Go slices whose
// addresses are the device's (unified addressing keeps them apart from the
// host's): the engine re-slices them and passes them to kernels, Upload,
// Download and NCCL as it does on the CPU, but the host cannot read or
// write them — it copies in and out through Upload and Download, which
// stage through pinned buffers (staging.go). Under bf16, Activations'
// buffers are bfloat16s behind float32 addresses (activations.go). There
// is no managed memory:
// a layout that does not fit fails its allocation instead of paging to the
// host. Every kernel runs on
// one stream in call order. The interface's methods return nothing: the
// first failure is kept and returned by Sync (and by Err); later calls are
// skipped.
//
// Calls go through the device's primary context on the calling goroutine's
// locked OS thread (see [Device]); a Backend is meant to be driven by one
// goroutine.
type Backend struct {
	dev  *Device
	blas *BLAS
	k    *Kernels
	mod  *Module
	s    Stream
	prec Precision

	mu     sync.Mutex
	allocs map[uintptr]int        // device allocations: base → bytes
	halves map[uintptr]*halfArena // bfloat16 activations (Activations): buffer → its arena
	arena  *halfArena             // the arena Activations carves from
	spans  []span                 // both, sorted by base (for pointer checks)
	err    error                  // the first failure

	// Scratch: GEMM inputs rounded to 16 bits (castA, castB), the bias of
	// a GEMM into bfloat16 activations rounded for cuBLASLt's epilogue
	// (biasHalf), or where cuBLASLt refused an epilogue (refused, its
	// first refusal of each) the float32 product that the backend's own
	// kernel finishes (product); attention's dq summed in float32 for a
	// bfloat16 dqkv (dq).
	castA, castB, biasHalf, product, dq scratch
	refused                             map[Epilogue]error

	// The bfloat16 copy of the weights (CopyWeights), and the addresses of
	// the float32s it copies while it is in use (0 and 0 when not).
	weights  scratch
	wlo, whi uintptr

	sumScratch Ptr // Sum's partials
	shared     map[string]int
	variants   *Variants // the kernels' variants for the device

	flash flashState // the flash-attention kernels chosen (flashattention.go)

	stage stager // Upload's pinned buffers (staging.go)

	peakOnce sync.Once
	peak     float64
	name     string
}

// span is an allocation's addresses as the engine sees them: a bfloat16
// one (half) holds hi−lo float32s' addresses and half as many bytes.
type span struct {
	lo, hi uintptr
	half   bool
}

// scratch is a device buffer the backend grows as calls need.
type scratch struct {
	p Ptr
	n int // bytes
}

// New opens GPU opts.Ordinal, compiles (or finds in the cache) the kernels
// for its architecture, and returns the Backend. The error says which
// library or step failed; on a machine without CUDA it names the library
// and where it was looked for.
func New(opts Options) (*Backend, error) {
	dev, err := Open(opts.Ordinal)
	if err != nil {
		return nil, err
	}
	major, minor := dev.Arch()
	b := &Backend{dev: dev, prec: PrecisionOn(opts.Precision, major), allocs: map[uintptr]int{}, halves: map[uintptr]*halfArena{}, shared: map[string]int{}, stage: stager{dev: dev}}
	fail := func(err error) (*Backend, error) {
		b.Close()
		return nil, err
	}
	if b.prec != opts.Precision && opts.Log != nil {
		fmt.Fprintf(opts.Log, "cuda: sm_%d%d has no bf16: the GEMMs multiply in fp16 instead, and the engine scales the loss\n", major, minor)
	}
	if opts.Need > 0 {
		free, total, err := dev.MemInfo()
		if err != nil {
			return fail(err)
		}
		if opts.Need > free {
			return fail(&MemoryError{Device: fmt.Sprintf("GPU %d (%s)", opts.Ordinal, dev.Name()), Need: opts.Need, Free: free, Total: total})
		}
	}
	// The kernels' variants, before the compile: a device without room
	// for some kernel is refused at once.
	if b.variants, err = SelectVariants(dev.Attrs()); err != nil {
		return fail(err)
	}
	if opts.Log != nil {
		fmt.Fprintf(opts.Log, "cuda: %s\n", b.variants)
	}
	nv, err := LoadNVRTC()
	if err != nil {
		return fail(err)
	}
	cache := nv.NewCache(opts.CacheDir)
	t0 := time.Now()
	copts := compileOptions(ArchFlag(major, minor), b.variants)
	img, hit, err := cache.Get(Source(), "gptui.cu", copts)
	if err != nil {
		return fail(fmt.Errorf("cuda: compiling the kernels for sm_%d%d: %w", major, minor, err))
	}
	if opts.Log != nil {
		how := fmt.Sprintf("compiled by NVRTC %d.%d in %.1f s", nv.major, nv.minor, time.Since(t0).Seconds())
		if hit {
			how = "from the cache"
		}
		fmt.Fprintf(opts.Log, "cuda: kernels for sm_%d%d %s (%s)\n", major, minor, how, cache.Path(Source(), "gptui.cu", copts))
	}
	if b.mod, err = dev.Load(img); err != nil {
		return fail(err)
	}
	if b.k, err = NewKernelsFor(dev, b.mod.Function, b.variants); err != nil {
		return fail(err)
	}
	// Each chosen variant's limit, raised to its own size only.
	for name, n := range b.variants.SharedNeeds() {
		if err := b.needShared(name, n); err != nil {
			return fail(err)
		}
	}
	if err := b.flashInit(opts.Log); err != nil {
		return fail(err)
	}
	b.epiloguesInit(opts.Log)
	if b.s, err = dev.NewStream(); err != nil {
		return fail(err)
	}
	if b.blas, err = dev.NewBLAS(b.s); err != nil {
		return fail(err)
	}
	if b.sumScratch, err = dev.Alloc(SumScratch); err != nil {
		return fail(err)
	}
	if b.err != nil {
		return fail(b.err)
	}
	b.name = fmt.Sprintf("cuda %s (sm_%d%d, %d SMs, %s), GEMMs in %s via cuBLAS", dev.Name(), major, minor, dev.SMs(), units.Bytes(dev.TotalMemory()), b.prec)
	return b, nil
}

// needShared raises kernel name's dynamic shared memory limit to n bytes
// when n is past the default 48 KiB, or says, naming the kernel, that the
// device cannot give it n.
func (b *Backend) needShared(name string, n int) error {
	if n <= defaultShared || b.shared[name] >= n {
		return nil
	}
	if err := b.variants.checkShared(name, n); err != nil {
		return err
	}
	f, err := b.mod.Function(name)
	if err != nil {
		return err
	}
	if err := b.dev.SetMaxShared(f, n); err != nil {
		return fmt.Errorf("cuda: %s needs %d bytes of shared memory: %w", name, n, err)
	}
	b.shared[name] = n
	return nil
}

// Close frees what the backend allocated and releases the device.
func (b *Backend) Close() error {
	if b.dev == nil {
		return nil
	}
	var errs []error
	if b.s != 0 {
		errs = append(errs, b.dev.Sync(b.s))
	}
	if b.blas != nil {
		errs = append(errs, b.blas.Close())
	}
	errs = append(errs, b.stage.close())
	ps := []Ptr{b.sumScratch, b.flash.delta}
	for _, sc := range b.scratches() {
		ps = append(ps, sc.p)
	}
	for _, p := range ps {
		if p != 0 {
			errs = append(errs, b.dev.Free(p))
		}
	}
	for p := range b.allocs {
		errs = append(errs, b.dev.Free(Ptr(p)))
	}
	arenas := map[*halfArena]bool{}
	if b.arena != nil {
		arenas[b.arena] = true
	}
	for _, a := range b.halves {
		arenas[a] = true
	}
	for a := range arenas {
		errs = append(errs, b.dev.Unreserve(a.r))
	}
	b.allocs, b.halves, b.arena, b.spans = map[uintptr]int{}, map[uintptr]*halfArena{}, nil, nil
	if b.mod != nil {
		errs = append(errs, b.mod.Close())
	}
	if b.s != 0 {
		errs = append(errs, b.dev.DestroyStream(b.s))
	}
	errs = append(errs, b.dev.Close())
	b.dev = nil
	return errors.Join(errs...)
}

// Variants are the kernel variants chosen for the device at New.
func (b *Backend) Variants() *Variants { return b.variants }

// Device is the GPU the backend runs on.
func (b *Backend) Device() *Device { return b.dev }

// BLAS is the backend's cuBLAS handle (on its stream).
func (b *Backend) BLAS() *BLAS { return b.blas }

// Stream is the stream every kernel of the backend runs on.
func (b *Backend) Stream() Stream { return b.s }

// Precision is the GEMMs' input type.
func (b *Backend) Precision() Precision { return b.prec }

// Err returns the first failure of a kernel, GEMM or allocation, if any.
func (b *Backend) Err() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// fail records err as the backend's first failure.
func (b *Backend) fail(op string, err error) {
	if err == nil {
		return
	}
	b.mu.Lock()
	if b.err == nil {
		b.err = fmt.Errorf("%s: %w", op, err)
	}
	b.mu.Unlock()
}

// ok reports whether no failure has been recorded (later work is skipped
// after one: a CUDA error leaves the context unusable).
func (b *Backend) ok() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err == nil
}

// ---- kernels.Memory ----

// alloc returns n bytes of device memory (cuMemAlloc), zeroed by a memset
// queued on the stream: the kernels queued after see zeros.
func (b *Backend) alloc(n int) unsafe.Pointer {
	if n == 0 {
		n = 4 // a real address for empty buffers
	}
	if !b.ok() {
		panic(&AllocError{Bytes: n, Mem: memString(b.dev), Err: b.Err()})
	}
	p, err := b.dev.Alloc(n)
	if err == nil {
		if err = b.dev.Memset(p, n, b.s); err != nil {
			b.dev.Free(p)
		}
	}
	if err != nil {
		// kernels.Memory's methods cannot fail: the engine allocates while
		// it sets up, and running out of GPU memory there is a failure it
		// cannot go on from. The CLI recovers *AllocError into one line.
		panic(&AllocError{Bytes: n, Mem: memString(b.dev), Err: err})
	}
	b.mu.Lock()
	b.allocs[uintptr(p)] = n
	b.addSpan(span{lo: uintptr(p), hi: uintptr(p) + uintptr(n)})
	b.mu.Unlock()
	return ptrOf(p)
}

// addSpan records s in the sorted spans (under mu).
func (b *Backend) addSpan(s span) {
	i, _ := slices.BinarySearchFunc(b.spans, s.lo, func(s span, x uintptr) int { return cmp.Compare(s.lo, x) })
	b.spans = slices.Insert(b.spans, i, s)
}

// AllocError is what the backend panics with when the engine's memory
// cannot be allocated on the GPU (kernels.Memory has no error results).
type AllocError struct {
	Bytes int    // the allocation asked for
	Mem   string // the device's free and total memory then
	Err   error
}

func (e *AllocError) Error() string {
	return fmt.Sprintf("cuda: allocating %d bytes on the GPU (%s): %v", e.Bytes, e.Mem, e.Err)
}

func (e *AllocError) Unwrap() error { return e.Err }

func memString(d *Device) string {
	free, total, err := d.MemInfo()
	if err != nil {
		return "memory unknown"
	}
	return fmt.Sprintf("%s of %s free", units.Bytes(free), units.Bytes(total))
}

// ptrOf turns a device address into an unsafe.Pointer without go vet's
// uintptr-conversion warning: device memory is outside the Go heap, so
// the garbage collector never moves, frees or reads it.
func ptrOf(p Ptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

// Float32s returns n zeroed float32s of device memory.
func (b *Backend) Float32s(n int) []float32 { return unsafe.Slice((*float32)(b.alloc(4*n)), n) }

// Int32s returns n zeroed int32s of device memory.
func (b *Backend) Int32s(n int) []int32 { return unsafe.Slice((*int32)(b.alloc(4*n)), n) }

// Float64s returns n zeroed float64s of device memory.
func (b *Backend) Float64s(n int) []float64 { return unsafe.Slice((*float64)(b.alloc(8*n)), n) }

// Free gives back a buffer Float32s, Int32s or Float64s returned. Buffers
// the backend did not allocate are ignored.
func (b *Backend) Free(x any) {
	var p uintptr
	switch v := x.(type) {
	case []float32:
		p = uintptr(unsafe.Pointer(unsafe.SliceData(v)))
	case []int32:
		p = uintptr(unsafe.Pointer(unsafe.SliceData(v)))
	case []float64:
		p = uintptr(unsafe.Pointer(unsafe.SliceData(v)))
	default:
		return
	}
	b.mu.Lock()
	_, ok := b.allocs[p]
	if ok {
		delete(b.allocs, p)
		b.dropSpan(p)
	}
	a := b.halves[p]
	delete(b.halves, p)
	b.mu.Unlock()
	switch {
	case ok:
		// Kernels queued on the stream may still use it.
		b.fail("free", errors.Join(b.dev.Sync(b.s), b.dev.Free(Ptr(p))))
	case a != nil:
		b.fail("free", b.freeHalf(a))
	}
}

// Upload copies src (host memory) into dst (the backend's), ordered as
// kernels.Memory asks: through a pinned buffer, with the copy queued on the
// backend's stream after the kernels queued before it (staging.go). The
// host does not wait for the device unless every pinned buffer is still in
// flight; src may be reused as soon as Upload returns.
func (b *Backend) Upload(dst, src any) {
	d, s, n := hostCopy("Upload", dst, src)
	if !b.ok() || n == 0 {
		return
	}
	if sp := b.spanOf(d, n); sp.half {
		// Rounded to bfloat16 on the host, as the buffer's kernels round
		// what they store: half the bytes cross.
		h := halfBits(src.([]float32))
		b.run("Upload", b.stage.upload(sp.addr(d), unsafe.Pointer(unsafe.SliceData(h)), 2*len(h), b.s))
		return
	}
	b.run("Upload", b.stage.upload(b.check(d, n), s, n, b.s))
}

// Download copies src (the backend's memory) into dst (host memory) once
// the kernels queued before have finished, and returns the first failure.
func (b *Backend) Download(dst, src any) error {
	d, s, n := hostCopy("Download", src, dst)
	if err := b.Sync(); err != nil {
		return err
	}
	if n == 0 {
		return b.Err()
	}
	if sp := b.spanOf(d, n); sp.half {
		h := make([]uint16, n/4)
		if err := b.dev.CopyDtoH(unsafe.Pointer(unsafe.SliceData(h)), sp.addr(d), 2*len(h)); err != nil {
			b.fail("Download", err)
			return b.Err()
		}
		widenBits(dst.([]float32), h)
		return b.Err()
	}
	b.fail("Download", b.dev.CopyDtoH(s, b.check(d, n), n))
	return b.Err()
}

// hostCopy returns the addresses of dev and host, slices of one element
// type ([]float32, []int32 or []float64) and length, and their size in
// bytes; it panics on anything else (a bug in the engine).
func hostCopy(op string, dev, host any) (uintptr, unsafe.Pointer, int) {
	size := func(x any) (uintptr, unsafe.Pointer, int, int) {
		switch v := x.(type) {
		case []float32:
			return uintptr(unsafe.Pointer(unsafe.SliceData(v))), unsafe.Pointer(unsafe.SliceData(v)), len(v), 4
		case []int32:
			return uintptr(unsafe.Pointer(unsafe.SliceData(v))), unsafe.Pointer(unsafe.SliceData(v)), len(v), 4
		case []float64:
			return uintptr(unsafe.Pointer(unsafe.SliceData(v))), unsafe.Pointer(unsafe.SliceData(v)), len(v), 8
		}
		panic(fmt.Sprintf("cuda: %s of a %T", op, x))
	}
	d, _, dn, de := size(dev)
	_, h, hn, he := size(host)
	if dn != hn || de != he || fmt.Sprintf("%T", dev) != fmt.Sprintf("%T", host) {
		panic(fmt.Sprintf("cuda: %s between a %T of %d and a %T of %d", op, dev, dn, host, hn))
	}
	return d, h, dn * de
}

// Sync waits for every kernel queued so far and returns the first failure.
func (b *Backend) Sync() error {
	if b.ok() {
		b.fail("synchronize", b.dev.Sync(b.s))
	}
	return b.Err()
}

// AttentionFloats: the flash-style attention keeps the log-sum-exp of each
// of the B·NH·T rows.
func (b *Backend) AttentionFloats(B, NH, T int) int { return B * NH * T }

// ptr returns the device address of x, which must lie in memory the
// backend allocated (nil or empty: 0). A Go-heap slice here is a bug in
// the engine: the GPU cannot read it.
func (b *Backend) ptr(x []float32) Ptr {
	if len(x) == 0 {
		return 0
	}
	return b.check(uintptr(unsafe.Pointer(unsafe.SliceData(x))), 4*len(x))
}

func (b *Backend) ptr32(x []int32) Ptr {
	if len(x) == 0 {
		return 0
	}
	return b.check(uintptr(unsafe.Pointer(unsafe.SliceData(x))), 4*len(x))
}

func (b *Backend) ptr64(x []float64) Ptr {
	if len(x) == 0 {
		return 0
	}
	return b.check(uintptr(unsafe.Pointer(unsafe.SliceData(x))), 8*len(x))
}

func (b *Backend) check(p uintptr, n int) Ptr {
	if s := b.spanOf(p, n); s.half {
		panic(fmt.Sprintf("cuda: a buffer of %d bytes at %#x holds bfloat16 activations, which this call does not take (a bug: give it float32s)", n, p))
	}
	return Ptr(p)
}

// spanOf returns the allocation holding the n bytes at p, as the engine
// addresses them; it panics where there is none (a bug in the engine).
func (b *Backend) spanOf(p uintptr, n int) span {
	b.mu.Lock()
	i, found := slices.BinarySearchFunc(b.spans, p, func(s span, x uintptr) int { return cmp.Compare(s.lo, x) })
	if !found {
		i--
	}
	in := i >= 0 && i < len(b.spans) && p >= b.spans[i].lo && p+uintptr(n) <= b.spans[i].hi
	var s span
	if in {
		s = b.spans[i]
	}
	b.mu.Unlock()
	if !in {
		panic(fmt.Sprintf("cuda: a buffer of %d bytes at %#x is not GPU memory (allocate it with kernels.Float32s)", n, p))
	}
	return s
}

// addr is the device address of the element the engine addresses at p:
// p itself, or in a bfloat16 span the element's 2 bytes.
func (s span) addr(p uintptr) Ptr {
	if s.half {
		return Ptr(s.lo + (p-s.lo)/2)
	}
	return Ptr(p)
}

// buf returns x as a kernel's activation argument: a BF16Ptr to its
// bfloat16s when x lies in Activations' memory, else a Ptr (nil or
// empty: 0).
func (b *Backend) buf(x []float32) Buf {
	if len(x) == 0 {
		return Ptr(0)
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(x)))
	s := b.spanOf(p, 4*len(x))
	if s.half {
		return BF16Ptr(s.addr(p))
	}
	return Ptr(p)
}

// run records the error of one queued operation.
func (b *Backend) run(op string, err error) { b.fail(op, err) }

// ---- kernels.Backend ----

// Name describes the GPU and the GEMM precision.
func (b *Backend) Name() string { return b.name }

// grow returns sc's buffer, first made at least bytes long (after the
// work queued on the stream, which may still use the old one).
func (b *Backend) grow(sc *scratch, bytes int) (Ptr, error) {
	if sc.n < bytes {
		if sc.p != 0 {
			if err := errors.Join(b.dev.Sync(b.s), b.dev.Free(sc.p)); err != nil {
				return 0, err
			}
			*sc = scratch{}
		}
		p, err := b.dev.Alloc(bytes)
		if err != nil {
			return 0, fmt.Errorf("cuda: scratch of %d bytes (%s): %w", bytes, memString(b.dev), err)
		}
		*sc = scratch{p, bytes}
	}
	return sc.p, nil
}

// dqFor is the float32 buffer attention sums dq in before storing it into
// a bfloat16 dqkv (n floats), or 0 when dqkv is float32.
func (b *Backend) dqFor(dqkv []float32, n int) (Ptr, error) {
	if _, half := b.buf(dqkv).buf(); !half {
		return 0, nil
	}
	return b.grow(&b.dq, 4*n)
}

// EncoderForward: out (B,T,C) = wte[inp] + wpe[t].
func (b *Backend) EncoderForward(out []float32, inp []int32, wte, wpe []float32, B, T, C int) {
	if b.ok() {
		b.run("EncoderForward", b.k.EncoderForward(b.s, b.buf(out), b.ptr32(inp), b.ptr(wte), b.ptr(wpe), B, T, C, len(wte)/C))
	}
}

// EncoderBackward accumulates dwte and dwpe from dout.
func (b *Backend) EncoderBackward(dwte, dwpe, dout []float32, inp []int32, B, T, C int) {
	if b.ok() {
		b.run("EncoderBackward", b.k.EncoderBackward(b.s, b.ptr(dwte), b.ptr(dwpe), b.buf(dout), b.ptr32(inp), B, T, C, len(dwte)/C))
	}
}

// EncoderShardForward is the vocabulary-parallel embedding of kernels/cpu.
func (b *Backend) EncoderShardForward(out []float32, inp []int32, wte []float32, vlo int, wpe []float32, B, T, C int) {
	if b.ok() {
		b.run("EncoderShardForward", b.k.EncoderShardForward(b.s, b.buf(out), b.ptr32(inp), b.ptr(wte), vlo, len(wte)/C, b.ptr(wpe), B, T, C))
	}
}

// EncoderShardBackward is the vocabulary-parallel embedding's backward.
func (b *Backend) EncoderShardBackward(dwte []float32, vlo int, dwpe, dout []float32, inp []int32, B, T, C int) {
	if b.ok() {
		b.run("EncoderShardBackward", b.k.EncoderShardBackward(b.s, b.ptr(dwte), vlo, len(dwte)/C, b.ptr(dwpe), b.buf(dout), b.ptr32(inp), B, T, C))
	}
}

// LayerNormForward normalises N rows of C channels.
func (b *Backend) LayerNormForward(out, mean, rstd, inp, w, bias []float32, N, C int) {
	if b.ok() {
		b.run("LayerNormForward", b.k.LayerNormForward(b.s, b.buf(out), b.ptr(mean), b.ptr(rstd), b.buf(inp), b.ptr(w), b.ptr(bias), N, C))
	}
}

// LayerNormBackward accumulates into dinp, dw and dbias.
func (b *Backend) LayerNormBackward(dinp, dw, dbias, dout, inp, w, mean, rstd []float32, N, C int) {
	if !b.ok() {
		return
	}
	if err := b.needShared("layernorm_backward", LayerNormBackwardShared(C)); err != nil {
		ln, _ := b.variants.NormMaxChannels()
		b.run("LayerNormBackward", fmt.Errorf("C=%d (at most %d here): %w", C, ln, err))
		return
	}
	b.run("LayerNormBackward", b.k.LayerNormBackward(b.s, b.buf(dinp), b.ptr(dw), b.ptr(dbias), b.buf(dout), b.buf(inp), b.ptr(w), b.ptr(mean), b.ptr(rstd), N, C))
}

// WorkspaceBytes is the device memory the backend holds beside the
// engine's buffers, as it stands: cuBLAS's and cuBLASLt's workspace
// (WorkspaceBytes), Sum's partials (SumScratch), the flash attention's
// backward scratch, the copy of the weights (CopyWeights) and the GEMMs'
// and attention's scratch buffers, which grow as the calls need. The planner's account of a GPU's memory
// (planner's cudaWorkspace) is checked against it.
func (b *Backend) WorkspaceBytes() int64 {
	n := int64(WorkspaceBytes+SumScratch) + 4*int64(b.flash.deltaN)
	for _, sc := range b.scratches() {
		n += int64(sc.n)
	}
	return n
}

// scratches are the scratch buffers the backend grows (grow), for Close
// to free and WorkspaceBytes to count.
func (b *Backend) scratches() []scratch {
	return []scratch{b.castA, b.castB, b.biasHalf, b.product, b.dq, b.weights}
}

// AttentionForward is causal self-attention; att holds each row's
// log-sum-exp (AttentionFloats), not the probabilities.
func (b *Backend) AttentionForward(out, att, qkv []float32, B, T, C, NH int, d kernels.Dropout, off uint64) {
	if b.ok() && !b.flashForward(out, att, qkv, B, T, NH, NH, flashHS(C, NH), d) {
		b.run("AttentionForward", b.k.AttentionForward(b.s, b.buf(out), b.ptr(att), b.buf(qkv), B, T, C, NH, d.P, d.Key, d.Heads, d.Head0, off))
	}
}

// AttentionBackward overwrites dqkv, recomputing the probabilities from qkv
// and the log-sum-exps in att; out is the forward pass's output.
func (b *Backend) AttentionBackward(dqkv, dout, out, qkv, att []float32, B, T, C, NH int, d kernels.Dropout, off uint64) {
	if b.ok() && !b.flashBackward(dqkv, dout, out, qkv, att, B, T, NH, NH, flashHS(C, NH), d) {
		dq, err := b.dqFor(dqkv, B*T*C)
		if err == nil {
			err = b.k.AttentionBackward(b.s, b.buf(dqkv), b.buf(dout), b.buf(out), b.buf(qkv), b.ptr(att), dq, B, T, C, NH, d.P, d.Key, d.Heads, d.Head0, off)
		}
		b.run("AttentionBackward", err)
	}
}

// AttentionDecode attends one new position per sequence to a KV cache.
func (b *Backend) AttentionDecode(out, q, kc, vc []float32, B, pos, maxT, C, NH int) {
	if b.ok() {
		b.run("AttentionDecode", b.k.AttentionDecode(b.s, b.buf(out), b.buf(q), b.ptr(kc), b.ptr(vc), B, pos, maxT, C, NH))
	}
}

// GeluForward applies GELU (tanh approximation).
func (b *Backend) GeluForward(out, inp []float32) {
	if b.ok() {
		b.run("GeluForward", b.k.GeluForward(b.s, b.buf(out), b.buf(inp), len(inp)))
	}
}

// GeluBackward computes dinp (overwritten).
func (b *Backend) GeluBackward(dinp, inp, out, dout []float32) {
	if b.ok() {
		b.run("GeluBackward", b.k.GeluBackward(b.s, b.buf(dinp), b.buf(inp), b.buf(out), b.buf(dout), len(inp)))
	}
}

// ResidualForward: out = a + c.
func (b *Backend) ResidualForward(out, a, c []float32) {
	if b.ok() {
		b.run("ResidualForward", b.k.ResidualForward(b.s, b.buf(out), b.buf(a), b.buf(c), len(a)))
	}
}

// DropoutForward draws the CPU backend's mask, element for element.
func (b *Backend) DropoutForward(out, inp []float32, d kernels.Dropout, off uint64) {
	if b.ok() {
		b.run("DropoutForward", b.k.DropoutForward(b.s, b.buf(out), b.buf(inp), len(inp), d.P, d.Key, off))
	}
}

// DropoutBackward applies the forward pass's mask to dout.
func (b *Backend) DropoutBackward(dinp, dout []float32, d kernels.Dropout, off uint64) {
	if b.ok() {
		b.run("DropoutBackward", b.k.DropoutBackward(b.s, b.buf(dinp), b.buf(dout), len(dout), d.P, d.Key, off))
	}
}

// CrossEntropy is the fused classifier: losses, and with grad the logits'
// gradient (times dscale) in place.
func (b *Backend) CrossEntropy(losses, logits []float32, targets []int32, N, V, ld int, dscale float32, grad bool) {
	if b.ok() {
		b.run("CrossEntropy", b.k.CrossEntropy(b.s, b.ptr(losses), b.buf(logits), b.ptr32(targets), N, V, ld, dscale, grad))
	}
}

// ClassifierMax writes each row's maximum logit.
func (b *Backend) ClassifierMax(maxes, logits []float32, N, V, ld int) {
	if b.ok() {
		b.run("ClassifierMax", b.k.ClassifierMax(b.s, b.ptr(maxes), b.buf(logits), N, V, ld))
	}
}

// ClassifierGlobalMax reduces the ranks' row maxima gmax (MP,N) to maxes.
func (b *Backend) ClassifierGlobalMax(maxes, gmax []float32, N, MP int) {
	if b.ok() {
		b.run("ClassifierGlobalMax", b.k.ClassifierGlobalMax(b.s, b.ptr(maxes), b.ptr(gmax), N, MP))
	}
}

// ClassifierExp writes each row's Σ e^(x−max) and target logit.
func (b *Backend) ClassifierExp(stats []float64, logits []float32, targets []int32, maxes []float32, N, V, ld, vlo int) {
	if b.ok() {
		b.run("ClassifierExp", b.k.ClassifierExp(b.s, b.ptr64(stats), b.buf(logits), b.ptr32(targets), b.ptr(maxes), N, V, ld, vlo))
	}
}

// ClassifierFinish writes the losses and the logits' gradient.
func (b *Backend) ClassifierFinish(losses, logits []float32, targets []int32, maxes []float32, stats []float64, N, V, ld, vlo int, dscale float32, grad bool) {
	if b.ok() {
		b.run("ClassifierFinish", b.k.ClassifierFinish(b.s, b.ptr(losses), b.buf(logits), b.ptr32(targets), b.ptr(maxes), b.ptr64(stats), N, V, ld, vlo, dscale, grad))
	}
}

// AdamW updates params and the moments in place (fp32 master weights).
func (b *Backend) AdamW(params, grads, m, v []float32, lr, beta1, beta2, eps, wd, gscale float32, step int) {
	if b.ok() {
		b.run("AdamW", b.k.AdamW(b.s, b.ptr(params), b.ptr(grads), b.ptr(m), b.ptr(v), len(params), lr, beta1, beta2, eps, wd, gscale, step))
	}
}

// Sum adds w·Σ x to out[0] (a double of the backend's memory) on the
// GPU; the host reads it with Download.
func (b *Backend) Sum(out []float64, x []float32, w float64) { b.sum("Sum", out, x, w, false) }

// SumSquares adds w·Σ x² to out[0], as Sum.
func (b *Backend) SumSquares(out []float64, x []float32, w float64) {
	b.sum("SumSquares", out, x, w, true)
}

func (b *Backend) sum(op string, out []float64, x []float32, w float64, square bool) {
	if b.ok() && len(x) > 0 {
		b.run(op, b.k.Sum(b.s, b.ptr64(out[:1]), b.ptr(x), len(x), b.sumScratch, w, square))
	}
}

// Copy queues dst = src on the stream.
func (b *Backend) Copy(dst, src []float32) {
	if len(dst) != len(src) {
		panic(fmt.Sprintf("cuda: Copy of %d elements into %d", len(src), len(dst)))
	}
	if !b.ok() || len(dst) == 0 {
		return
	}
	dp, dh := b.buf(dst).buf()
	sp, sh := b.buf(src).buf()
	switch {
	case dh && sh:
		b.run("Copy", b.dev.CopyDtoD(dp, sp, 2*len(dst), b.s))
	case dh:
		b.run("Copy", b.k.CastF32ToBF16(b.s, dp, sp, len(dst)))
	case sh:
		b.run("Copy", b.k.CastBF16ToF32(b.s, dp, sp, len(dst)))
	default:
		b.run("Copy", b.dev.CopyDtoD(dp, sp, 4*len(dst), b.s))
	}
}

// Zero clears x.
func (b *Backend) Zero(x []float32) {
	if b.ok() && len(x) > 0 {
		p, half := b.buf(x).buf()
		n := 4 * len(x)
		if half {
			n = 2 * len(x)
		}
		b.run("Zero", b.dev.Memset(p, n, b.s))
	}
}

// Scale multiplies x by s.
func (b *Backend) Scale(x []float32, s float32) {
	if b.ok() {
		b.run("Scale", b.k.Scale(b.s, b.buf(x), len(x), s))
	}
}
