package cpu

import (
	"fmt"
	"runtime"
	"time"

	"github.com/gptui/gptui/units"
)

// Name describes the backend in one line: its GEMM and threads, for
// example "cpu: built-in avx512, 2 threads" or, with bf16 matmuls,
// "cpu: built-in avx512, matmuls in bf16 (avx512-bf16), 2 threads".
func (b *Backend) Name() string {
	if b.bf16 != nil {
		return fmt.Sprintf("cpu: %s, matmuls in bf16 (%s), %d %s", b.BLAS(), b.bf16.name, b.Threads(), units.Plural(b.Threads(), "thread"))
	}
	return fmt.Sprintf("cpu: %s, %d %s", b.BLAS(), b.Threads(), units.Plural(b.Threads(), "thread"))
}

// PeakFLOPS is the rate MFU is measured against on a CPU, measured once on
// first use and cached: the fastest the GEMM the matmuls use can go on
// this machine's threads.
//
// For the built-in GEMM it is the micro-kernel's own rate, every thread
// running it at once on operands that stay in L1 (best of five rounds of
// about 4 ms): every product the model runs is built from that kernel
// plus packing and memory traffic, so no part of a step, and no MFU, can
// exceed it. With bf16 matmuls it is the bf16 kernel's rate. For a BLAS
// library, whose kernel cannot be called alone, it is the best of twelve
// 1024³ products after two warm-ups. Where Linux's CPU-time clocks can be
// read, each thread's time is its own CPU time, not the wall clock's: on a
// machine shared with other processes, time spent waiting for a core does
// not lower the peak (and so cannot push a later, quieter step's MFU past
// 100%).
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

// busyThreads is how many of the Backend's threads can run at once: its
// thread count, at most the number of CPUs.
func (b *Backend) busyThreads() float64 {
	return float64(min(b.Threads(), runtime.NumCPU()))
}

// kernelPeak runs kern on every thread at once, over one A strip and one B
// strip of kern.kc steps into a private tile, and returns the sum of each
// thread's best rate over five rounds of about 4 ms (scaled down when
// there are more threads than CPUs).
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
	tiles := make([][]float32, threads)
	for t := range tiles {
		tiles[t] = make([]float32, kern.mr*kern.nr)
	}
	call := func(c []float32) { kern.fn(kern.kc, &a[0], &bm[0], &c[0], kern.nr, 1, 0) }
	// Calls per round: about 4 ms, from the time of a few calls.
	t0 := time.Now()
	for range 8 {
		call(tiles[0])
	}
	calls := max(1, int(4*time.Millisecond/max(time.Since(t0)/8, time.Nanosecond)))
	best := make([]float64, threads)
	for range 5 {
		b.ParallelFor(threads, 1, func(lo, hi int) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for t := lo; t < hi; t++ {
				c := tiles[t]
				w0 := time.Now()
				c0, cpuOK := threadCPUTime()
				for range calls {
					call(c)
				}
				d := time.Since(w0)
				if c1, ok := threadCPUTime(); cpuOK && ok && c1 > c0 {
					d = c1 - c0
				}
				best[t] = max(best[t], perCall*float64(calls)/max(d.Seconds(), 1e-9))
			}
		})
	}
	var sum float64
	for _, r := range best {
		sum += r
	}
	return sum * b.busyThreads() / float64(threads)
}

// blasPeak is the best rate of twelve 1024³ products after two warm-ups:
// a peak is what the machine can do, and on a shared machine the best run
// is the one least disturbed. Each product is timed by the process's CPU
// time divided among the threads that can run at once, where that clock
// can be read and is shorter than the wall clock's time.
func (b *Backend) blasPeak() float64 {
	const n = 1024
	a := make([]float32, n*n)
	c := make([]float32, n*n)
	for i := range a {
		a[i] = float32(i%13) * 0.01
	}
	best := time.Duration(1 << 62)
	for r := 0; r < 14; r++ {
		w0 := time.Now()
		c0, cpuOK := processCPUTime()
		b.sgemm(false, false, n, n, n, 1, a, n, a, n, 0, c, n)
		d := time.Since(w0)
		if c1, ok := processCPUTime(); cpuOK && ok {
			d = min(d, time.Duration(float64(c1-c0)/b.busyThreads()))
		}
		if r >= 2 && d > 0 && d < best {
			best = d
		}
	}
	return 2 * n * n * n / best.Seconds()
}
