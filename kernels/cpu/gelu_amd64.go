package cpu

import "golang.org/x/sys/cpu"

// geluTanhAVX512 runs geluTanh's loop on n elements, n a multiple of 16
// (gelu_amd64.s).
//
//go:noescape
func geluTanhAVX512(th, x *float32, n int, k *[15]float32)

// hasGeluVec enables geluTanhAVX512.
var hasGeluVec = cpu.X86.HasAVX512F

// geluTanhVec does geluTanh on the first len(x) &^ 15 elements with
// AVX-512 and returns how many it did (0 without AVX-512F).
func geluTanhVec(th, x []float32) int {
	n := len(x) &^ 15
	if !hasGeluVec || n == 0 {
		return 0
	}
	k := [15]float32{geluA, geluK, -9, 9, 2, expLog2e, expMagic, expLn2hi, -expLn2lo,
		1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 1.0 / 2, 1}
	geluTanhAVX512(&th[0], &x[0], n, &k)
	return n
}
