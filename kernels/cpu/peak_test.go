package cpu

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
)

// TestPeakBoundsGEMM: the peak MFU divides by is not beaten by a GEMM on
// the same kernel — one thread, a product that fits in cache, timed by the
// thread's CPU time like the peak — for every kernel this CPU has, and for
// bf16. The two are measured in turns, best of three each, so that both see
// the same machine: on a shared virtual machine both can slow down in ways
// no CPU clock of the guest sees.
func TestPeakBoundsGEMM(t *testing.T) {
	type tc struct {
		name string
		be   *Backend
		kern *gemmKernel
	}
	var cases []tc
	for _, k := range fp32Kernels() {
		cases = append(cases, tc{k.name, testBackend(t, config{blas: "go", kernel: k.name, threads: "1"}), k})
	}
	if k, _ := bf16Kernel(); k != nil {
		cases = append(cases, tc{k.name, testBackend(t, config{blas: "go", threads: "1", bf16: true}), k})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			const m, n, k = 64, 96, 256
			r := rand.New(rand.NewPCG(1, 2))
			a, bm, out := randMatrix(r, m*k), randMatrix(r, k*n), make([]float32, m*n)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var peak, best float64
			for range 3 {
				peak = max(peak, c.be.kernelPeak(c.kern))
				w0 := time.Now()
				c0, ok0 := threadCPUTime()
				c.be.matmulGemm(false, false, m, n, k, a, k, bm, n, 0, out, n)
				d := time.Since(w0)
				if c1, ok := threadCPUTime(); ok0 && ok && c1 > c0 {
					d = c1 - c0
				}
				best = max(best, 2*m*n*k/d.Seconds())
			}
			if best > 1.1*peak { // 10% for timing noise: the bug this catches was 3×
				t.Errorf("a %dx%dx%d product ran at %.1f GFLOP/s, above the peak %.1f", m, n, k, best/1e9, peak/1e9)
			}
			t.Logf("peak %.1f GFLOP/s, %dx%dx%d at %.1f (%.0f%%)", peak/1e9, m, n, k, best/1e9, 100*best/peak)
		})
	}
}
