package cudacheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/gptui/gptui/half"
	"github.com/gptui/gptui/kernels/cuda"
)

// selfTestSource is the self-test's kernel: each thread writes
// out[i] = a[i]·s + i, and thread 0 stores tag, so that every argument
// type of a launch (Ptr, int32, float32, uint64) and their packing
// (n at 16, s at 20, tag at 24, tagOut at 32) is checked.
const selfTestSource = `
extern "C" __global__ void selftest_axpi(float *out, const float *a, int n, float s,
                                        unsigned long long tag, unsigned long long *tagOut) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) out[i] = a[i] * s + (float)i;
	if (i == 0) *tagOut = tag;
}
`

// selfTest runs named checks, one line each, and keeps going after a
// failure.
type selfTest struct {
	ctx    context.Context
	w      io.Writer
	passed int
	failed []string
	start  time.Time
}

// check runs f and prints "PASS name  detail" or "FAIL name  error"; a
// panic in f is a failure too. It reports whether f passed.
func (t *selfTest) check(name string, f func() (string, error)) (ok bool) {
	if err := t.ctx.Err(); err != nil {
		t.report("FAIL", name, err.Error())
		return false
	}
	defer func() {
		if r := recover(); r != nil {
			t.report("FAIL", name, fmt.Sprintf("panic: %v\n%s", r, debug.Stack()))
			ok = false
		}
	}()
	detail, err := f()
	if err != nil {
		t.report("FAIL", name, err.Error())
		return false
	}
	t.report("PASS", name, detail)
	return true
}

// skip reports a check that could not run because an earlier one failed.
func (t *selfTest) skip(name, why string) { t.report("FAIL", name, "not run: "+why) }

func (t *selfTest) report(status, name, detail string) {
	if status == "PASS" {
		t.passed++
	} else {
		t.failed = append(t.failed, name)
	}
	fmt.Fprintf(t.w, "%s  %-34s %s\n", status, name, detail)
}

// SelfTest checks the GPU backend's bindings on device 0, one line per
// check with PASS or FAIL and its figures: the device and driver, the
// kernel variants chosen for its shared memory (cuda.SelectVariants), memory
// (device and managed, prefetch, copies), NVRTC and the compile cache, a
// kernel launch with every argument type, event timing, cuBLAS GEMMs in
// fp32 (exact), bf16 and fp16 against a host reference, a strided batch,
// cuBLASLt matmuls with bias, GELU and bias-gradient epilogues, NCCL on
// one rank, and the measured bf16 GEMM rate. It goes on after a failure
// and returns an error naming the checks that failed.
func SelfTest(ctx context.Context, w io.Writer) error {
	t := &selfTest{ctx: ctx, w: w, start: time.Now()}
	defer func() {
		fmt.Fprintf(w, "self-test: %d passed, %d failed in %.1fs\n", t.passed, len(t.failed), time.Since(t.start).Seconds())
	}()
	var d *cuda.Device
	if !t.check("open device 0", func() (string, error) {
		var err error
		if d, err = cuda.Open(0); err != nil {
			return "", err
		}
		major, minor := d.Arch()
		free, total, err := d.MemInfo()
		if err != nil {
			return "", err
		}
		n, _ := cuda.DeviceCount()
		return fmt.Sprintf("%s, sm_%d%d, %d SMs, %.1f GiB (%.1f free), driver CUDA %d.%d, %d device(s), %s",
			d.Name(), major, minor, d.SMs(), gib(total), gib(free), d.DriverVersion()/1000, d.DriverVersion()%1000/10, n, d.LibraryPath()), nil
	}) {
		for _, name := range []string{"kernel variants", "memory", "NVRTC", "kernel launch", "cuBLAS", "cuBLASLt", "NCCL"} {
			t.skip(name, "no device")
		}
		return t.result()
	}
	defer d.Close()

	// The variants cuda.New will choose (and log) for this device.
	t.check("kernel variants", func() (string, error) {
		v, err := cuda.SelectVariants(d.Attrs())
		if err != nil {
			return "", err
		}
		return v.String(), nil
	})
	t.memory(d)
	f := t.compile(d)
	t.launch(d, f)
	t.blas(d)
	t.nccl(d)
	return t.result()
}

func (t *selfTest) result() error {
	if len(t.failed) > 0 {
		return fmt.Errorf("cuda self-test: %d check(s) failed: %s", len(t.failed), strings.Join(t.failed, ", "))
	}
	return nil
}

func gib(b int64) float64 { return float64(b) / (1 << 30) }

// upload copies host values to new device memory.
func upload[T any](d *cuda.Device, v []T) (cuda.Ptr, error) {
	n := len(v) * int(unsafe.Sizeof(v[0]))
	p, err := d.Alloc(n)
	if err != nil {
		return 0, err
	}
	if err := d.CopyHtoD(p, unsafe.Pointer(&v[0]), n); err != nil {
		d.Free(p)
		return 0, err
	}
	return p, nil
}

// download copies n values from device memory.
func download[T any](d *cuda.Device, p cuda.Ptr, n int) ([]T, error) {
	v := make([]T, n)
	return v, d.CopyDtoH(unsafe.Pointer(&v[0]), p, n*int(unsafe.Sizeof(v[0])))
}

// hostBytes views n bytes of managed memory at p from the host.
func hostBytes(p cuda.Ptr, n int) []byte {
	return unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&p))), n)
}

func (t *selfTest) memory(d *cuda.Device) {
	t.check("alloc/memset/free 256 MiB", func() (string, error) {
		free0, _, err := d.MemInfo()
		if err != nil {
			return "", err
		}
		const n = 256 << 20
		p, err := d.Alloc(n)
		if err != nil {
			return "", err
		}
		free1, _, _ := d.MemInfo()
		if err := d.Memset(p, n, 0); err != nil {
			return "", err
		}
		if err := d.Sync(0); err != nil {
			return "", err
		}
		if err := d.Free(p); err != nil {
			return "", err
		}
		if free0-free1 < n {
			return "", fmt.Errorf("free memory fell by %d bytes for a %d-byte allocation", free0-free1, n)
		}
		return fmt.Sprintf("free memory fell by %.0f MiB while allocated", float64(free0-free1)/(1<<20)), nil
	})
	t.check("managed alloc + prefetch 4 MiB", func() (string, error) {
		const n = 4 << 20
		p, err := d.AllocManaged(n)
		if err != nil {
			return "", err
		}
		defer d.Free(p)
		host := hostBytes(p, n)
		for i := range host {
			host[i] = byte(i*7 + 3)
		}
		s, err := d.NewStream()
		if err != nil {
			return "", err
		}
		defer d.DestroyStream(s)
		if err := d.Prefetch(p, n, s); err != nil {
			return "", err
		}
		if err := d.Sync(s); err != nil {
			return "", err
		}
		got, err := download[byte](d, p, n)
		if err != nil {
			return "", err
		}
		for i, b := range got {
			if b != byte(i*7+3) {
				return "", fmt.Errorf("byte %d read back %d, wrote %d", i, b, byte(i*7+3))
			}
		}
		how := "prefetched (concurrent managed access)"
		if !d.ConcurrentManaged() {
			how = "no concurrent managed access: prefetch skipped"
		}
		return how + ", host writes read back on the device", nil
	})
	t.check("HtoD/DtoD/DtoH 1 MiB round trip", func() (string, error) {
		const n = 1 << 20
		src := make([]byte, n)
		r := rand.New(rand.NewPCG(1, 2))
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		start := time.Now()
		a, err := upload(d, src)
		if err != nil {
			return "", err
		}
		defer d.Free(a)
		up := time.Since(start)
		b, err := d.Alloc(n)
		if err != nil {
			return "", err
		}
		defer d.Free(b)
		if err := d.CopyDtoD(b, a, n, 0); err != nil {
			return "", err
		}
		start = time.Now()
		got, err := download[byte](d, b, n)
		if err != nil {
			return "", err
		}
		downT := time.Since(start)
		if !bytes.Equal(got, src) {
			return "", fmt.Errorf("the bytes read back differ from those written")
		}
		if err := d.Memset(b, n, 0); err != nil {
			return "", err
		}
		zero, err := download[byte](d, b, n)
		if err != nil {
			return "", err
		}
		if slices.ContainsFunc(zero, func(c byte) bool { return c != 0 }) {
			return "", fmt.Errorf("Memset left nonzero bytes")
		}
		return fmt.Sprintf("equal; memset zeroes; up %.2f GB/s, down %.2f GB/s (pageable, 1 MiB)",
			n/up.Seconds()/1e9, n/downT.Seconds()/1e9), nil
	})
}

// compile loads NVRTC and compiles the self-test kernel through a Cache
// in a fresh folder (a miss), then again (a hit); it returns the kernel,
// or 0 when a step failed.
func (t *selfTest) compile(d *cuda.Device) cuda.Function {
	var c *cuda.Compiler
	if !t.check("NVRTC load", func() (string, error) {
		var err error
		if c, err = cuda.LoadNVRTC(); err != nil {
			return "", err
		}
		major, minor := c.Version()
		return fmt.Sprintf("NVRTC %d.%d, %s", major, minor, c.Path()), nil
	}) {
		t.skip("NVRTC compile (cache miss)", "no NVRTC")
		t.skip("NVRTC compile (cache hit)", "no NVRTC")
		return 0
	}
	dir, err := os.MkdirTemp("", "gptui-selftest-cache-")
	if err != nil {
		t.check("NVRTC compile (cache miss)", func() (string, error) { return "", err })
		return 0
	}
	defer os.RemoveAll(dir)
	cache := c.NewCache(dir)
	opts := []string{cuda.ArchFlag(d.Arch()), "-default-device"}
	var image []byte
	if !t.check("NVRTC compile (cache miss)", func() (string, error) {
		start := time.Now()
		img, hit, err := cache.Get(selfTestSource, "selftest.cu", opts)
		if err != nil {
			return "", err
		}
		if hit {
			return "", errors.New("a fresh cache reported a hit")
		}
		if !bytes.HasPrefix(img, []byte("\x7fELF")) {
			return "", fmt.Errorf("the image is not a CUBIN (%q…)", img[:min(len(img), 16)])
		}
		image = img
		return fmt.Sprintf("%d-byte CUBIN for %s in %v", len(img), opts[0], time.Since(start).Round(time.Millisecond)), nil
	}) {
		t.skip("NVRTC compile (cache hit)", "compile failed")
		return 0
	}
	t.check("NVRTC compile (cache hit)", func() (string, error) {
		start := time.Now()
		img, hit, err := cache.Get(selfTestSource, "selftest.cu", opts)
		if err != nil {
			return "", err
		}
		if !hit || !bytes.Equal(img, image) {
			return "", fmt.Errorf("hit=%v, same image=%v", hit, bytes.Equal(img, image))
		}
		return fmt.Sprintf("in %v", time.Since(start).Round(time.Microsecond)), nil
	})
	var f cuda.Function
	t.check("module load", func() (string, error) {
		m, err := d.Load(image)
		if err != nil {
			return "", err
		}
		if f, err = m.Function("selftest_axpi"); err != nil {
			return "", err
		}
		if _, err := m.Function("no_such_kernel"); err == nil {
			return "", errors.New("a missing kernel was found")
		}
		if err := d.SetMaxShared(f, 64<<10); err != nil {
			return "", err
		}
		return "selftest_axpi found, 64 KiB dynamic shared memory allowed", nil
	})
	return f
}

// launch runs the self-test kernel and times launches with events.
func (t *selfTest) launch(d *cuda.Device, f cuda.Function) {
	if f == 0 {
		t.skip("kernel launch (Ptr, int32, float32, uint64)", "no kernel")
		t.skip("event timing", "no kernel")
		return
	}
	const n = 1<<20 + 3 // not a multiple of the block
	const tag = uint64(0xfeedface_12345678)
	var out, a, tagOut cuda.Ptr
	t.check("kernel launch (Ptr, int32, float32, uint64)", func() (string, error) {
		in := make([]float32, n)
		for i := range in {
			in[i] = float32(i%1000) * 0.5
		}
		var err error
		if a, err = upload(d, in); err != nil {
			return "", err
		}
		if out, err = d.Alloc(n * 4); err != nil {
			return "", err
		}
		if tagOut, err = d.Alloc(8); err != nil {
			return "", err
		}
		block := uint32(256)
		grid := cuda.Dim3{X: (n + block - 1) / block, Y: 1, Z: 1}
		if err := d.Launch(f, grid, cuda.Dim3{X: block, Y: 1, Z: 1}, 0, 0, out, a, int32(n), float32(3), tag, tagOut); err != nil {
			return "", err
		}
		if err := d.Sync(0); err != nil {
			return "", err
		}
		got, err := download[float32](d, out, n)
		if err != nil {
			return "", err
		}
		for i, v := range got {
			if want := in[i]*3 + float32(i); v != want {
				return "", fmt.Errorf("out[%d] = %g, want %g", i, v, want)
			}
		}
		gotTag, err := download[uint64](d, tagOut, 1)
		if err != nil {
			return "", err
		}
		if gotTag[0] != tag {
			return "", fmt.Errorf("the uint64 argument arrived as %#x, sent %#x", gotTag[0], tag)
		}
		if err := d.Launch(f, grid, cuda.Dim3{X: block, Y: 1, Z: 1}, 0, 0, out, a, n, float32(3)); err == nil {
			return "", errors.New("a Go int argument was accepted")
		}
		return fmt.Sprintf("%d elements right, uint64 tag right", n), nil
	})
	t.check("event timing", func() (string, error) {
		if out == 0 {
			return "", errors.New("no buffers")
		}
		start, err := d.NewEvent()
		if err != nil {
			return "", err
		}
		defer d.DestroyEvent(start)
		end, err := d.NewEvent()
		if err != nil {
			return "", err
		}
		defer d.DestroyEvent(end)
		const launches = 100
		block := uint32(256)
		grid := cuda.Dim3{X: (n + block - 1) / block, Y: 1, Z: 1}
		wall := time.Now()
		if err := d.Record(start, 0); err != nil {
			return "", err
		}
		for range launches {
			if err := d.Launch(f, grid, cuda.Dim3{X: block, Y: 1, Z: 1}, 0, 0, out, a, int32(n), float32(3), tag, tagOut); err != nil {
				return "", err
			}
		}
		if err := d.Record(end, 0); err != nil {
			return "", err
		}
		el, err := d.Elapsed(start, end)
		if err != nil {
			return "", err
		}
		w := time.Since(wall)
		if el <= 0 || el > w+time.Millisecond {
			return "", fmt.Errorf("events measured %v for work that took %v of wall time", el, w)
		}
		gbs := float64(launches) * n * 8 / el.Seconds() / 1e9
		return fmt.Sprintf("%d launches in %v on the device (%.1f µs each, %.0f GB/s), %v wall", launches, el.Round(time.Microsecond),
			float64(el.Microseconds())/launches, gbs, w.Round(time.Microsecond)), nil
	})
	d.Free(out)
	d.Free(a)
	d.Free(tagOut)
}

// refGemm is the host reference of Gemm: C = alpha·op(A)·op(B) + beta·C in
// column-major storage, in float64.
func refGemm(transA, transB bool, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int) {
	at := func(i, p int) float64 { // op(A)[i][p]
		if transA {
			return a[p+i*lda]
		}
		return a[i+p*lda]
	}
	bt := func(p, j int) float64 { // op(B)[p][j]
		if transB {
			return b[j+p*ldb]
		}
		return b[p+j*ldb]
	}
	for j := range n {
		for i := range m {
			var s float64
			for p := range k {
				s += at(i, p) * bt(p, j)
			}
			c[i+j*ldc] = alpha*s + beta*c[i+j*ldc]
		}
	}
}

// relErr is max|got−want| / max|want|.
func relErr(got, want []float64) float64 {
	var num, den float64
	for i := range want {
		num = max(num, math.Abs(got[i]-want[i]))
		den = max(den, math.Abs(want[i]))
	}
	if den == 0 {
		return num
	}
	return num / den
}

// geluTanh is GELU in its tanh form, as cuBLASLt's epilogue computes it.
func geluTanh(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

// dgeluTanh is geluTanh's derivative, what cuBLASLt's DGELU epilogue
// multiplies the product by.
func dgeluTanh(x float64) float64 {
	k := math.Sqrt(2 / math.Pi)
	th := math.Tanh(k * (x + 0.044715*x*x*x))
	return 0.5*(1+th) + 0.5*x*(1-th*th)*k*(1+3*0.044715*x*x)
}

// operand is a GEMM input on the host and the device.
type operand struct {
	vals []float64 // the values as the device sees them (after rounding)
	p    cuda.Ptr
}

// randOperand makes n random values in [-1, 1) of type t on the device.
func randOperand(d *cuda.Device, r *rand.Rand, n int, t cuda.DataType) (operand, error) {
	o := operand{vals: make([]float64, n)}
	var err error
	switch t {
	case cuda.F32:
		v := make([]float32, n)
		for i := range v {
			v[i] = r.Float32()*2 - 1
			o.vals[i] = float64(v[i])
		}
		o.p, err = upload(d, v)
	case cuda.BF16, cuda.F16:
		v := make([]uint16, n)
		for i := range v {
			x := r.Float32()*2 - 1
			if t == cuda.BF16 {
				v[i] = half.F32ToBF16(x)
				o.vals[i] = float64(half.BF16ToF32(v[i]))
			} else {
				v[i] = half.F32ToF16(x)
				o.vals[i] = float64(half.F16ToF32(v[i]))
			}
		}
		o.p, err = upload(d, v)
	default:
		err = fmt.Errorf("no %s operands", t)
	}
	return o, err
}

// fetch reads n values of type t from the device as float64.
func fetch(d *cuda.Device, p cuda.Ptr, n int, t cuda.DataType) ([]float64, error) {
	out := make([]float64, n)
	switch t {
	case cuda.F32:
		v, err := download[float32](d, p, n)
		if err != nil {
			return nil, err
		}
		for i, x := range v {
			out[i] = float64(x)
		}
	case cuda.BF16, cuda.F16:
		v, err := download[uint16](d, p, n)
		if err != nil {
			return nil, err
		}
		for i, x := range v {
			if t == cuda.BF16 {
				out[i] = float64(half.BF16ToF32(x))
			} else {
				out[i] = float64(half.F16ToF32(x))
			}
		}
	default:
		return nil, fmt.Errorf("cannot fetch %s", t)
	}
	return out, nil
}

// gemmCase is one GEMM checked against refGemm.
type gemmCase struct {
	name           string
	transA, transB bool
	m, n, k        int
	in, out        cuda.DataType
	exact          bool
	tol            float64
	lt             bool          // through Matmul (cuBLASLt) instead of Gemm
	ep             cuda.Epilogue // for lt
	batch          int           // > 1: GemmStridedBatched
}

func (t *selfTest) blas(d *cuda.Device) {
	var b *cuda.BLAS
	if !t.check("cuBLAS + cuBLASLt handles", func() (string, error) {
		s, err := d.NewStream()
		if err != nil {
			return "", err
		}
		if b, err = d.NewBLAS(s); err != nil {
			return "", err
		}
		v, err := b.Version()
		if err != nil {
			return "", err
		}
		cb, lt := b.Paths()
		return fmt.Sprintf("cuBLAS %d, %s, %s, %d MiB workspace", v, cb, lt, cuda.WorkspaceBytes>>20), nil
	}) {
		t.skip("cuBLAS GEMMs", "no cuBLAS")
		return
	}
	defer func() {
		b.Close()
		d.DestroyStream(b.Stream())
	}()
	r := rand.New(rand.NewPCG(7, 8))
	for _, gc := range []gemmCase{
		{name: "Gemm f32 exact 256×128×64", transB: true, m: 256, n: 128, k: 64, in: cuda.F32, out: cuda.F32, exact: true, tol: 1e-5},
		{name: "Gemm f32 exact 256×128×64 (Aᵀ)", transA: true, m: 256, n: 128, k: 64, in: cuda.F32, out: cuda.F32, exact: true, tol: 1e-5},
		{name: "Gemm bf16→f32 256×128×64", transB: true, m: 256, n: 128, k: 64, in: cuda.BF16, out: cuda.F32, tol: 1e-2},
		{name: "Gemm f16→f32 256×128×64", transB: true, m: 256, n: 128, k: 64, in: cuda.F16, out: cuda.F32, tol: 1e-2},
		{name: "Gemm bf16→bf16 256×128×64", m: 256, n: 128, k: 64, in: cuda.BF16, out: cuda.BF16, tol: 1e-2},
		{name: "GemmStridedBatched f32 4×64×64×32", transA: true, m: 64, n: 64, k: 32, in: cuda.F32, out: cuda.F32, exact: true, tol: 1e-5, batch: 4},
		{name: "GemmStridedBatched bf16→f32 4×64×64×32", m: 64, n: 64, k: 32, in: cuda.BF16, out: cuda.F32, tol: 1e-2, batch: 4},
		{name: "Matmul f32 +bias 256×128×64", transA: true, m: 256, n: 128, k: 64, in: cuda.F32, out: cuda.F32, tol: 1e-5, lt: true, ep: cuda.EpilogueBias},
		{name: "Matmul f32 gelu(+bias) 256×128×64", transA: true, m: 256, n: 128, k: 64, in: cuda.F32, out: cuda.F32, tol: 1e-3, lt: true, ep: cuda.EpilogueGeluBias},
		{name: "Matmul f32 gelu 256×128×64", transA: true, m: 256, n: 128, k: 64, in: cuda.F32, out: cuda.F32, tol: 1e-3, lt: true, ep: cuda.EpilogueGelu},
		{name: "Matmul bf16 gelu(+bias) 256×128×64", transA: true, m: 256, n: 128, k: 64, in: cuda.BF16, out: cuda.BF16, tol: 1e-2, lt: true, ep: cuda.EpilogueGeluBias},
		// GPT-2's fc and fcproj's input gradient under bf16 (MatmulGeluForward, MatmulBackwardGelu).
		{name: "Matmul bf16 gelu_aux(+bias) 256×128×64", transA: true, m: 256, n: 128, k: 64, in: cuda.BF16, out: cuda.BF16, tol: 1e-2, lt: true, ep: cuda.EpilogueGeluAuxBias},
		{name: "Matmul bf16 dgelu 256×128×64", m: 256, n: 128, k: 64, in: cuda.BF16, out: cuda.BF16, tol: 1e-2, lt: true, ep: cuda.EpilogueDGelu},
		{name: "Matmul f32 bias-grad (BGRADB) 256×128×64", transB: true, m: 256, n: 128, k: 64, in: cuda.F32, out: cuda.F32, tol: 1e-5, lt: true, ep: cuda.EpilogueBiasGrad},
		{name: "Matmul bf16→f32 bias-grad 256×128×64", transB: true, m: 256, n: 128, k: 64, in: cuda.BF16, out: cuda.F32, tol: 1e-2, lt: true, ep: cuda.EpilogueBiasGrad},
	} {
		t.check(gc.name, func() (string, error) { return runGemmCase(d, b, r, gc) })
	}
	for _, gt := range []cuda.DataType{cuda.BF16, cuda.F32} {
		n := 8192
		if gt == cuda.F32 {
			n = 4096
		}
		t.check(fmt.Sprintf("measured %s GEMM rate (n=%d)", gt, n), func() (string, error) {
			flops, err := cuda.MeasureGemm(t.ctx, d, b, gt, n)
			if err != nil {
				return "", err
			}
			what := ""
			if gt == cuda.F32 {
				what = " (TF32 allowed)"
			}
			return fmt.Sprintf("%.1f TFLOP/s%s, median of 10", flops/1e12, what), nil
		})
	}
}

// runGemmCase runs one GEMM on the device and compares it with refGemm.
func runGemmCase(d *cuda.Device, b *cuda.BLAS, r *rand.Rand, gc gemmCase) (string, error) {
	batch := max(gc.batch, 1)
	rowsA, colsA := gc.m, gc.k
	if gc.transA {
		rowsA, colsA = gc.k, gc.m
	}
	rowsB, colsB := gc.k, gc.n
	if gc.transB {
		rowsB, colsB = gc.n, gc.k
	}
	lda, ldb, ldc := rowsA, rowsB, gc.m
	sa, sb, sc := rowsA*colsA, rowsB*colsB, gc.m*gc.n
	A, err := randOperand(d, r, sa*batch, gc.in)
	if err != nil {
		return "", err
	}
	defer d.Free(A.p)
	B, err := randOperand(d, r, sb*batch, gc.in)
	if err != nil {
		return "", err
	}
	defer d.Free(B.p)
	C, err := randOperand(d, r, sc*batch, gc.out)
	if err != nil {
		return "", err
	}
	defer d.Free(C.p)
	alpha, beta := float32(1.25), float32(0.5)
	switch gc.ep {
	case cuda.EpilogueNone:
	case cuda.EpilogueBiasGrad:
		alpha, beta = 1, 0 // as a weight gradient's first micro-batch
	default:
		beta = 0 // the epilogue's reference is simpler without C
	}
	want := slices.Clone(C.vals)
	for i := range batch {
		refGemm(gc.transA, gc.transB, gc.m, gc.n, gc.k, float64(alpha), A.vals[i*sa:], lda, B.vals[i*sb:], ldb, float64(beta), want[i*sc:], ldc)
	}
	var bias, aux operand
	var wantBias, wantAux []float64
	if gc.ep == cuda.EpilogueGeluAuxBias || gc.ep == cuda.EpilogueDGelu {
		// The auxiliary matrix has D's layout: GELU's input, written by
		// GELU_AUX_BIAS, read by DGELU.
		if aux, err = randOperand(d, r, sc, gc.out); err != nil {
			return "", err
		}
		defer d.Free(aux.p)
	}
	switch gc.ep {
	case cuda.EpilogueBias, cuda.EpilogueGeluBias, cuda.EpilogueGeluAuxBias:
		if bias, err = randOperand(d, r, gc.m, gc.out); err != nil {
			return "", err
		}
		defer d.Free(bias.p)
		for j := range gc.n {
			for i := range gc.m {
				want[i+j*ldc] += bias.vals[i]
			}
		}
	case cuda.EpilogueBiasGrad:
		if bias.p, err = d.Alloc(gc.n * gc.out.Size()); err != nil {
			return "", err
		}
		defer d.Free(bias.p)
		// The sums over k of op(B), one per column of D.
		wantBias = make([]float64, gc.n)
		for j := range gc.n {
			for p := range gc.k {
				if gc.transB {
					wantBias[j] += B.vals[j+p*ldb]
				} else {
					wantBias[j] += B.vals[p+j*ldb]
				}
			}
		}
	}
	if gc.ep == cuda.EpilogueGeluAuxBias {
		wantAux = slices.Clone(want)
	}
	if gc.ep == cuda.EpilogueDGelu {
		for i := range want {
			want[i] *= dgeluTanh(aux.vals[i])
		}
	}
	var wantErf []float64 // GELU's erf form, to tell which one cuBLASLt computes
	if gc.ep == cuda.EpilogueGelu || gc.ep == cuda.EpilogueGeluBias || gc.ep == cuda.EpilogueGeluAuxBias {
		wantErf = make([]float64, len(want))
		for i, x := range want {
			want[i] = geluTanh(x)
			wantErf[i] = 0.5 * x * (1 + math.Erf(x/math.Sqrt2))
		}
	}
	switch {
	case gc.lt:
		err = b.Matmul(gc.transA, gc.transB, gc.m, gc.n, gc.k, alpha, A.p, gc.in, lda, B.p, gc.in, ldb, beta, C.p, gc.out, ldc, gc.ep, bias.p, aux.p)
	case batch > 1:
		err = b.GemmStridedBatched(gc.transA, gc.transB, gc.m, gc.n, gc.k, alpha, A.p, gc.in, lda, int64(sa), B.p, gc.in, ldb, int64(sb), beta, C.p, gc.out, ldc, int64(sc), batch, gc.exact)
	default:
		err = b.Gemm(gc.transA, gc.transB, gc.m, gc.n, gc.k, alpha, A.p, gc.in, lda, B.p, gc.in, ldb, beta, C.p, gc.out, ldc, gc.exact)
	}
	if err != nil {
		return "", err
	}
	if err := d.Sync(b.Stream()); err != nil {
		return "", err
	}
	got, err := fetch(d, C.p, sc*batch, gc.out)
	if err != nil {
		return "", err
	}
	e := relErr(got, want)
	detail := fmt.Sprintf("max rel err %.2e (tolerance %.0e)", e, gc.tol)
	if wantErf != nil {
		detail += fmt.Sprintf(" against tanh GELU, %.2e against erf GELU", relErr(got, wantErf))
	}
	if e > gc.tol {
		return "", fmt.Errorf("%s", detail)
	}
	// The epilogue's other outputs.
	for _, x := range []struct {
		what string
		p    cuda.Ptr
		n    int
		want []float64
	}{
		{"the auxiliary matrix (GELU's input)", aux.p, sc, wantAux},
		{"the bias gradient (sums over k of op(B))", bias.p, gc.n, wantBias},
	} {
		if x.want == nil {
			continue
		}
		got, err := fetch(d, x.p, x.n, gc.out)
		if err != nil {
			return "", err
		}
		e := relErr(got, x.want)
		detail += fmt.Sprintf(", %s %.2e", x.what, e)
		if e > gc.tol {
			return "", fmt.Errorf("%s max rel err %.2e (tolerance %.0e)", x.what, e, gc.tol)
		}
	}
	return detail, nil
}

// nccl checks NCCL on one rank: the collectives copy their input.
func (t *selfTest) nccl(d *cuda.Device) {
	var n *cuda.NCCL
	if !t.check("NCCL load", func() (string, error) {
		var err error
		if n, err = cuda.LoadNCCL(); err != nil {
			return "", err
		}
		v := n.Version()
		return fmt.Sprintf("NCCL %d.%d.%d, %s", v/10000, v/100%100, v%100, n.Path()), nil
	}) {
		t.skip("NCCL one rank", "no NCCL")
		return
	}
	var c *cuda.Comm
	if !t.check("NCCL UniqueID + InitRank(1 rank)", func() (string, error) {
		id, err := n.UniqueID()
		if err != nil {
			return "", err
		}
		if id == (cuda.UniqueID{}) {
			return "", errors.New("the unique id is all zeros")
		}
		if c, err = n.InitRank(d, 1, id, 0); err != nil {
			return "", err
		}
		if err := c.AsyncError(); err != nil {
			return "", err
		}
		return fmt.Sprintf("rank %d of %d", c.Rank(), c.Size()), nil
	}) {
		t.skip("NCCL collectives", "no communicator")
		return
	}
	defer c.Destroy()
	const count = 1000
	in := make([]float32, count)
	for i := range in {
		in[i] = float32(i) - 0.5
	}
	same := func(p cuda.Ptr) error {
		if err := d.Sync(0); err != nil {
			return err
		}
		got, err := download[float32](d, p, count)
		if err != nil {
			return err
		}
		for i := range got {
			if got[i] != in[i] {
				return fmt.Errorf("element %d is %g, want %g", i, got[i], in[i])
			}
		}
		return nil
	}
	send, err := upload(d, in)
	if err != nil {
		t.check("NCCL collectives", func() (string, error) { return "", err })
		return
	}
	defer d.Free(send)
	recv, err := d.Alloc(count * 4)
	if err != nil {
		t.check("NCCL collectives", func() (string, error) { return "", err })
		return
	}
	defer d.Free(recv)
	for _, op := range []struct {
		name string
		run  func(c *cuda.Comm) error
	}{
		{"AllReduce sum", func(c *cuda.Comm) error { return c.AllReduce(send, recv, count, cuda.F32, cuda.Sum, 0) }},
		{"AllReduce max", func(c *cuda.Comm) error { return c.AllReduce(send, recv, count, cuda.F32, cuda.Max, 0) }},
		{"AllGather", func(c *cuda.Comm) error { return c.AllGather(send, recv, count, cuda.F32, 0) }},
		{"ReduceScatter", func(c *cuda.Comm) error { return c.ReduceScatter(send, recv, count, cuda.F32, cuda.Sum, 0) }},
		{"Broadcast", func(c *cuda.Comm) error { return c.Broadcast(send, recv, count, cuda.F32, 0, 0) }},
		{"Send/Recv to self in a group", func(c *cuda.Comm) error {
			if err := n.GroupStart(); err != nil {
				return err
			}
			errS := c.Send(send, count, cuda.F32, 0, 0)
			errR := c.Recv(recv, count, cuda.F32, 0, 0)
			return errors.Join(errS, errR, n.GroupEnd())
		}},
	} {
		t.check("NCCL "+op.name, func() (string, error) {
			if err := d.Memset(recv, count*4, 0); err != nil {
				return "", err
			}
			if err := op.run(c); err != nil {
				return "", err
			}
			if err := same(recv); err != nil {
				return "", err
			}
			return fmt.Sprintf("%d f32 right", count), c.AsyncError()
		})
	}
	t.check("NCCL Split + Destroy", func() (string, error) {
		sub, err := c.Split(0, 0)
		if err != nil {
			return "", err
		}
		if sub == nil {
			return "", errors.New("Split with color 0 gave no communicator")
		}
		if sub.Rank() != 0 || sub.Size() != 1 {
			return "", fmt.Errorf("the split communicator is rank %d of %d, want 0 of 1", sub.Rank(), sub.Size())
		}
		if err := d.Memset(recv, count*4, 0); err != nil {
			return "", err
		}
		if err := sub.AllReduce(send, recv, count, cuda.F32, cuda.Sum, 0); err != nil {
			return "", err
		}
		if err := same(recv); err != nil {
			return "", err
		}
		if err := sub.Destroy(); err != nil {
			return "", err
		}
		none, err := c.Split(cuda.SplitNoColor, 0)
		if err != nil {
			return "", err
		}
		if none != nil {
			none.Destroy()
			return "", errors.New("Split with no color gave a communicator")
		}
		return "rank 0 of 1, all-reduce right, destroyed; no color gives none", nil
	})
}
