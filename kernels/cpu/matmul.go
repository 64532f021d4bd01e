package cpu

import (
	"slices"

	"github.com/gptui/gptui/kernels"
)

// MatmulForward is a linear layer.
//
//	out  (N,OC) = inp (N,IC) · wᵀ + bias
//	w    (OC,IC), as torch.nn.Linear and llm.c store it
//	bias (OC) or nil
//
// With Options.BF16 the product's inputs are rounded to bf16 and it
// accumulates in fp32; the bias is added to the fp32 sum, read as a
// bfloat16 when out is bfloat16 activations (as cuBLASLt's bias epilogue
// reads a bias of its output's type; see kernels/activations.go), and
// the sum is rounded once.
func (b *Backend) MatmulForward(out, inp, w, bias []float32, N, IC, OC int) {
	defer b.store(out)
	b.matmulGemm(false, true, N, OC, IC, inp, IC, w, IC, 0, out, OC)
	b.addBias(out, bias, N, OC)
}

// addBias adds bias (OC), when not nil, to every row of out (N,OC), the
// float32 sums of a GEMM; into bfloat16 activations the bias is read as
// a bfloat16 (MatmulForward).
func (b *Backend) addBias(out, bias []float32, N, OC int) {
	if bias == nil {
		return
	}
	if b.isHalf(out) {
		bias = slices.Clone(bias)
		kernels.RoundBF16(bias)
	}
	b.ParallelFor(N, 16, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			o := out[r*OC : (r+1)*OC]
			for i := range o {
				o[i] += bias[i]
			}
		}
	})
}

// MatmulBackward computes the input gradient (overwritten) and accumulates
// the weight and bias gradients.
//
//	dinp  (N,IC)  = dout (N,OC) · w          (skipped when dinp is nil)
//	dw    (OC,IC) += doutᵀ · inp
//	dbias (OC)    += Σ_rows dout              (skipped when dbias is nil)
//
// With Options.BF16 both products take bf16 inputs and accumulate in fp32
// (into dw's fp32 values); dbias is summed in fp32.
func (b *Backend) MatmulBackward(dinp, dw, dbias, dout, inp, w []float32, N, IC, OC int) {
	defer b.store(dinp, dw, dbias)
	if dinp != nil {
		b.matmulGemm(false, false, N, IC, OC, dout, OC, w, IC, 0, dinp, IC)
	}
	b.matmulGemm(true, false, OC, IC, N, dout, OC, inp, IC, 1, dw, IC)
	if dbias != nil {
		b.ParallelFor(OC, 64, func(lo, hi int) {
			for r := 0; r < N; r++ {
				g := dout[r*OC+lo : r*OC+hi]
				db := dbias[lo:hi]
				for i, v := range g {
					db[i] += v
				}
			}
		})
	}
}
