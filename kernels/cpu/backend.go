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

// Backend is the CPU compute backend: a matrix multiply (OpenBLAS when it
// could be loaded, pure Go otherwise), a fork-join helper and the layer
// kernels built on them.
//
// A Backend holds no per-call state: after [New] returns, its methods may be
// called from several goroutines at once (pure-Go Sgemm calls draw their
// packing buffers from a pool; OpenBLAS is thread-safe), although a training
// loop normally calls it from one goroutine and lets ParallelFor and the BLAS
// library spread the work. The zero Backend is usable: it runs the pure-Go
// GEMM on one thread. A Backend must not be copied after first use.
type Backend struct {
	threads int

	// blas is the loaded BLAS library, or nil for the pure-Go GEMM.
	blas *blasLib
	// fallback says why blas is nil; empty when a library is loaded.
	fallback string

	// packs pools *packBufs for the pure-Go GEMM.
	packs sync.Pool

	// scalarAdamW turns the vector AdamW loop off (tests compare the two).
	scalarAdamW bool

	// peak caches the measured sgemm rate (see PeakFLOPS).
	peakOnce sync.Once
	peak     float64
}

// config holds what New reads from the environment.
type config struct {
	blas    string // GPTUI_BLAS: "" (search), "go", or a library name or path
	threads string // GPTUI_THREADS: "" or a positive integer
}

// New returns a Backend configured from the environment. It never fails:
// when no BLAS library can be loaded it uses the pure-Go GEMM and records why
// in [Backend.FallbackReason].
//
// The thread count is runtime.GOMAXPROCS(0) unless GPTUI_THREADS holds a
// positive integer (other values are ignored). GPTUI_BLAS=go selects the
// pure-Go GEMM; GPTUI_BLAS=<file> loads that library instead of searching
// the usual OpenBLAS locations. When OpenBLAS is loaded, New sets its thread
// count with openblas_set_num_threads; that setting is process-wide, so the
// most recently created Backend decides it.
func New() *Backend {
	return newBackend(config{
		blas:    os.Getenv("GPTUI_BLAS"),
		threads: os.Getenv("GPTUI_THREADS"),
	})
}

// newBackend is New with the environment given as cfg.
func newBackend(cfg config) *Backend {
	b := &Backend{threads: runtime.GOMAXPROCS(0)}
	if n, err := strconv.Atoi(strings.TrimSpace(cfg.threads)); err == nil && n > 0 {
		b.threads = n
	}
	switch spec := strings.TrimSpace(cfg.blas); spec {
	case "go":
		b.fallback = "pure-Go GEMM selected by GPTUI_BLAS=go"
	case "":
		b.blas, b.fallback = findBLAS()
	default:
		lib, err := openBLAS(spec)
		if err != nil {
			b.fallback = fmt.Sprintf("GPTUI_BLAS=%s: %v; using pure-Go GEMM", spec, err)
		}
		b.blas = lib
	}
	if b.blas != nil && b.blas.setThreads != nil {
		b.blas.setThreads(int32(min(b.threads, math.MaxInt32)))
	}
	return b
}

// BLAS describes the GEMM in use: the library kind ("openblas", or "cblas"
// for another library exporting cblas_sgemm) followed by its file, for
// example "openblas /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so"
// (a library found by soname is reported by the file the loader mapped), or
// "pure-go".
func (b *Backend) BLAS() string {
	if b.blas == nil {
		return "pure-go"
	}
	return b.blas.kind + " " + b.blas.path
}

// FallbackReason returns "" when a BLAS library is loaded, and otherwise one
// line saying why the pure-Go GEMM is in use and how to get a faster one.
func (b *Backend) FallbackReason() string {
	if b.blas != nil {
		return ""
	}
	if b.fallback == "" {
		return "pure-Go GEMM (zero Backend)"
	}
	return b.fallback
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
func (b *Backend) Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, bm []float32, ldb int, beta float32, c []float32, ldc int) {
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
	b.sgemmGo(transA, transB, m, n, k, alpha, a, lda, bm, ldb, beta, c, ldc)
}

// blasMinWork is the m·n·k below which Sgemm stays in Go even when a BLAS
// library is loaded. A call through purego costs about 2µs, twice what the
// pure-Go GEMM spends on an 8×8×8 product; the two break even near 12×12×12.
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
		b.Sgemm(false, false, n, n, n, 1, a, n, bm, n, 0, c, n)
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
