package cpu

import "math"

// bf16Bits rounds x to bfloat16 as VCVTNEPS2BF16 does and returns its 16
// bits: to nearest, ties to even; a denormal becomes a zero of its sign
// (the instruction reads denormals as zero, and VDPBF16PS would anyway);
// a NaN stays a NaN, made quiet; values past the largest bfloat16 round to
// ±Inf. The bf16 GEMM rounds its operands with it while packing.
func bf16Bits(x float32) uint32 {
	u := math.Float32bits(x)
	switch {
	case u&0x7f800000 == 0: // ±0 and denormals
		return u >> 16 & 0x8000
	case u&0x7fffffff > 0x7f800000: // NaN
		return u>>16 | 0x40
	}
	return (u + 0x7fff + u>>16&1) >> 16
}
