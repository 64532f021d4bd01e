package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/ebitengine/purego"

	"github.com/gptui/gptui/kernels/ref"
)

// sgemmTol bounds |got−want| / (|alpha|·Σ_p|op(A)_ip·op(B)_pj| + |beta·C_ij|),
// the error of each element relative to the magnitudes that formed it.
const sgemmTol = 1e-5

// padValue fills the stride padding of every test matrix: a kernel that
// reads padding turns results into NaN, and one that writes C's padding
// changes it.
var padValue = float32(math.NaN())

const cPad = float32(12345)

// gemmBackends returns the backends whose Sgemm the tests check: each
// built-in kernel this CPU can run, with one thread and with three (three
// split the work unevenly), and OpenBLAS when it can be loaded.
func gemmBackends(t testing.TB) map[string]*Backend {
	t.Helper()
	bs := make(map[string]*Backend)
	for _, k := range fp32Kernels() {
		bs[k.name+"-1thread"] = testBackend(t, config{blas: "go", kernel: k.name, threads: "1"})
		bs[k.name+"-3threads"] = testBackend(t, config{blas: "go", kernel: k.name, threads: "3"})
	}
	if be, err := newBackend(config{blas: "openblas"}); err == nil {
		bs["openblas"] = be
	} else {
		t.Logf("OpenBLAS path not tested: %v", err)
	}
	return bs
}

// testBackend is newBackend for a configuration that must work.
func testBackend(t testing.TB, cfg config) *Backend {
	t.Helper()
	be, err := newBackend(cfg)
	if err != nil {
		t.Fatalf("newBackend(%+v): %v", cfg, err)
	}
	return be
}

// stored is a row-major rows×cols test matrix with stride ld ≥ cols whose
// padding holds pad.
type stored struct {
	rows, cols, ld int
	data           []float32
}

func newStored(r *rand.Rand, rows, cols, extra int, pad float32) stored {
	ld := max(cols+extra, 1)
	n := 0
	if rows > 0 {
		n = (rows-1)*ld + cols
	}
	s := stored{rows, cols, ld, make([]float32, n+extra)}
	for i := range s.data {
		s.data[i] = pad
	}
	for i := range rows {
		for j := range cols {
			s.data[i*ld+j] = float32(r.Float64()*2 - 1)
		}
	}
	return s
}

func (s stored) at(i, j int) float64 { return float64(s.data[i*s.ld+j]) }

// refGemm returns, in float64 (ref.Gemm), op(A)·op(B) and
// Σ_p |op(A)_ip·op(B)_pj|, the product of the magnitudes.
func refGemm(transA, transB bool, m, n, k int, a, b stored) (prod, mag []float64) {
	a64, b64 := ref.To64(a.data), ref.To64(b.data)
	prod = ref.Gemm(transA, transB, m, n, k, a64, a.ld, b64, b.ld)
	for i := range a64 {
		a64[i] = math.Abs(a64[i])
	}
	for i := range b64 {
		b64[i] = math.Abs(b64[i])
	}
	return prod, ref.Gemm(transA, transB, m, n, k, a64, a.ld, b64, b.ld)
}

func TestSgemm(t *testing.T) {
	shapes := []struct{ m, n, k int }{
		{1, 1, 1},
		{3, 5, 7},
		{17, 17, 17},
		{2, 4, 256},    // exactly one micro-tile of the Go kernel, one k block
		{8, 48, 256},   // exactly one AVX-512 tile
		{64, 128, 96},  // whole tiles
		{130, 67, 200}, // ragged everywhere
		{67, 300, 513}, // several k blocks and several tiles per dimension
		{257, 3, 257},  // tall: threads split the rows
		{3, 1600, 17},  // wide: two column panels, a narrow last strip
		{1, 1000, 3},   // a row vector times a matrix
		{200, 1, 9},    // a matrix times a column vector
		{0, 5, 3},
		{4, 0, 3},
		{4, 5, 0},
	}
	scalars := []struct{ alpha, beta float32 }{
		{1, 0}, // C starts as NaN and must be overwritten
		{1, 1},
		{0.5, -2},
		{-1.5, 0.25},
		{0, 0.5}, // only scales C
	}
	backends := gemmBackends(t)
	r := rand.New(rand.NewPCG(1, 2))
	for _, sh := range shapes {
		for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
			transA, transB := tr[0], tr[1]
			m, n, k := sh.m, sh.n, sh.k
			ar, ac := m, k
			if transA {
				ar, ac = k, m
			}
			br, bc := k, n
			if transB {
				br, bc = n, k
			}
			// Odd stride padding for some shapes, none for others.
			extra := (m + n + k) % 3
			a := newStored(r, ar, ac, extra, padValue)
			b := newStored(r, br, bc, 2*extra, padValue)
			prod, mag := refGemm(transA, transB, m, n, k, a, b)
			for _, sc := range scalars {
				c0 := newStored(r, m, n, extra, cPad)
				if sc.beta == 0 {
					for i := range m {
						for j := range n {
							c0.data[i*c0.ld+j] = float32(math.NaN())
						}
					}
				}
				for name, be := range backends {
					t.Run(fmt.Sprintf("%s/%dx%dx%d/tA=%v,tB=%v/a=%g,b=%g", name, m, n, k, transA, transB, sc.alpha, sc.beta), func(t *testing.T) {
						c := stored{m, n, c0.ld, slices.Clone(c0.data)}
						be.Sgemm(transA, transB, m, n, k, sc.alpha, a.data, a.ld, b.data, b.ld, sc.beta, c.data, c.ld)
						checkGemm(t, c, c0, prod, mag, sc.alpha, sc.beta)
					})
				}
			}
		}
	}
}

// checkGemm compares C = alpha·prod + beta·C0 element by element, and checks
// that the padding of C was left alone.
func checkGemm(t *testing.T, c, c0 stored, prod, mag []float64, alpha, beta float32) {
	t.Helper()
	worst, wi, wj := 0.0, -1, -1
	for i := range c.rows {
		for j := range c.cols {
			want, scale := float64(alpha)*prod[i*c.cols+j], math.Abs(float64(alpha))*mag[i*c.cols+j]
			if beta != 0 {
				want += float64(beta) * c0.at(i, j)
				scale += math.Abs(float64(beta) * c0.at(i, j))
			}
			e := math.Abs(c.at(i, j) - want)
			if e != 0 {
				e /= scale
			}
			if !(e <= worst) { // NaN counts as the worst
				worst, wi, wj = e, i, j
			}
		}
	}
	if !(worst < sgemmTol) {
		t.Errorf("element [%d,%d]: relative error %.3g, want < %g", wi, wj, worst, sgemmTol)
	}
	for i, v := range c.data {
		if row, col := i/c.ld, i%c.ld; row >= c.rows || col >= c.cols {
			if v != cPad {
				t.Fatalf("padding element %d (row %d, col %d) changed from %g to %g", i, row, col, cPad, v)
			}
		}
	}
}

// TestSgemmMatchesAcrossBackends checks OpenBLAS and each built-in kernel
// against each other on a GPT-2-shaped product with the matmul-backward
// beta of 1.
func TestSgemmMatchesAcrossBackends(t *testing.T) {
	bs := gemmBackends(t)
	ob, ok := bs["openblas"]
	if !ok {
		t.Skip("no OpenBLAS to compare with")
	}
	r := rand.New(rand.NewPCG(3, 4))
	const m, n, k = 96, 768, 320
	a := newStored(r, k, m, 0, 0) // transA: stored k×m
	b := newStored(r, k, n, 0, 0)
	c0 := newStored(r, m, n, 0, 0)
	cb := slices.Clone(c0.data)
	ob.Sgemm(true, false, m, n, k, 1, a.data, m, b.data, n, 1, cb, n)
	for name, be := range bs {
		cg := slices.Clone(c0.data)
		be.Sgemm(true, false, m, n, k, 1, a.data, m, b.data, n, 1, cg, n)
		var num, den float64
		for i := range cb {
			d := float64(cb[i]) - float64(cg[i])
			num += d * d
			den += float64(cb[i]) * float64(cb[i])
		}
		if e := math.Sqrt(num / den); !(e < sgemmTol) {
			t.Errorf("OpenBLAS and %s differ: relative Frobenius error %.3g, want < %g", name, e, sgemmTol)
		}
	}
}

func TestSgemmConcurrent(t *testing.T) {
	for name, be := range gemmBackends(t) {
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(5, 6))
			const m, n, k = 33, 70, 300
			a, b := newStored(r, m, k, 0, 0), newStored(r, k, n, 0, 0)
			prod, mag := refGemm(false, false, m, n, k, a, b)
			const workers = 4
			cs := make([]stored, workers)
			var wg sync.WaitGroup
			for w := range cs {
				cs[w] = stored{m, n, n, make([]float32, m*n)}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 5 {
						be.Sgemm(false, false, m, n, k, 1, a.data, k, b.data, n, 0, cs[w].data, n)
					}
				}()
			}
			wg.Wait()
			for _, c := range cs {
				checkGemm(t, c, c, prod, mag, 1, 0)
			}
		})
	}
}

func TestSgemmPanics(t *testing.T) {
	buf := make([]float32, 100)
	tests := []struct {
		name           string
		transA, transB bool
		m, n, k        int
		lenA, lda      int
		lenB, ldb      int
		lenC, ldc      int
		want           string
	}{
		{"negative m", false, false, -1, 2, 2, 4, 2, 4, 2, 4, 2, "negative dimension"},
		{"short A", false, false, 3, 2, 4, 11, 4, 8, 2, 6, 2, "len(A)=11, want ≥ 12"},
		{"short A transposed", true, false, 3, 2, 4, 11, 3, 8, 2, 6, 2, "len(A)=11"},
		{"short B", false, false, 3, 2, 4, 12, 4, 7, 2, 6, 2, "len(B)=7, want ≥ 8"},
		{"short B transposed", false, true, 3, 2, 4, 12, 4, 7, 4, 6, 2, "len(B)=7"},
		{"short C", false, false, 3, 2, 4, 12, 4, 8, 2, 5, 2, "len(C)=5, want ≥ 6"},
		{"short C strided", false, false, 3, 2, 4, 12, 4, 8, 2, 10, 5, "len(C)=10, want ≥ 12"},
		{"small lda", false, false, 3, 2, 4, 12, 3, 8, 2, 6, 2, "lda=3"},
		{"small ldb transposed", false, true, 3, 2, 4, 12, 4, 8, 2, 6, 2, "ldb=2"},
		{"small ldc", false, false, 3, 2, 4, 12, 4, 8, 2, 6, 1, "ldc=1"},
		{"zero ld with empty matrix", false, false, 0, 2, 0, 0, 0, 0, 2, 0, 2, "lda=0"},
	}
	for name, be := range gemmBackends(t) {
		for _, tt := range tests {
			t.Run(name+"/"+tt.name, func(t *testing.T) {
				defer func() {
					r := recover()
					if r == nil {
						t.Fatalf("no panic, want one containing %q", tt.want)
					}
					if msg := fmt.Sprint(r); !strings.Contains(msg, tt.want) {
						t.Fatalf("panic %q, want one containing %q", msg, tt.want)
					}
				}()
				be.Sgemm(tt.transA, tt.transB, tt.m, tt.n, tt.k, 1,
					buf[:tt.lenA], tt.lda, buf[:tt.lenB], tt.ldb, 0, buf[:tt.lenC], tt.ldc)
			})
		}
	}
}

// TestSgemmEmptyOperands checks that shapes with nothing to multiply accept
// empty A and B slices.
func TestSgemmEmptyOperands(t *testing.T) {
	for name, be := range gemmBackends(t) {
		t.Run(name, func(t *testing.T) {
			c := []float32{1, 2, 3, 4, 5, 6}
			be.Sgemm(false, false, 2, 3, 0, 1, nil, 1, nil, 3, 2, c, 3)
			if want := []float32{2, 4, 6, 8, 10, 12}; !slices.Equal(c, want) {
				t.Errorf("k=0, beta=2: C = %v, want %v", c, want)
			}
			be.Sgemm(false, false, 0, 3, 4, 1, nil, 4, make([]float32, 12), 3, 0, nil, 3)
		})
	}
}

func TestNewEnvironment(t *testing.T) {
	gomax := runtime.GOMAXPROCS(0)
	best := "built-in " + fp32Kernels()[0].name
	type envCase struct {
		blas, threads string
		wantThreads   int
		wantBLAS      string // New's GEMM
		wantErr       string // substring of Open's error; "" for none
	}
	tests := []envCase{
		{"go", "", gomax, best, ""},
		{"go", "3", 3, best, ""},
		{"go", " 5 ", 5, best, ""},
		{"go", "0", gomax, best, ""},
		{"go", "-2", gomax, best, ""},
		{"go", "many", gomax, best, ""},
		{"/nonexistent/libnothing.so", "", gomax, best, "GPTUI_BLAS=/nonexistent/libnothing.so: dlopen:"},
	}
	if fp32Kernels()[0].vsBLAS == blasSlower {
		tests = append(tests, envCase{"", "", gomax, best, ""})
	}
	if runtime.GOOS == "linux" {
		// A real library without cblas_sgemm.
		tests = append(tests, envCase{"libm.so.6", "", gomax, best, "does not export cblas_sgemm"})
	}
	if lib, _ := findBLAS(true); lib != nil {
		tests = append(tests,
			envCase{lib.path, "2", 2, "openblas " + lib.path, ""},
			envCase{"openblas", "2", 2, "openblas " + lib.path, ""})
	}
	for _, tt := range tests {
		t.Run(tt.blas+"/"+tt.threads, func(t *testing.T) {
			t.Setenv("GPTUI_BLAS", tt.blas)
			t.Setenv("GPTUI_THREADS", tt.threads)
			_, err := Open(Options{})
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("Open: error %v, want one containing %q", err, tt.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "\n") {
				t.Errorf("Open: error %q spans several lines", err)
			}
			be := New()
			if got := be.Threads(); got != tt.wantThreads {
				t.Errorf("Threads() = %d, want %d", got, tt.wantThreads)
			}
			if got := be.BLAS(); got != tt.wantBLAS {
				t.Errorf("BLAS() = %q, want %q", got, tt.wantBLAS)
			}
			if got := be.FallbackReason(); !strings.Contains(got, tt.wantErr) || (tt.wantErr == "") != (got == "") {
				t.Errorf("FallbackReason() = %q, want it to contain %q", got, tt.wantErr)
			}
		})
	}
}

// TestOpenOpenBLASMissing: GPTUI_BLAS=openblas where OpenBLAS cannot be
// found is an error naming the package to install.
func TestOpenOpenBLASMissing(t *testing.T) {
	if lib, _ := findBLAS(true); lib != nil {
		t.Skipf("OpenBLAS is installed (%s)", lib.path)
	}
	t.Setenv("GPTUI_BLAS", "openblas")
	_, err := Open(Options{})
	if err == nil || !strings.Contains(err.Error(), "GPTUI_BLAS=openblas") || !strings.Contains(err.Error(), "libopenblas0") {
		t.Errorf("Open: %v, want an error naming GPTUI_BLAS=openblas and libopenblas0", err)
	}
}

// TestFindBLAS checks that the search finds OpenBLAS where Debian installs
// it, when it is installed there, and that it explains itself otherwise.
func TestFindBLAS(t *testing.T) {
	lib, reason := findBLAS(true)
	if lib == nil {
		if reason == "" || !strings.Contains(reason, "libopenblas0") {
			t.Errorf("findBLAS() = nil, %q; want a reason naming the package to install", reason)
		}
		for _, c := range blasCandidates() {
			if strings.Contains(c, "/") {
				if _, err := os.Stat(c); err == nil {
					t.Errorf("findBLAS() found nothing, but candidate %s exists", c)
				}
			}
		}
		return
	}
	if reason != "" {
		t.Errorf("findBLAS() loaded %s but also gave reason %q", lib.path, reason)
	}
	if !strings.HasPrefix(lib.path, "/") {
		t.Errorf("loaded library path %q is not absolute", lib.path)
	}
	if lib.kind != "openblas" || lib.setThreads == nil {
		t.Logf("loaded %s %s without openblas_set_num_threads", lib.kind, lib.path)
	}
}

func TestBLASCandidates(t *testing.T) {
	cands := blasCandidates()
	if len(cands) == 0 {
		t.Fatal("no candidates")
	}
	seen := make(map[string]bool)
	for _, c := range cands {
		if seen[c] {
			t.Errorf("candidate %s listed twice", c)
		}
		seen[c] = true
	}
	if runtime.GOOS != "linux" {
		return
	}
	if cands[0] != "libopenblas.so.0" {
		t.Errorf("first candidate %q, want libopenblas.so.0", cands[0])
	}
	if last := cands[len(cands)-1]; last != "libblas.so.3" {
		t.Errorf("last candidate %q, want libblas.so.3", last)
	}
	if runtime.GOARCH == "amd64" {
		const debian = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"
		if !seen[debian] {
			t.Errorf("candidates %q lack %s", cands, debian)
		}
	}
}

func TestMappedFile(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs /proc/self/maps")
	}
	h, err := purego.Dlopen("libm.so.6", purego.RTLD_NOW)
	if err != nil {
		t.Skipf("no libm: %v", err)
	}
	sym, err := purego.Dlsym(h, "cos")
	if err != nil {
		t.Fatal(err)
	}
	path, ok := mappedFile(sym)
	if !ok || !strings.HasPrefix(path, "/") || !strings.Contains(path, "libm") {
		t.Errorf("mappedFile(cos) = %q, %v; want an absolute path to libm", path, ok)
	}
	if path, ok := mappedFile(0); ok {
		t.Errorf("mappedFile(0) = %q, true; want false", path)
	}
}

func TestZeroBackend(t *testing.T) {
	var be Backend
	if be.Threads() != 1 || be.BLAS() != "built-in "+fp32Kernels()[0].name || be.FallbackReason() != "" {
		t.Errorf("zero Backend: Threads %d, BLAS %q, FallbackReason %q", be.Threads(), be.BLAS(), be.FallbackReason())
	}
	c := []float32{float32(math.NaN())}
	be.Sgemm(false, false, 1, 1, 1, 2, []float32{3}, 1, []float32{4}, 1, 0, c, 1)
	if c[0] != 24 {
		t.Errorf("zero Backend: 2·3·4 = %g, want 24", c[0])
	}
}

func TestMeasureSgemmFLOPS(t *testing.T) {
	for name, be := range gemmBackends(t) {
		t.Run(name, func(t *testing.T) {
			if got := be.MeasureSgemmFLOPS(0); got != 0 {
				t.Errorf("MeasureSgemmFLOPS(0) = %g, want 0", got)
			}
			got := be.MeasureSgemmFLOPS(64)
			// Anything from a slow emulator to a large server is between.
			if !(got > 1e6 && got < 1e15) {
				t.Errorf("MeasureSgemmFLOPS(64) = %g FLOP/s, implausible", got)
			}
			t.Logf("%s: %s GFLOP/s at n=64", be.BLAS(), strconv.FormatFloat(got/1e9, 'f', 2, 64))
		})
	}
}

// TestBLASScalars calls cblas_sgemm directly on 1×1 matrices, below the
// size at which Sgemm would use it, to check that purego passes the float32
// alpha and beta and the strides in the right registers.
func TestBLASScalars(t *testing.T) {
	be, err := newBackend(config{blas: "openblas"})
	if err != nil {
		t.Skipf("no OpenBLAS: %v", err)
	}
	tests := []struct {
		transA, transB    bool
		alpha, a, b, beta float32
		c, want           float32
	}{
		{false, false, 2, 3, 4, 0.5, 10, 29},
		{true, false, -1, 3, 4, 0, float32(math.NaN()), -12},
		{false, true, 0.25, 8, 2, 1, 1, 5},
		{true, true, 1, 1.5, -2, -3, 2, -9},
	}
	for _, tt := range tests {
		c := []float32{tt.c}
		be.blas.sgemm(tt.transA, tt.transB, 1, 1, 1, tt.alpha, []float32{tt.a}, 1, []float32{tt.b}, 1, tt.beta, c, 1)
		if c[0] != tt.want {
			t.Errorf("%g·%g·%g + %g·%g = %g, want %g", tt.alpha, tt.a, tt.b, tt.beta, tt.c, c[0], tt.want)
		}
	}
}

// TestSgemmThreadsBitEqual: each kernel gives the same bits with 1, 2 and
// 3 threads (they split C differently, and its last strip may fall to a
// narrower kernel, but every element is the same dot product in the same
// order), on a tall and a wide product with several k blocks.
func TestSgemmThreadsBitEqual(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, sh := range []struct{ m, n, k int }{{300, 67, 513}, {67, 300, 300}} {
		a, b := newStored(r, sh.m, sh.k, 1, 0), newStored(r, sh.n, sh.k, 2, 0)
		for _, kern := range fp32Kernels() {
			var want []float32
			for _, th := range []string{"1", "2", "3"} {
				be := testBackend(t, config{blas: "go", kernel: kern.name, threads: th})
				c := make([]float32, sh.m*sh.n)
				be.Sgemm(false, true, sh.m, sh.n, sh.k, 1, a.data, a.ld, b.data, b.ld, 0, c, sh.n)
				if want == nil {
					want = c
					continue
				}
				for i := range c {
					if math.Float32bits(c[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s %dx%dx%d: element %d is %v with %s threads, %v with 1", kern.name, sh.m, sh.n, sh.k, i, c[i], th, want[i])
					}
				}
			}
		}
	}
}
