package cpu

import (
	"fmt"
	"time"
)

// Name describes the backend in one line: its GEMM library and threads.
func (b *Backend) Name() string {
	return fmt.Sprintf("cpu: %s, %d threads", b.BLAS(), b.Threads())
}

// PeakFLOPS is the rate MFU is measured against on a CPU: this machine's
// own sgemm rate, measured once on first use and cached. It is the best of
// twelve 1024³ products after two warm-ups: a peak is what the machine can
// do, and on a shared machine the best run is the one least disturbed.
func (b *Backend) PeakFLOPS() float64 {
	b.peakOnce.Do(func() {
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
		b.peak = 2 * n * n * n / best.Seconds()
	})
	return b.peak
}
