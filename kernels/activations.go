package kernels

import "math"

// # Activations in 16 bits
//
// Under bf16 mixed precision (Engine.mix_precision.dtype: bf16) the
// engine keeps its activations, and their gradients, in bfloat16, as
// llm.c and Megatron-LM do: the layers' outputs that the next layer reads
// (the residual stream, the norms' outputs, qkv, the attention's output,
// the MLP's pre-activation and activation, the logits) and the gradients
// flowing back through them. It allocates those buffers with
// [Activations]; everything else stays float32:
//
//   - the norms' statistics (mean, rstd), the attention's probabilities
//     or log-sum-exp, the losses: numerics need them;
//   - the outputs of a row-parallel GEMM and the input gradients of a
//     column-parallel one (the branch output before dropout, a region's
//     input gradient), which tensor parallelism sums across ranks: the
//     sum is rounded once, where the kernel after it stores it, whatever
//     the layout, rather than each rank's part;
//   - parameters, their gradients and the optimizer's moments (fp32
//     master weights; the GEMMs read the weights rounded to bf16, and a
//     GEMM whose output is bfloat16 activations reads its bias rounded
//     too: cuBLASLt's bias epilogue reads a bias of its output's type).
//
// A kernel computes in float32 from what it reads, and rounds what it
// stores into such a buffer to the nearest bfloat16, ties to even
// ([RoundBF16]) — an output it accumulates into (+=) is read, added to
// and rounded again. So a buffer of activations only ever holds bfloat16
// values, and the engine, which indexes it as float32s, cannot tell the
// storage apart: a backend may store it in 16 bits (half the memory and
// bandwidth: the GPU's design) or in float32 rounded to bf16 after each
// kernel (the CPU's, and kernels/deferred's, which makes the CPU the
// reference of the GPU's numerics). A backend in fp32 returns ordinary
// float32 buffers.

// ActivationMemory is implemented by backends that store activations in
// bfloat16 (see the section above).
type ActivationMemory interface {
	// Activations returns a zeroed buffer of n activations: indexed and
	// sliced as n float32s by the engine, holding bfloat16 values only.
	Activations(n int) []float32
}

// Activations returns n zeroed activations of be's: bfloat16 values on a
// backend that implements [ActivationMemory] in bf16, float32 otherwise
// ([Float32s]).
func Activations(be Backend, n int) []float32 {
	if a, ok := be.(ActivationMemory); ok {
		return a.Activations(n)
	}
	return Float32s(be, n)
}

// ActivationBytes is the memory each of be's activations takes: 2 on a
// backend that stores them in 16 bits (the GPU's, under bf16), else 4
// (float32s, or the CPU's float32s rounded to bfloat16). The engine's
// account of its memory counts them so.
func ActivationBytes(be Backend) int {
	if a, ok := be.(interface{ ActivationBytes() int }); ok {
		return a.ActivationBytes()
	}
	return 4
}

// RoundBF16 rounds every element of x to the nearest bfloat16, ties to
// even, as CUDA's __float2bfloat16_rn stores it: denormals are kept, a NaN
// stays a NaN, values past the largest bfloat16 become ±Inf.
func RoundBF16(x []float32) {
	for i, v := range x {
		x[i] = roundBF16(v)
	}
}

// roundBF16 is half.F32ToBF16 widened again, without its branches: adding
// 0x7fff plus the lowest kept bit carries into the kept bits exactly when
// the dropped ones are past half, or half with the kept ones odd.
func roundBF16(v float32) float32 {
	u := math.Float32bits(v)
	if u&0x7fffffff > 0x7f800000 { // NaN: quiet, payload's top kept
		return math.Float32frombits((u | 0x400000) &^ 0xffff)
	}
	return math.Float32frombits((u + 0x7fff + u>>16&1) &^ 0xffff)
}
