//go:build !amd64

package cpu

// fp32Kernels lists the fp32 kernels this CPU can run: the pure-Go one.
func fp32Kernels() []*gemmKernel { return []*gemmKernel{kernGo} }

// bf16Kernel returns nil: only amd64 has a bf16 kernel (AVX512_BF16).
func bf16Kernel() (*gemmKernel, string) { return nil, "AVX512_BF16 (an amd64 instruction set)" }

// packRowsVec does nothing where there is no vector version.
func packRowsVec(d []float32, w int, x []float32, ld, p0, kc, c0, n int) (rows, steps int) {
	return 0, 0
}

// packColsVec does nothing where there is no vector version.
func packColsVec(d []float32, w int, x []float32, ld, p0, kc, c0, n int) (cols int) { return 0 }

// packPairsRowsVec does nothing where there is no vector version.
func packPairsRowsVec(d []uint32, w int, x []float32, ld, p0, kc, k, c0, n int) (rows, steps int) {
	return 0, 0
}

// packPairsColsVec does nothing where there is no vector version.
func packPairsColsVec(d []uint32, w int, x []float32, ld, p0, kc, k, c0, n int) (cols, steps int) {
	return 0, 0
}
