package cuda_test

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sync"
	"testing"

	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/kernels/cuda"
	"github.com/gptui/gptui/kernels/cuda/emu"
)

// The kernel tests run the CUDA sources under the emulator (package emu)
// and compare each kernel with kernels/cpu on random inputs. The program
// is built once per test binary (a few seconds of g++); every test takes a
// Machine of its own.

var (
	emuOnce sync.Once
	emuProg *emu.Program
	emuDir  string
	emuErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if emuDir != "" {
		os.RemoveAll(emuDir)
	}
	os.Exit(code)
}

// emuProgram returns cuda.Source() compiled with the emulator, skipping the
// test where g++ is missing (.ci/run installs it, so CI never skips).
func emuProgram(t *testing.T) *emu.Program {
	t.Helper()
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("g++ is not installed (.ci/run installs it): the kernels cannot be emulated")
	}
	emuOnce.Do(func() {
		emuDir, emuErr = os.MkdirTemp("", "gptui-cuda-test-")
		if emuErr == nil {
			emuProg, emuErr = emu.Build(context.Background(), emuDir, cuda.Source(), emu.Options{Sanitize: os.Getenv("GPTUI_EMU_SANITIZE") != "", CacheDir: emu.DefaultCacheDir()})
		}
	})
	if emuErr != nil {
		t.Fatal(emuErr)
	}
	return emuProg
}

// machine returns a fresh Machine and Kernels launching on it.
func machine(t *testing.T) (*emu.Machine, *cuda.Kernels) {
	t.Helper()
	m := emuProgram(t).NewMachine()
	k, err := cuda.NewKernels(m, m.Lookup)
	if err != nil {
		t.Fatal(err)
	}
	return m, k
}

func run(t *testing.T, m *emu.Machine) {
	t.Helper()
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func randn(r *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * scale)
	}
	return x
}

// relErr is the largest |got−want| / max(|want|, rms(want)): relative
// error, with values below the tensor's root mean square judged against it
// (the sums of different orders that a GPU runs leave errors of the
// tensor's scale, not of each element's: an element near zero after
// cancellation carries the rounding of the terms that cancelled). NaN
// counts as infinite unless both are NaN.
func relErr(got, want []float32) float64 {
	var ss float64
	for _, w := range want {
		ss += float64(w) * float64(w)
	}
	floor := math.Sqrt(ss / float64(max(len(want), 1)))
	var e float64
	for i, w := range want {
		d := math.Abs(float64(got[i]) - float64(w))
		if math.IsNaN(d) {
			if math.IsNaN(float64(w)) && math.IsNaN(float64(got[i])) {
				continue
			}
			return math.Inf(1)
		}
		den := max(math.Abs(float64(w)), floor)
		if den == 0 {
			if d != 0 {
				return math.Inf(1)
			}
			continue
		}
		e = max(e, d/den)
	}
	return e
}

// checkClose fails the test when relErr exceeds tol and logs the error.
func checkClose(t *testing.T, name string, got, want []float32, tol float64) {
	t.Helper()
	e := relErr(got, want)
	t.Logf("%s: max relative error %.3g", name, e)
	if !(e <= tol) {
		t.Errorf("%s: max relative error %.3g > %g", name, e, tol)
		for i := range want {
			if got[i] != want[i] {
				t.Logf("%s: first difference at %d: got %v, want %v", name, i, got[i], want[i])
				break
			}
		}
	}
}

// checkExact fails the test unless got and want are equal bit for bit.
func checkExact(t *testing.T, name string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Errorf("%s[%d] = %v, want %v (bit-exact)", name, i, got[i], want[i])
			return
		}
	}
}

// offset returns p moved by n floats: a pointer that is not 16-byte
// aligned when n is not a multiple of 4, exercising the scalar paths.
func offset(p cuda.Ptr, n int) cuda.Ptr { return p + cuda.Ptr(4*n) }

// place copies x into a fresh buffer at float offset off and returns the
// pointer to it.
func place(m *emu.Machine, x []float32, off int) cuda.Ptr {
	return offset(m.Float32s(append(make([]float32, off), x...)), off)
}

func TestSource(t *testing.T) {
	src := cuda.Source()
	if regexp.MustCompile(`(?m)^\s*#\s*include`).MatchString(src) {
		t.Error("Source has an #include: NVRTC gets no headers")
	}
	names := emuProgram(t).Names()
	for _, n := range cuda.KernelNames() {
		if !slices.Contains(names, n) {
			t.Errorf("kernel %s of KernelNames is not in Source", n)
		}
	}
	m := emuProgram(t).NewMachine()
	if _, err := cuda.NewKernels(m, m.Lookup); err != nil {
		t.Fatal(err)
	}
	if _, err := cuda.NewKernels(m, func(string) (cuda.Function, error) { return 0, os.ErrNotExist }); err == nil {
		t.Error("NewKernels succeeded with a lookup that finds nothing")
	}
}

// cpuBackend is the reference: the CPU backend on one thread.
var cpuBackend = new(cpu.Backend)
