package cpu

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Backend is the CPU compute backend: a matrix multiply (the built-in
// SIMD GEMM, or OpenBLAS where that is faster or asked for), a fork-join
// helper and the layer kernels built on them.
//
// A Backend holds no per-call state: after [New] or [Open] returns, its
// methods may be called from several goroutines at once (the built-in
// GEMM draws its packing buffers from a pool; OpenBLAS is thread-safe),
// although a training loop normally calls it from one goroutine and lets
// ParallelFor and the GEMM spread the work. The zero Backend is usable: it
// runs the built-in GEMM with the CPU's best kernel on one thread. A
// Backend must not be copied after first use.
type Backend struct {
	threads int

	// kern is the built-in fp32 micro-kernel; nil means the CPU's best.
	kern *gemmKernel
	// bf16 is the bf16 micro-kernel the matmuls run on, or nil for fp32.
	bf16 *gemmKernel
	// blas is the loaded BLAS library Sgemm calls, or nil for the
	// built-in GEMM.
	blas *blasLib
	// note is one line for the user about the GEMM in use (see
	// FallbackReason), or "".
	note string

	// gemmPool pools *gemmBufs for the built-in GEMM.
	gemmPool sync.Pool
	// scratchPool pools *[]float32, the kernels' working buffers
	// (scratch).
	scratchPool sync.Pool

	// scalarAdamW turns the vector AdamW loop off (tests compare the two).
	scalarAdamW bool
	// poisonScratch fills each buffer scratch returns with NaNs (tests: a
	// kernel that reads what it has not written there fails them).
	poisonScratch bool

	// halves are the buffers of bfloat16 activations (activations.go).
	halves halfSpans

	// peak caches the measured peak (see PeakFLOPS).
	peakOnce sync.Once
	peak     float64
}

// scratch returns a working buffer of n float32s whose contents are
// undefined (the caller writes every element before it reads one) and the
// function that gives it back. The buffers are pooled so that a kernel's
// working memory (attention's probabilities and their gradients: NH·T²
// floats, 48 MB a call at T=1024) costs the next call neither fresh pages
// nor zeroing.
func (b *Backend) scratch(n int) ([]float32, func()) {
	p, _ := b.scratchPool.Get().(*[]float32)
	if p == nil || cap(*p) < n {
		p = new([]float32)
		*p = make([]float32, n)
	}
	s := (*p)[:n]
	if b.poisonScratch {
		for i := range s {
			s[i] = float32(math.NaN())
		}
	}
	return s, func() { b.scratchPool.Put(p) }
}

// Options are the settings of [Open] that do not come from the
// environment.
type Options struct {
	// BF16 is Engine.mix_precision.dtype: bf16. The matmuls' GEMMs
	// (MatmulForward, MatmulBackward) run with their inputs rounded to
	// bfloat16 and fp32 accumulation (VDPBF16PS), and the buffers from
	// Activations hold bfloat16 values: every kernel rounds what it
	// stores there (kernels.Activations). Everything else stays fp32,
	// Sgemm's arithmetic included. It needs AVX512_BF16.
	BF16 bool
}

// FeatureError is Open's error for an option the CPU cannot do: bf16
// matmuls without AVX512_BF16.
type FeatureError struct {
	Feature string // the missing instruction set, as "AVX512_BF16"
}

func (e *FeatureError) Error() string {
	return fmt.Sprintf("bf16 matrix multiplies on the CPU need %s, which this CPU lacks", e.Feature)
}

// config holds what newBackend reads from the environment and Options.
type config struct {
	blas    string // GPTUI_BLAS: "" (choose), "go", "openblas", or a library name or path
	threads string // GPTUI_THREADS: "" or a positive integer
	kernel  string // a built-in kernel by name ("avx2", …), for tests; "" for the best
	bf16    bool   // Options.BF16
}

// envConfig reads the environment variables that steer New and Open.
func envConfig() config {
	return config{blas: os.Getenv("GPTUI_BLAS"), threads: os.Getenv("GPTUI_THREADS")}
}

// Open returns a Backend configured from the environment and opts.
//
// The thread count is runtime.GOMAXPROCS(0) unless GPTUI_THREADS holds a
// positive integer (other values are ignored). GPTUI_BLAS chooses the GEMM:
//
//	(unset)    the built-in GEMM where it has an AVX-512 kernel (faster
//	           than OpenBLAS there, see docs/training.md); on other CPUs
//	           OpenBLAS if it can be found, else the built-in
//	go         the built-in GEMM
//	openblas   OpenBLAS, searched for where distributions install it
//	<file>     that library, by name or path (it must export cblas_sgemm)
//
// Open fails, with a one-line error, when GPTUI_BLAS names a library that
// cannot be loaded or opts asks for what the CPU lacks. When OpenBLAS is
// loaded, Open sets its thread count with openblas_set_num_threads; that
// setting is process-wide, so the most recently created Backend decides
// it.
func Open(opts Options) (*Backend, error) {
	cfg := envConfig()
	cfg.bf16 = opts.BF16
	return newBackend(cfg)
}

// New is [Open] with fp32 matmuls that never fails: when GPTUI_BLAS names
// a library that cannot be loaded it uses the built-in GEMM and says so in
// [Backend.FallbackReason].
func New() *Backend {
	b, err := newBackend(envConfig())
	if err != nil {
		b = &Backend{threads: b.threads, note: err.Error() + "; using the built-in GEMM"}
	}
	return b
}

// newBackend is Open with the environment and options given as cfg. On
// error it still returns a Backend holding the thread count.
func newBackend(cfg config) (*Backend, error) {
	b := &Backend{threads: runtime.GOMAXPROCS(0)}
	if n, err := strconv.Atoi(strings.TrimSpace(cfg.threads)); err == nil && n > 0 {
		b.threads = n
	}
	if cfg.kernel != "" {
		for _, k := range fp32Kernels() {
			if k.name == cfg.kernel {
				b.kern = k
			}
		}
		if b.kern == nil {
			return b, fmt.Errorf("built-in GEMM kernel %q: not available on this CPU", cfg.kernel)
		}
	}
	switch spec := strings.TrimSpace(cfg.blas); spec {
	case "go":
	case "":
		if k := b.kernel(); k.vsBLAS != blasSlower {
			b.blas, b.note = findBLAS(false)
			if k.vsBLAS == blasNear {
				b.note = "" // the built-in GEMM is nearly as fast
			}
		}
	case "openblas":
		lib, reason := findBLAS(true)
		if lib == nil {
			return b, fmt.Errorf("GPTUI_BLAS=openblas: %s", reason)
		}
		b.blas = lib
	default:
		lib, err := openBLAS(spec)
		if err != nil {
			return b, fmt.Errorf("GPTUI_BLAS=%s: %w", spec, err)
		}
		b.blas = lib
	}
	if b.blas != nil && b.blas.setThreads != nil {
		b.blas.setThreads(int32(min(b.threads, math.MaxInt32)))
	}
	if cfg.bf16 {
		k, missing := bf16Kernel()
		if k == nil {
			return b, &FeatureError{Feature: missing}
		}
		b.bf16 = k
	}
	return b, nil
}

// bestKernel is the fastest fp32 kernel this CPU runs.
var bestKernel = sync.OnceValue(func() *gemmKernel { return fp32Kernels()[0] })

// kernel returns the built-in fp32 kernel.
func (b *Backend) kernel() *gemmKernel {
	if b.kern != nil {
		return b.kern
	}
	return bestKernel()
}

// BLAS describes the GEMM Sgemm uses: "built-in" and its kernel ("avx512",
// "avx2", "sse2" or "go"), or the library kind ("openblas", or "cblas"
// for another library exporting cblas_sgemm) followed by its file, for
// example "openblas /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so"
// (a library found by soname is reported by the file the loader mapped).
func (b *Backend) BLAS() string {
	if b.blas == nil {
		return "built-in " + b.kernel().name
	}
	return b.blas.kind + " " + b.blas.path
}

// FallbackReason returns one line saying why the GEMM in use is not the
// one asked for, or is slower than one that could be installed; "" when
// there is nothing to say.
func (b *Backend) FallbackReason() string {
	return b.note
}

// Threads returns the number of threads the Backend spreads work over: the
// most goroutines ParallelFor starts, and the OpenBLAS thread count. It is
// at least 1.
func (b *Backend) Threads() int {
	return max(b.threads, 1)
}

// Sgemm computes, on row-major matrices,
//
//	C = alpha·op(A)·op(B) + beta·C
//
// where C is m×n, op(A) is m×k and op(B) is k×n. A is stored m×k, or k×m when
// transA is set (op(A) = Aᵀ); B is stored k×n, or n×k when transB is set.
// lda, ldb and ldc are the row strides of the stored matrices and must be at
// least their column counts (and at least 1).
//
// When beta is 0, C is overwritten and its previous contents (NaN included)
// are ignored; when alpha is 0 or k is 0, A and B are not read. Sgemm panics
// if a dimension is negative, a stride is too small, or a slice is too short
// for the shape and stride it is given; these are programmer errors.
//
// Into bfloat16 activations (Activations) C is stored rounded, once the
// product is complete.
func (b *Backend) Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, bm []float32, ldb int, beta float32, c []float32, ldc int) {
	b.sgemm(transA, transB, m, n, k, alpha, a, lda, bm, ldb, beta, c, ldc)
	b.store(c)
}

// sgemm is Sgemm without the rounding into bfloat16 activations: the
// kernels built on it store what they wrote once, when they are done.
func (b *Backend) sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, bm []float32, ldb int, beta float32, c []float32, ldc int) {
	checkSgemm(transA, transB, m, n, k, a, lda, bm, ldb, c, ldc)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 {
		b.scaleC(m, n, beta, c, ldc)
		return
	}
	if b.blas != nil && float64(m)*float64(n)*float64(k) >= blasMinWork && fitsInt32(m, n, k, lda, ldb, ldc) {
		b.blas.sgemm(transA, transB, m, n, k, alpha, a, lda, bm, ldb, beta, c, ldc)
		return
	}
	b.gemm(b.kernel(), &gemmArgs{transA, transB, m, n, k, alpha, beta, a, lda, bm, ldb, c, ldc})
}

// matmulGemm is Sgemm for the matmuls: in bf16 when the Backend was opened
// with Options.BF16, otherwise Sgemm itself.
func (b *Backend) matmulGemm(transA, transB bool, m, n, k int, a []float32, lda int, bm []float32, ldb int, beta float32, c []float32, ldc int) {
	if b.bf16 == nil {
		b.sgemm(transA, transB, m, n, k, 1, a, lda, bm, ldb, beta, c, ldc)
		return
	}
	checkSgemm(transA, transB, m, n, k, a, lda, bm, ldb, c, ldc)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		b.scaleC(m, n, beta, c, ldc)
		return
	}
	b.gemm(b.bf16, &gemmArgs{transA, transB, m, n, k, 1, beta, a, lda, bm, ldb, c, ldc})
}

// blasMinWork is the m·n·k below which Sgemm uses the built-in GEMM even
// when a BLAS library is loaded: a call through purego costs about 2µs,
// more than a product this small takes.
const blasMinWork = 12 * 12 * 12

// checkSgemm panics unless the arguments describe matrices that lie inside
// the given slices.
func checkSgemm(transA, transB bool, m, n, k int, a []float32, lda int, bm []float32, ldb int, c []float32, ldc int) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("cpu: Sgemm: negative dimension (m=%d n=%d k=%d)", m, n, k))
	}
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	checkMatrix("A", a, ar, ac, lda)
	checkMatrix("B", bm, br, bc, ldb)
	checkMatrix("C", c, m, n, ldc)
}

// checkMatrix panics unless s holds a rows×cols matrix with row stride ld.
func checkMatrix(name string, s []float32, rows, cols, ld int) {
	if ld < max(cols, 1) {
		panic(fmt.Sprintf("cpu: Sgemm: ld%s=%d, want ≥ max(1, %d)", strings.ToLower(name), ld, cols))
	}
	if rows == 0 || cols == 0 {
		return
	}
	if need := (rows-1)*ld + cols; len(s) < need {
		panic(fmt.Sprintf("cpu: Sgemm: len(%s)=%d, want ≥ %d for %d×%d with stride %d", name, len(s), need, rows, cols, ld))
	}
}

// fitsInt32 reports whether every value fits the 32-bit integers of the
// LP64 CBLAS interface.
func fitsInt32(v ...int) bool {
	for _, x := range v {
		if x > math.MaxInt32 {
			return false
		}
	}
	return true
}

// scaleC sets C (m×n, stride ldc) to beta·C, writing zeros when beta is 0.
func (b *Backend) scaleC(m, n int, beta float32, c []float32, ldc int) {
	if beta == 1 || m == 0 || n == 0 {
		return
	}
	b.ParallelFor(m, max(1, 1<<14/n), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			row := c[i*ldc : i*ldc+n]
			if beta == 0 {
				clear(row)
				continue
			}
			for j := range row {
				row[j] *= beta
			}
		}
	})
}

// MeasureSgemmFLOPS times the n×n×n product C = A·B with this Backend's
// Sgemm and returns the median rate in FLOP/s, counting 2·n³ operations per
// product. It runs one untimed warm-up product, then at least 3 and at most
// 9 timed ones, stopping early once about half a second has been spent. It
// returns 0 when n < 1. The result serves as the CPU's achievable peak when
// computing model FLOPs utilisation.
func (b *Backend) MeasureSgemmFLOPS(n int) float64 {
	if n < 1 {
		return 0
	}
	a := make([]float32, n*n)
	bm := make([]float32, n*n)
	c := make([]float32, n*n)
	// Deterministic values in [-1, 1) so no time is spent on denormals.
	x := uint32(1)
	for i := range a {
		x = x*1664525 + 1013904223
		a[i] = float32(x>>8)/(1<<23) - 1
		x = x*1664525 + 1013904223
		bm[i] = float32(x>>8)/(1<<23) - 1
	}
	run := func() time.Duration {
		start := time.Now()
		b.sgemm(false, false, n, n, n, 1, a, n, bm, n, 0, c, n)
		return time.Since(start)
	}
	run() // warm-up: page in buffers, start BLAS threads
	const (
		minRuns = 3
		maxRuns = 9
		budget  = 500 * time.Millisecond
	)
	var times []time.Duration
	var total time.Duration
	for len(times) < maxRuns && (len(times) < minRuns || total < budget) {
		d := run()
		times = append(times, d)
		total += d
	}
	slices.Sort(times)
	med := times[len(times)/2].Seconds()
	if med <= 0 {
		med = 1e-9 // a clock too coarse to see the product
	}
	return 2 * float64(n) * float64(n) * float64(n) / med
}
