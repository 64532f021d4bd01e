package emu

import (
	"context"
	"math"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/gptui/gptui/kernels/cuda"
	"github.com/gptui/gptui/kernels/cuda/emu/filecache"
)

// testSource exercises what the emulator provides: shared memory, warp
// shuffles, __syncthreads, atomics, early exits and every argument type.
const testSource = `
extern "C" __global__ void block_sum(const float* x, long long n, float* out) {
	__shared__ float part[32];
	int t = threadIdx.x;
	float s = 0;
	for (long long i = (long long)blockIdx.x * blockDim.x + t; i < n; i += (long long)gridDim.x * blockDim.x) s += x[i];
	for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
	if ((t & 31) == 0) part[t >> 5] = s;
	__syncthreads();
	if (t < 32) {
		float v = t < (int)(blockDim.x / 32) ? part[t] : 0.0f;
		for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
		if (t == 0) atomicAdd(out, v);
	}
}

// reverse reverses each block's slice through dynamic shared memory.
extern "C" __global__ void reverse(float* x, int n) {
	extern __shared__ float s[];
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	s[threadIdx.x] = i < n ? x[i] : 0.0f;
	__syncthreads();
	int j = blockIdx.x * blockDim.x + (blockDim.x - 1 - threadIdx.x);
	if (j < n) x[j] = s[threadIdx.x];
}

// early counts the threads that survive an early return past a barrier.
extern "C" __global__ void early(int* count) {
	if (threadIdx.x % 3 == 0) return;
	__syncthreads();
	atomicAdd(count, 1);
}

// broadcast gives every lane lane 5's value and its y/z indices.
extern "C" __global__ void broadcast(int* out) {
	int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
	int v = __shfl_sync(0xffffffffu, t * 10, 5);
	out[t] = v + 1000 * (int)threadIdx.y + 100000 * (int)threadIdx.z;
}

// unsynced reads its neighbours' writes to dynamic shared memory without
// the __syncthreads it needs.
extern "C" __global__ void unsynced(float* out) {
	extern __shared__ float u[];
	int t = threadIdx.x;
	u[t] = (float)t;
	out[t] = u[(t + 1) % blockDim.x] + u[(t + blockDim.x - 1) % blockDim.x];
}

// stuck has thread 0 wait at __syncthreads and the rest of its warp at the
// warp's barrier: none can pass.
extern "C" __global__ void stuck(int* x) {
	if (threadIdx.x == 0) __syncthreads();
	else __syncwarp();
	x[threadIdx.x] = 1;
}

extern "C" __global__ void types(int a, unsigned int b, long long c, unsigned long long d, float e, double f, double* out) {
	out[0] = a; out[1] = b; out[2] = (double)c; out[3] = (double)d; out[4] = e; out[5] = f;
}
`

var testNames = []string{"block_sum", "reverse", "early", "broadcast", "unsynced", "stuck", "types"}

func TestNames(t *testing.T) {
	p := build(t)
	if got := strings.Join(p.Names(), " "); got != strings.Join(testNames, " ") {
		t.Errorf("kernels found: %s, want %s", got, strings.Join(testNames, " "))
	}
}

func d3(x, y, z uint32) cuda.Dim3 { return cuda.Dim3{X: x, Y: y, Z: z} }

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	buildDir  string
	built     *Program
	buildErr  error
)

// build compiles testSource once for the package's tests.
func build(t *testing.T) *Program {
	t.Helper()
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("g++ is not installed (.ci/run installs it)")
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "emu-test-")
		if buildErr != nil {
			return
		}
		built, buildErr = Build(context.Background(), buildDir, testSource, Options{CacheDir: DefaultCacheDir()})
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

func TestEmulator(t *testing.T) {
	p := build(t)
	ctx := context.Background()
	m := p.NewMachine()
	fn := func(name string) cuda.Function {
		f, err := m.Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	launch := func(name string, grid, block cuda.Dim3, shared int, args ...any) {
		t.Helper()
		if err := m.Launch(fn(name), grid, block, shared, 0, args...); err != nil {
			t.Fatal(err)
		}
	}

	const n = 1000
	x := make([]float32, n)
	var want float32
	for i := range x {
		x[i] = float32(i%7) - 2.5
		want += x[i]
	}
	xp, sum := m.Float32s(x), m.Alloc(4)
	launch("block_sum", d3(3, 1, 1), d3(96, 1, 1), 0, xp, int64(n), sum)

	r := make([]float32, 100)
	for i := range r {
		r[i] = float32(i)
	}
	rp := m.Float32s(r)
	launch("reverse", d3(2, 1, 1), d3(64, 1, 1), 64*4, rp, int32(len(r)))

	count := m.Alloc(4)
	launch("early", d3(4, 1, 1), d3(70, 1, 1), 0, count)

	bc := m.Alloc(4 * 64)
	launch("broadcast", d3(1, 1, 1), d3(8, 4, 2), 0, bc)

	out := m.Alloc(8 * 6)
	launch("types", d3(1, 1, 1), d3(1, 1, 1), 0, int32(-7), uint32(4000000000), int64(-1<<40), uint64(1<<63), float32(1.5), 2.25, out)

	if err := m.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if got := m.ReadFloat32s(sum, 1)[0]; math.Abs(float64(got-want)) > 1e-3 {
		t.Errorf("block_sum = %v, want %v", got, want)
	}
	got := m.ReadFloat32s(rp, len(r))
	for i, v := range got {
		// Block 0 reverses 0…63; block 1 holds 64…99 and reads zeros past n.
		w := float32(63 - i)
		if i >= 64 {
			w = float32(64 + 127 - i)
			if 64+127-i >= 100 {
				w = 0
			}
		}
		if v != w {
			t.Errorf("reverse[%d] = %v, want %v", i, v, w)
			break
		}
	}
	if got, want := m.ReadInt32s(count, 1)[0], int32(4*(70-24)); got != want {
		t.Errorf("early: %d threads past the barrier, want %d", got, want)
	}
	for i, v := range m.ReadInt32s(bc, 64) {
		// Lane 5 of each warp: warp 0 holds threads 0…31, warp 1 32…63.
		y, z := (i/8)%4, i/32
		w := int32((i/32*32+5)*10 + 1000*y + 100000*z)
		if v != w {
			t.Errorf("broadcast[%d] = %d, want %d", i, v, w)
			break
		}
	}
	wantTypes := []float64{-7, 4000000000, -1 << 40, 1 << 63, 1.5, 2.25}
	for i, v := range m.ReadFloat64s(out, 6) {
		if v != wantTypes[i] {
			t.Errorf("types[%d] = %v, want %v", i, v, wantTypes[i])
		}
	}
}

// TestMissingBarrier: a thread reading its neighbours' shared writes with
// no __syncthreads between sees one of them before it is written (NaN),
// whichever way the threads are ordered, so the missing barrier shows.
func TestMissingBarrier(t *testing.T) {
	p := build(t)
	m := p.NewMachine()
	f, _ := m.Lookup("unsynced")
	out := m.Alloc(4 * 64)
	if err := m.Launch(f, d3(1, 1, 1), d3(64, 1, 1), 4*64, 0, out); err != nil {
		t.Fatal(err)
	}
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	nan := 0
	for _, v := range m.ReadFloat32s(out, 64) {
		if v != v {
			nan++
		}
	}
	if nan == 0 {
		t.Error("every thread read both neighbours' writes: the missing __syncthreads went unseen")
	}
}

// TestStuckBarrier: threads that wait at barriers none can pass end the
// run with a message, not a hang.
func TestStuckBarrier(t *testing.T) {
	p := build(t)
	m := p.NewMachine()
	f, _ := m.Lookup("stuck")
	x := m.Alloc(4 * 64)
	if err := m.Launch(f, d3(1, 1, 1), d3(64, 1, 1), 0, 0, x); err != nil {
		t.Fatal(err)
	}
	err := m.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "1 of 64 threads wait at __syncthreads and 31 at a warp's barrier") {
		t.Fatalf("stuck: %v, want the threads at their barriers named", err)
	}
}

// TestArgumentCheck shows a launch whose argument types do not match the
// kernel's parameters failing with the launch named.
func TestArgumentCheck(t *testing.T) {
	p := build(t)
	m := p.NewMachine()
	f, _ := m.Lookup("block_sum")
	x, out := m.Alloc(16), m.Alloc(4)
	if err := m.Launch(f, d3(1, 1, 1), d3(32, 1, 1), 0, 0, x, int32(4), out); err != nil {
		t.Fatal(err)
	}
	err := m.Run(context.Background())
	if err == nil {
		t.Fatal("int32 passed for long long: Run succeeded")
	}
	t.Log(err)
	for _, bad := range []struct {
		grid, block cuda.Dim3
		shared      int
	}{
		{d3(1, 1, 1), d3(1025, 1, 1), 0},
		{d3(0, 1, 1), d3(32, 1, 1), 0},
		{d3(1, 1, 1), d3(32, 1, 1), 49 << 10},
	} {
		if err := m.Launch(f, bad.grid, bad.block, bad.shared, 0, x, int64(4), out); err == nil {
			t.Errorf("launch %v×%v with %d shared bytes accepted", bad.grid, bad.block, bad.shared)
		}
	}
	if _, err := m.Lookup("nope"); err == nil {
		t.Error("Lookup of a missing kernel succeeded")
	}
}

// TestBuildCache: a second Build with the same inputs takes the program
// from the cache (no compile: its binary is the cache's), which runs; any
// other input is another key.
func TestBuildCache(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a build of its own, into an empty cache")
	}
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("g++ is not installed (.ci/run installs it)")
	}
	const src = `extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }`
	cache := t.TempDir()
	ctx := context.Background()
	first, err := Build(ctx, t.TempDir(), src, Options{CacheDir: cache, Opt: "-O0"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := Build(ctx, t.TempDir(), src, Options{CacheDir: cache, Opt: "-O0"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(again.bin, cache) || strings.HasPrefix(first.bin, cache) || strings.Join(again.Names(), " ") != "twice" {
		t.Errorf("first build %s, second %s (kernels %v): want the second from the cache %s", first.bin, again.bin, again.Names(), cache)
	}
	m := again.NewMachine()
	f, _ := m.Lookup("twice")
	x := m.Float32s([]float32{1, 2, 3})
	if err := m.Launch(f, d3(1, 1, 1), d3(3, 1, 1), 0, 0, x); err != nil {
		t.Fatal(err)
	}
	if err := m.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if got := m.ReadFloat32s(x, 3); got[0] != 2 || got[1] != 4 || got[2] != 6 {
		t.Errorf("the cached program computed %v, want [2 4 6]", got)
	}
	// Any other input is another entry.
	key := filecache.Key("g++ 12", "-O0", header, driver, src)
	for i, other := range []string{
		filecache.Key("g++ 13", "-O0", header, driver, src),
		filecache.Key("g++ 12", "-O1", header, driver, src),
		filecache.Key("g++ 12", "-O0", header, driver, src+"\n"),
		filecache.Key("g++ 12", "-O0"+string(header), "", driver, src),
	} {
		if other == key {
			t.Errorf("change %d: the same key", i)
		}
	}
}

// TestSanitize shows a kernel writing one element past its buffer failing
// the run when built with Options.Sanitize.
func TestSanitize(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a build of its own with AddressSanitizer")
	}
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("g++ is not installed (.ci/run installs it)")
	}
	const src = `extern "C" __global__ void overrun(float* x, int n) { x[threadIdx.x] = 1.0f; }`
	p, err := Build(context.Background(), t.TempDir(), src, Options{Sanitize: true, CacheDir: DefaultCacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	m := p.NewMachine()
	f, _ := m.Lookup("overrun")
	x := m.Alloc(4 * 31)
	if err := m.Launch(f, d3(1, 1, 1), d3(32, 1, 1), 0, 0, x, int32(31)); err != nil {
		t.Fatal(err)
	}
	err = m.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "AddressSanitizer") {
		t.Fatalf("overrun: %v, want an AddressSanitizer report", err)
	}
}

// TestContraction shows the emulator rounding as NVRTC's code does: a·b + c
// written plainly is one FMA (one rounding), and through __fmul_rn and
// __fadd_rn two roundings, the CPU's bits. The inputs make the two differ:
// a·b = 1 + 2⁻¹¹ + 2⁻²⁴ needs more bits than a float has.
func TestContraction(t *testing.T) {
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("g++ is not installed (.ci/run installs it)")
	}
	if !Contracts() {
		t.Skip("this CPU has no FMA instructions: the emulator cannot round as the GPU does")
	}
	const src = `
extern "C" __global__ void fused(float* out, const float* in) {
	out[0] = in[0] * in[1] + in[2];
	out[1] = __fadd_rn(__fmul_rn(in[0], in[1]), in[2]);
}`
	p, err := Build(context.Background(), t.TempDir(), src, Options{CacheDir: DefaultCacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	m := p.NewMachine()
	f, _ := m.Lookup("fused")
	a := float32(1 + 1.0/(1<<12))    // 1 + 2⁻¹²
	b := a                           // a·b = 1 + 2⁻¹¹ + 2⁻²⁴, rounded: 1 + 2⁻¹¹
	c := float32(-(1 + 1.0/(1<<11))) // leaves 2⁻²⁴ when fused, 0 when rounded first
	out, in := m.Alloc(8), m.Float32s([]float32{a, b, c})
	if err := m.Launch(f, d3(1, 1, 1), d3(1, 1, 1), 0, 0, out, in); err != nil {
		t.Fatal(err)
	}
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := m.ReadFloat32s(out, 2)
	if fma := float32(math.FMA(float64(a), float64(b), float64(c))); got[0] != fma || fma == 0 {
		t.Errorf("a·b + c = %g, want %g: one rounding, as NVRTC's --fmad=true gives", got[0], fma)
	}
	if two := a*b + c; got[1] != two || two != 0 {
		t.Errorf("__fadd_rn(__fmul_rn(a, b), c) = %g, want %g: two roundings", got[1], two)
	}
}

// TestBuildLibrary: the library holds testSource's kernels under their
// names, runs one from an argument array as cuLaunchKernel gets it, and
// answers the hash of the source it was built from.
func TestBuildLibrary(t *testing.T) {
	if _, err := Compiler(); err != nil {
		t.Skip(err)
	}
	path, err := BuildLibrary(context.Background(), t.TempDir(), testSource, Options{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Fatal(err)
	}
	var (
		hash     func() uint64
		function func(string) int32
		pack     func(fn int32, params unsafe.Pointer) unsafe.Pointer
		launch   func(fn int32, gx, gy, gz, bx, by, bz uint32, shared uint64, packed unsafe.Pointer)
	)
	purego.RegisterLibFunc(&hash, h, "gptuiEmuSourceHash")
	purego.RegisterLibFunc(&function, h, "gptuiEmuFunction")
	purego.RegisterLibFunc(&pack, h, "gptuiEmuPack")
	purego.RegisterLibFunc(&launch, h, "gptuiEmuLaunch")
	if got, want := hash(), SourceHash(testSource); got != want {
		t.Errorf("gptuiEmuSourceHash = %#x, want %#x", got, want)
	}
	if fn := function("no_such_kernel"); fn != -1 {
		t.Errorf("gptuiEmuFunction(no_such_kernel) = %d, want -1", fn)
	}
	fn := function("reverse")
	if fn < 0 {
		t.Fatal("no kernel reverse")
	}
	// reverse(float* x, int n) over 2 blocks of 4: each block's slice reversed.
	x := []float32{0, 1, 2, 3, 4, 5, 6, 7}
	xp, n := unsafe.Pointer(&x[0]), int32(len(x))
	params := []unsafe.Pointer{unsafe.Pointer(&xp), unsafe.Pointer(&n)}
	packed := pack(fn, unsafe.Pointer(&params[0]))
	n = 0 // the arguments were copied at pack
	launch(fn, 2, 1, 1, 4, 1, 1, 16, packed)
	if want := []float32{3, 2, 1, 0, 7, 6, 5, 4}; !slices.Equal(x, want) {
		t.Errorf("reverse: %v, want %v", x, want)
	}
}
