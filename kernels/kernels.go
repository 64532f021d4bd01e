// Package kernels names the compute backends of the gptui engine.
//
// A backend provides the matrix multiply and the per-layer kernels the model
// calls, each layer's forward beside its backward. The CPU backend lives in
// kernels/cpu (OpenBLAS sgemm loaded at run time, a pure-Go fallback, and
// goroutine-parallel kernels); the CUDA backend lives in kernels/cuda.
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
	AttentionBackward(dqkv, dout, out, qkv, att []float32, B, T, C, NH int, d cpu.Dropout, off uint64)
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

// Memory is implemented by backends whose kernels cannot work on ordinary
// Go memory (the GPU backend). The engine allocates every buffer a kernel
// reads or writes through it, and calls Sync before the host reads or
// writes such a buffer: kernels run asynchronously.
type Memory interface {
	// Float32s, Int32s and Float64s return zeroed buffers the kernels and
	// the host can both address.
	Float32s(n int) []float32
	Int32s(n int) []int32
	Float64s(n int) []float64
	// Free gives back a buffer one of them returned (x is the slice).
	Free(x any)
	// Sync waits until every kernel launched so far has finished and
	// returns the backend's first failure, if any.
	Sync() error
}

// Float32s returns n zeroed float32s the backend's kernels can use.
func Float32s(be Backend, n int) []float32 {
	if m, ok := be.(Memory); ok {
		return m.Float32s(n)
	}
	return make([]float32, n)
}

// Int32s returns n zeroed int32s the backend's kernels can use.
func Int32s(be Backend, n int) []int32 {
	if m, ok := be.(Memory); ok {
		return m.Int32s(n)
	}
	return make([]int32, n)
}

// Float64s returns n zeroed float64s the backend's kernels can use.
func Float64s(be Backend, n int) []float64 {
	if m, ok := be.(Memory); ok {
		return m.Float64s(n)
	}
	return make([]float64, n)
}

// Free gives a buffer from Float32s, Int32s or Float64s back to the backend
// (a no-op for Go memory, which the garbage collector reclaims).
func Free(be Backend, x any) {
	if m, ok := be.(Memory); ok {
		m.Free(x)
	}
}

// Sync waits for the backend's kernels before the host touches their
// buffers (a no-op for backends that compute synchronously) and returns the
// backend's first failure. Callers in the middle of a pass may ignore it:
// the failure stays and the step's final Sync reports it.
func Sync(be Backend) error {
	if m, ok := be.(Memory); ok {
		return m.Sync()
	}
	return nil
}

// AttentionStore is implemented by backends whose attention keeps less than
// the (B,NH,T,T) probabilities between the forward and backward passes — a
// flash-style kernel keeps one log-sum-exp per row.
type AttentionStore interface {
	// AttentionFloats is the length of the att buffer AttentionForward
	// and AttentionBackward take for a (B,T) batch of NH heads.
	AttentionFloats(B, NH, T int) int
}

// AttentionFloats is the length of the att buffer be's attention takes.
func AttentionFloats(be Backend, B, NH, T int) int {
	if s, ok := be.(AttentionStore); ok {
		return s.AttentionFloats(B, NH, T)
	}
	return B * NH * T * T
}
