// Package kernels names the compute backends of the gptui engine.
//
// A backend provides the matrix multiply and the per-layer kernels the model
// calls, each layer's forward beside its backward. The CPU backend lives in
// kernels/cpu (OpenBLAS sgemm loaded at run time, a pure-Go fallback, and
// goroutine-parallel kernels); the CUDA backend will live in kernels/cuda.
package kernels

import "github.com/gptui/gptui/kernels/cpu"

// Backend is the set of operations the GPT engine runs. Shapes are given in
// each method's documentation in kernels/cpu; tensors are row-major float32.
type Backend interface {
	// Name describes the backend and its GEMM library in one line.
	Name() string
	// PeakFLOPS is the rate MFU is measured against (FLOP/s).
	PeakFLOPS() float64

	Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)

	EncoderForward(out []float32, inp []int32, wte, wpe []float32, B, T, C int)
	EncoderBackward(dwte, dwpe, dout []float32, inp []int32, B, T, C int)
	EncoderShardForward(out []float32, inp []int32, wte []float32, vlo int, wpe []float32, B, T, C int)
	EncoderShardBackward(dwte []float32, vlo int, dwpe, dout []float32, inp []int32, B, T, C int)
	LayerNormForward(out, mean, rstd, inp, w, bias []float32, N, C int)
	LayerNormBackward(dinp, dw, dbias, dout, inp, w, mean, rstd []float32, N, C int)
	MatmulForward(out, inp, w, bias []float32, N, IC, OC int)
	MatmulBackward(dinp, dw, dbias, dout, inp, w []float32, N, IC, OC int)
	AttentionForward(out, att, qkv []float32, B, T, C, NH int, d cpu.Dropout, off uint64)
	AttentionBackward(dqkv, dout, qkv, att []float32, B, T, C, NH int, d cpu.Dropout, off uint64)
	AttentionDecode(out, q, kc, vc []float32, B, pos, maxT, C, NH int)
	GeluForward(out, inp []float32)
	GeluBackward(dinp, inp, out, dout []float32)
	ResidualForward(out, a, c []float32)
	DropoutForward(out, inp []float32, d cpu.Dropout, off uint64)
	DropoutBackward(dinp, dout []float32, d cpu.Dropout, off uint64)
	CrossEntropy(losses, logits []float32, targets []int32, N, V int, dscale float32, grad bool)
	ClassifierMax(maxes, logits []float32, N, V int)
	ClassifierExp(stats []float64, logits []float32, targets []int32, maxes []float32, N, V, vlo int)
	ClassifierFinish(losses, logits []float32, targets []int32, maxes []float32, stats []float64, N, V, vlo int, dscale float32, grad bool)
	AdamW(params, grads, m, v []float32, lr, beta1, beta2, eps, wd, gscale float32, step int)
	SumSquares(x []float32) float64
	Zero(x []float32)
	Scale(x []float32, s float32)
}
