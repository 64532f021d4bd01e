package cpu

import (
	"fmt"
	"time"
)

// Name describes the backend in one line: its GEMM and threads, for
// example "cpu: built-in avx512, 2 threads" or, with bf16 matmuls,
// "cpu: built-in avx512, matmuls in bf16 (avx512-bf16), 2 threads".
func (b *Backend) Name() string {
	if b.bf16 != nil {
		return fmt.Sprintf("cpu: %s, matmuls in bf16 (%s), %d threads", b.BLAS(), b.bf16.name, b.Threads())
	}
	return fmt.Sprintf("cpu: %s, %d threads", b.BLAS(), b.Threads())
}

// PeakFLOPS is the rate MFU is measured against on a CPU, measured once on
// first use and cached: the fastest the GEMM the matmuls use can go on
// this machine's threads.
//
// For the built-in GEMM it is the micro-kernel's own rate, every thread
// running it at once on operands that stay in L1 (best of five 20 ms
// rounds): every product the model runs is built from that kernel plus
// packing and memory traffic, so no part of a step, and no MFU, can exceed
// it. With bf16 matmuls it is the bf16 kernel's rate. For a BLAS library,
// whose kernel cannot be called alone, it is the best of twelve 1024³
// products after two warm-ups.
func (b *Backend) PeakFLOPS() float64 {
	b.peakOnce.Do(func() {
		switch {
		case b.bf16 != nil:
			b.peak = b.kernelPeak(b.bf16)
		case b.blas != nil:
			b.peak = b.blasPeak()
		default:
			b.peak = b.kernelPeak(b.kernel())
		}
	})
	return b.peak
}

// kernelPeak runs kern on every thread at once, over one A strip and one B
// strip of kern.kc steps into a private tile, and returns the best rate of
// five rounds of about 20 ms.
func (b *Backend) kernelPeak(kern *gemmKernel) float64 {
	threads := b.Threads()
	a := make([]float32, kern.mr*kern.kc)
	bm := make([]float32, kern.nr*kern.kc)
	for i := range a {
		a[i] = float32(i%13) * 0.01
	}
	for i := range bm {
		bm[i] = float32(i%7) * 0.01
	}
	perCall := 2 * float64(kern.mr*kern.nr*kern.kc)
	if kern.bf16 {
		perCall *= 2 // a step is a pair
	}
	// calls per round: about 20 ms at 100 GFLOP/s, at least one.
	calls := max(1, int(2e9/perCall))
	tiles := make([][]float32, threads)
	for t := range tiles {
		tiles[t] = make([]float32, kern.mr*kern.nr)
	}
	best := time.Duration(1 << 62)
	for range 5 {
		t0 := time.Now()
		b.ParallelFor(threads, 1, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				c := tiles[t]
				for range calls {
					kern.fn(kern.kc, &a[0], &bm[0], &c[0], kern.nr, 1, 0)
				}
			}
		})
		best = min(best, time.Since(t0))
	}
	return perCall * float64(calls) * float64(threads) / max(best.Seconds(), 1e-9)
}

// blasPeak is the best rate of twelve 1024³ products after two warm-ups:
// a peak is what the machine can do, and on a shared machine the best run
// is the one least disturbed.
func (b *Backend) blasPeak() float64 {
	const n = 1024
	a := make([]float32, n*n)
	c := make([]float32, n*n)
	for i := range a {
		a[i] = float32(i%13) * 0.01
	}
	best := time.Duration(1 << 62)
	for r := 0; r < 14; r++ {
		t0 := time.Now()
		b.Sgemm(false, false, n, n, n, 1, a, n, a, n, 0, c, n)
		if d := time.Since(t0); r >= 2 && d < best {
			best = d
		}
	}
	return 2 * n * n * n / best.Seconds()
}
