package cpu

import "fmt"

// Name describes the backend in one line: its GEMM library and threads.
func (b *Backend) Name() string {
	return fmt.Sprintf("cpu: %s, %d threads", b.BLAS(), b.Threads())
}

// PeakFLOPS is the rate MFU is measured against on a CPU: this machine's
// own sgemm rate, measured once (square 1024 matrices, median of a few runs)
// on first use and then cached.
func (b *Backend) PeakFLOPS() float64 {
	b.peakOnce.Do(func() { b.peak = b.MeasureSgemmFLOPS(1024) })
	return b.peak
}
