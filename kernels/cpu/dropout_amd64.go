package cpu

import "golang.org/x/sys/cpu"

// dropoutAVX512 runs dropVec's loop on n elements, n a multiple of 8
// (dropout_amd64.s).
//
//go:noescape
func dropoutAVX512(out, in *float32, n int, key, first, th uint64, scale float32)

// hasDropVec enables dropoutAVX512: 64-bit lane multiplies (AVX512DQ) and
// masks on ymm registers (AVX512VL).
var hasDropVec = cpu.X86.HasAVX512F && cpu.X86.HasAVX512DQ && cpu.X86.HasAVX512VL

// dropVecN is the vector kernel's share of n elements: a multiple of 8,
// or 0 where the CPU has no kernel.
func dropVecN(n int) int {
	if !hasDropVec {
		return 0
	}
	return n &^ 7
}

// dropVec applies dropout to the first n elements with AVX-512, n from
// dropVecN (not 0).
func dropVec(out, in []float32, n int, key, first, th uint64, scale float32) {
	dropoutAVX512(&out[0], &in[0], n, key, first, th, scale)
}
