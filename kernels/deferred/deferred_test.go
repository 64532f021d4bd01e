package deferred_test

import (
	"math"
	"runtime"
	"runtime/debug"
	"slices"
	"testing"
	"unsafe"

	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/kernels/deferred"
)

func upload(be kernels.Backend, x []float32) []float32 {
	y := kernels.Float32s(be, len(x))
	kernels.Upload(be, y, x)
	return y
}

func download(t *testing.T, be kernels.Backend, x []float32) []float32 {
	t.Helper()
	y := make([]float32, len(x))
	if err := kernels.Download(be, y, x); err != nil {
		t.Fatal(err)
	}
	return y
}

func allNaN(x []float32) bool {
	for _, v := range x {
		if !math.IsNaN(float64(v)) {
			return false
		}
	}
	return true
}

// TestOutputsPoisonedUntilSync: a kernel's output reads NaN from its call
// to the Sync, and the CPU backend's bits after.
func TestOutputsPoisonedUntilSync(t *testing.T) {
	c, d := cpu.New(), deferred.New(cpu.New())
	a, bb := []float32{1, 2, 3, 4}, []float32{10, 20, 30, 40}
	want := make([]float32, 4)
	c.ResidualForward(want, a, bb)
	out := d.Float32s(4)
	da, db := upload(d, a), upload(d, bb)
	d.ResidualForward(out, da, db)
	if !allNaN(out) || !allNaN(da) {
		t.Errorf("before Sync: out %v, uploaded input %v; want NaN", out, da)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out, want) {
		t.Errorf("after Sync: %v, want %v", out, want)
	}
	sums := d.Float64s(1)
	d.Sum(sums, out, 1)
	if !math.IsNaN(sums[0]) {
		t.Errorf("a queued Sum reads %v, want NaN", sums[0])
	}
	got := []float64{0}
	if err := d.Download(got, sums); err != nil || got[0] != 110 {
		t.Errorf("Download: %v, %v; want 110", got[0], err)
	}
}

// TestInputsReadAtSync: a host write to a kernel's input between the call
// and the Sync changes what the kernel computes — the race a GPU has.
func TestInputsReadAtSync(t *testing.T) {
	d := deferred.New(cpu.New())
	in := upload(d, []float32{1, 2, 3})
	out := d.Float32s(3)
	d.Sync()
	d.Scale(in, 1) // a kernel that leaves in as it is
	d.Copy(out, in)
	copy(in, []float32{7, 8, 9}) // the host's write, too early: the Scale restores it
	d.Sync()
	if got := out; !slices.Equal(got, []float32{1, 2, 3}) {
		t.Errorf("out %v after a host write to a queued kernel's output, want the kernel's [1 2 3]", got)
	}
	src := upload(d, []float32{1, 2, 3})
	d.Sync()
	d.Copy(out, src)
	copy(src, []float32{4, 5, 6}) // src is only an input: the Copy reads the new values
	d.Sync()
	if !slices.Equal(out, []float32{4, 5, 6}) {
		t.Errorf("out %v: the Copy did not read its input at Sync", out)
	}
}

// TestAccumulatesExactly: outputs that accumulate (+=) and outputs partly
// written by earlier queued kernels get exactly the CPU backend's results.
func TestAccumulatesExactly(t *testing.T) {
	c, d := cpu.New(), deferred.New(cpu.New())
	const N, IC, OC = 5, 3, 4
	x, w, dout := make([]float32, N*IC), make([]float32, OC*IC), make([]float32, N*OC)
	for i := range x {
		x[i] = float32(i%7) - 3
	}
	for i := range w {
		w[i] = float32(i%5) * 0.5
	}
	for i := range dout {
		dout[i] = float32(i%3) - 1
	}
	run := func(be kernels.Backend) []float32 {
		dw, db, buf := upload(be, slices.Repeat([]float32{1}, OC*IC)), kernels.Float32s(be, OC), upload(be, slices.Repeat([]float32{2}, 10))
		dx, gx, gw, gd := kernels.Float32s(be, N*IC), upload(be, x), upload(be, w), upload(be, dout)
		be.MatmulBackward(dx, dw, db, gd, gx, gw, N, IC, OC)
		be.MatmulBackward(nil, dw, db, gd, gx, gw, N, IC, OC)
		be.Zero(buf[2:5])
		be.Scale(buf[:8], 3) // half on what the Zero writes, half not
		be.Copy(buf[8:], dw[:2])
		var all []float32
		for _, v := range [][]float32{dw, db, dx, buf} {
			all = append(all, download(t, be, v)...)
		}
		return all
	}
	if got, want := run(d), run(c); !slices.Equal(got, want) {
		t.Errorf("deferred %v\n     cpu %v", got, want)
	}
}

// TestUploadCopiesAtCall: Upload's source may be reused at once, and the
// buffer holds it only from the Sync on; kernels queued before the upload
// still see the old contents.
func TestUploadCopiesAtCall(t *testing.T) {
	d := deferred.New(cpu.New())
	tok := d.Int32s(2)
	src := []int32{3, 4}
	d.Upload(tok, src)
	src[0] = 99
	if tok[0] != deferred.Poison32 {
		t.Errorf("an uploaded buffer reads %d before Sync, want the poison", tok[0])
	}
	d.Sync()
	if !slices.Equal(tok, []int32{3, 4}) {
		t.Errorf("uploaded %v, want [3 4]", tok)
	}
	buf, out := upload(d, []float32{1}), d.Float32s(1)
	d.Copy(out, buf)
	d.Upload(buf, []float32{2})
	d.Sync()
	if out[0] != 1 || buf[0] != 2 {
		t.Errorf("copy before the upload read %v (want 1), buffer %v (want 2)", out[0], buf[0])
	}
	if c := d.Counts(); c.Uploads != 3 || c.Downloads != 0 {
		t.Errorf("counts %+v, want 3 uploads", c)
	}
}

// TestForeignMemoryPanics: like the GPU backend, a kernel given memory the
// backend did not allocate panics; a freed buffer reads NaN and panics too.
func TestForeignMemoryPanics(t *testing.T) {
	d := deferred.New(cpu.New())
	mustPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: no panic", name)
			}
		}()
		f()
	}
	out := d.Float32s(3)
	mustPanic("Go memory", func() { d.ResidualForward(out, make([]float32, 3), out) })
	mustPanic("upload from device memory", func() { d.Upload(out, d.Float32s(3)) })
	x := d.Float32s(4)
	d.Free(x)
	if !allNaN(x) {
		t.Errorf("a freed buffer reads %v, want NaN", x)
	}
	mustPanic("freed buffer", func() { d.Zero(x) })
}

// TestLaterOutputsKeepEarlierInputs: a kernel queued after another may
// overwrite that kernel's input (stream order makes it safe); the earlier
// kernel still reads the value it was queued against.
func TestLaterOutputsKeepEarlierInputs(t *testing.T) {
	d := deferred.New(cpu.New())
	in, out := upload(d, []float32{1, 2}), d.Float32s(2)
	tok := d.Int32s(1)
	d.Upload(tok, []int32{5})
	d.Sync()
	d.Copy(out, in)
	d.Upload(in, []float32{3, 4})
	d.Upload(tok, []int32{6})
	d.Sync()
	if !slices.Equal(out, []float32{1, 2}) || !slices.Equal(in, []float32{3, 4}) || tok[0] != 6 {
		t.Errorf("out %v (want [1 2]), in %v (want [3 4]), tok %d (want 6)", out, in, tok[0])
	}
}

// sink keeps the sealed tests' reads from being optimised away.
var sink float32

// faultAt runs f in a goroutine that panics on a memory fault, and returns
// the faulting address, or 0 and false when f ran through.
func faultAt(f func()) (addr uintptr, faulted bool) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() {
			if e, ok := recover().(interface{ Addr() uintptr }); ok {
				addr, faulted = e.Addr(), true
			}
		}()
		f()
	}()
	<-done
	return addr, faulted
}

// TestSealedFaults: the host's read or write of a sealed buffer faults at
// its address, before and after a Sync, while Upload, Download, the
// kernels and Device see the memory.
func TestSealedFaults(t *testing.T) {
	d := deferred.NewSealed(cpu.New())
	if runtime.GOOS != "linux" {
		t.Skip("sealed memory needs Linux")
	}
	if !d.Sealed() || deferred.New(cpu.New()).Sealed() {
		t.Fatal("Sealed() is wrong")
	}
	a, out := upload(d, []float32{1, 2, 3, 4}), d.Float32s(4)
	d.ResidualForward(out, a, a)
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	base := uintptr(unsafe.Pointer(&out[0]))
	if addr, ok := faultAt(func() { sink = out[2] }); !ok || addr != base+8 {
		t.Errorf("a host read of out[2] after Sync: faulted %v at %#x, want a fault at %#x", ok, addr, base+8)
	}
	if _, ok := faultAt(func() { a[0] = 7 }); !ok {
		t.Errorf("a host write of a buffer did not fault")
	}
	if got := download(t, d, out); !slices.Equal(got, []float32{2, 4, 6, 8}) {
		t.Errorf("downloaded %v, want [2 4 6 8]", got)
	}
	// A communicator reads and writes at the buffer's Alias; the host's
	// address still faults meanwhile.
	dev := (*[4]float32)(d.Alias(unsafe.Pointer(&out[0])))
	if dev[3] != 8 {
		t.Errorf("at Alias: read %v, want 8", dev[3])
	}
	dev[1] = 5
	if _, ok := faultAt(func() { sink = out[0] }); !ok {
		t.Errorf("a host read while the Alias is in use did not fault")
	}
	if got := download(t, d, out); !slices.Equal(got, []float32{2, 5, 6, 8}) {
		t.Errorf("after a write at Alias, downloaded %v, want [2 5 6 8]", got)
	}
	if p := unsafe.Pointer(&sink); d.Alias(p) != p {
		t.Errorf("Alias moved an address outside the backend's memory")
	}
	// The memory grows past its first mapping, and stays sealed.
	big := d.Float32s(1 << 20)
	if _, ok := faultAt(func() { sink = big[len(big)-1] }); !ok {
		t.Errorf("a host read of a buffer in a later mapping did not fault")
	}
	if got := download(t, d, big[:2]); !slices.Equal(got, []float32{0, 0}) {
		t.Errorf("a new buffer reads %v, want zeros", got)
	}
	mustPanic(t, "Download into device memory", func() { d.Download(out, a) })
}

// TestSealedMatchesCPU: the sealed backend computes the CPU backend's bits
// (TestAccumulatesExactly's kernels).
func TestSealedMatchesCPU(t *testing.T) {
	d, c := deferred.NewSealed(cpu.New()), cpu.New()
	run := func(be kernels.Backend) []float32 {
		dw, db := upload(be, slices.Repeat([]float32{1}, 12)), kernels.Float32s(be, 4)
		dx, gx, gw, gd := kernels.Float32s(be, 15), upload(be, make([]float32, 15)), upload(be, slices.Repeat([]float32{0.5}, 12)), upload(be, slices.Repeat([]float32{-1, 0, 1}, 20)[:20])
		be.MatmulBackward(dx, dw, db, gd, gx, gw, 5, 3, 4)
		be.Scale(dw, 3)
		var all []float32
		for _, v := range [][]float32{dw, db, dx} {
			all = append(all, download(t, be, v)...)
		}
		return all
	}
	if got, want := run(d), run(c); !slices.Equal(got, want) {
		t.Errorf("sealed %v\n   cpu %v", got, want)
	}
}

func mustPanic(t *testing.T, name string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s: no panic", name)
		}
	}()
	f()
}
