package cpu

import (
	"golang.org/x/sys/cpu"

	"github.com/gptui/gptui/kernels"
)

// dropoutAVX512 runs dropVec's loop on n elements, n a multiple of 8
// (dropout_amd64.s).
//
//go:noescape
func dropoutAVX512(out, in *float32, n int, key, first, th uint64, scale float32)

// hasDropVec enables dropoutAVX512: 64-bit lane multiplies (AVX512DQ) and
// masks on ymm registers (AVX512VL).
var hasDropVec = cpu.X86.HasAVX512F && cpu.X86.HasAVX512DQ && cpu.X86.HasAVX512VL

// dropVec applies d to the first len(in) &^ 7 elements with AVX-512
// (out at least as long as in) and returns how many it did: 0 without
// AVX-512F, DQ and VL, or for a P outside (0, 1).
func dropVec(d kernels.Dropout, out, in []float32, first uint64) int {
	n := len(in) &^ 7
	if !hasDropVec || n == 0 || !(d.P > 0 && d.P < 1) {
		return 0
	}
	dropoutAVX512(&out[0], &in[0], n, d.Key, first, keepThreshold(d.P), d.Scale())
	return n
}
