// Package kernels names the compute backends of the gptui engine.
//
// A backend provides the matrix multiply and the per-layer kernels the model
// calls, each layer's forward beside its backward. The CPU backend lives in
// kernels/cpu (a built-in SIMD GEMM in Go assembly, OpenBLAS where it is
// faster or asked for, and goroutine-parallel kernels); the CUDA backend
// lives in kernels/cuda.
package kernels

import (
	"fmt"
	"unsafe"
)

// Backend is the set of operations the GPT engine runs. Tensors are
// row-major float32 (shapes in parentheses, outermost first); B is the
// batch, T the sequence length, C the channels, NH the attention heads,
// Vp the padded vocabulary and N = B·T rows. "Accumulates" means the
// method adds into its gradient outputs (+=); every other output is
// overwritten. Buffers come from [Float32s] and its kin, so that a backend
// whose kernels need their own memory (the GPU's) can address them.
//
// The methods return nothing to the host: on a backend that implements
// [Memory] each one only queues its kernel, which runs later, in call
// order, and what the host needs back (a loss, a norm) is reduced into a
// buffer of the backend (Sum, SumSquares) and read with [Download]. A
// synchronous backend (the CPU's) has finished each kernel when the
// method returns.
//
// Each method's reference is the CPU backend (kernels/cpu), whose doc
// comments give the formulas in full; every backend computes the same
// results to float32 rounding, and draws the same dropout masks.
type Backend interface {
	// Name describes the backend and its GEMM library in one line.
	Name() string
	// PeakFLOPS is the rate MFU is measured against (FLOP/s): the best the
	// backend's matrix multiply reaches, so no step can exceed it.
	PeakFLOPS() float64

	// Sgemm is BLAS's C = alpha·op(A)·op(B) + beta·C, row-major: C (m,n)
	// with row stride ldc, op(A) (m,k), op(B) (k,n); A is stored (k,m)
	// when transA is set and B (n,k) when transB is set. With beta 0, C's
	// previous contents are ignored.
	Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)

	// EncoderForward: out (B,T,C) = wte[inp[b,t]] + wpe[t], for token ids
	// inp (B,T), wte (Vp,C) and wpe (maxT,C).
	EncoderForward(out []float32, inp []int32, wte, wpe []float32, B, T, C int)
	// EncoderBackward accumulates dwte[inp[b,t]] += dout[b,t] and
	// dwpe[t] += dout[b,t]; dout (B,T,C).
	EncoderBackward(dwte, dwpe, dout []float32, inp []int32, B, T, C int)
	// EncoderShardForward is the vocabulary-parallel embedding: wte holds
	// rows vlo… of the token embedding and a token outside them adds zeros;
	// wpe may be nil (no position embedding: another rank adds it).
	EncoderShardForward(out []float32, inp []int32, wte []float32, vlo int, wpe []float32, B, T, C int)
	// EncoderShardBackward accumulates EncoderShardForward's gradients:
	// dwte for the tokens in this rank's rows, dwpe unless it is nil.
	EncoderShardBackward(dwte []float32, vlo int, dwpe, dout []float32, inp []int32, B, T, C int)

	// LayerNormForward normalises each of N rows of C channels:
	// out (N,C) = (inp − mean)·rstd·w + bias, w and bias (C); it keeps
	// mean (N) and rstd (N) for the backward pass.
	LayerNormForward(out, mean, rstd, inp, w, bias []float32, N, C int)
	// LayerNormBackward accumulates dinp (N,C), dw (C) and dbias (C) from
	// dout (N,C) and what the forward pass kept.
	LayerNormBackward(dinp, dw, dbias, dout, inp, w, mean, rstd []float32, N, C int)
	// ResidualLayerNormForward is the residual add fused with the
	// LayerNorm that reads it (llm.c's fused_residual_forward): res (N,C) =
	// x + y, then out, mean and rstd are LayerNormForward's of res, bit
	// for bit on the CPU (to float32 rounding elsewhere). res may alias x
	// or y; out, mean and rstd alias nothing.
	ResidualLayerNormForward(res, out, mean, rstd, x, y, w, bias []float32, N, C int)

	// MatmulForward is a linear layer: out (N,OC) = inp (N,IC)·wᵀ + bias,
	// w (OC,IC) as torch.nn.Linear and llm.c store it, bias (OC) or nil.
	MatmulForward(out, inp, w, bias []float32, N, IC, OC int)
	// MatmulBackward: dinp (N,IC) = dout (N,OC)·w, overwritten (skipped
	// when nil); it accumulates dw (OC,IC) += doutᵀ·inp and dbias (OC) +=
	// the column sums of dout (skipped when nil).
	MatmulBackward(dinp, dw, dbias, dout, inp, w []float32, N, IC, OC int)
	// MatmulGeluForward is GPT-2's fc with its GELU in the GEMM's
	// epilogue (cuBLASLt's GELU_AUX_BIAS): with v = inp·wᵀ + bias, the
	// float32 sum, it stores pre = v (N,OC), for the backward pass, and
	// out = GELU(v) (N,OC), GELU taken of the sum before pre is stored
	// (under bfloat16 activations both are rounded once, from v).
	MatmulGeluForward(out, pre, inp, w, bias []float32, N, IC, OC int)
	// MatmulBackwardGelu is MatmulBackward of the GEMM after a GELU whose
	// input was pre (N,IC), with GELU's backward in the input gradient's
	// epilogue (cuBLASLt's DGELU): dinp = (dout·w) ∘ GELU'(pre), the
	// product in float32 and the derivative of pre alone, rounded once;
	// dw and dbias as MatmulBackward's (inp, GELU's output, is what the
	// GEMM read).
	MatmulBackwardGelu(dinp, dw, dbias, dout, inp, pre, w []float32, N, IC, OC int)

	// AttentionForward is causal multi-head attention over qkv (B,T,3C),
	// queries, keys and values side by side: out (B,T,C), with att the
	// softmax probabilities kept for the backward pass ((B,NH,T,T), or
	// [AttentionFloats] values for a backend that keeps less). Dropout d
	// applies to the probabilities, element indices offset by off.
	AttentionForward(out, att, qkv []float32, B, T, C, NH int, d Dropout, off uint64)
	// AttentionBackward writes dqkv (B,T,3C) from dout (B,T,C) and what the
	// forward pass returned (out and att) and read (qkv), with the same
	// dropout mask.
	AttentionBackward(dqkv, dout, out, qkv, att []float32, B, T, C, NH int, d Dropout, off uint64)
	// AttentionDecode attends one new token per sequence, at position pos,
	// to a key/value cache: q (B,C), kc and vc (B,maxT,C) filled in rows
	// 0…pos; out (B,C). It generates text without re-running the context.
	AttentionDecode(out, q, kc, vc []float32, B, pos, maxT, C, NH int)

	// ---- The Llama family (issue 25): RMSNorm, rotary position
	// embeddings, SwiGLU and grouped-query attention. hd is the head
	// size, NKV the key/value heads (NH a multiple of NKV), F the MLP's
	// intermediate size. ----

	// RMSNormForward normalises each of N rows of C channels by their root
	// mean square, without centring or bias: out (N,C) = inp·rstd·w, w (C),
	// rstd (N) = 1/√(mean(inp²) + eps), kept for the backward pass.
	RMSNormForward(out, rstd, inp, w []float32, N, C int, eps float32)
	// ResidualRMSNormForward is the residual add fused with the RMSNorm
	// that reads it: res (N,C) = x + y, then out and rstd are
	// RMSNormForward's of res, bit for bit on the CPU (to float32
	// rounding elsewhere). res may alias x or y; out and rstd alias
	// nothing.
	ResidualRMSNormForward(res, out, rstd, x, y, w []float32, N, C int, eps float32)
	// RMSNormBackward accumulates dinp (N,C) and dw (C) from dout (N,C)
	// and what the forward pass kept: with n = inp·rstd and dn = dout·w,
	// dinp += rstd·(dn − n·mean(dn·n)) and dw += Σ_rows dout·n.
	RMSNormBackward(dinp, dw, dout, inp, w, rstd []float32, N, C int)

	// RoPEForward applies rotary position embeddings to rows of C channels
	// (B,T,C) whose first heads·hd channels are heads of hd (the query and
	// key heads of a GQA qkv row): the pair (x[i], x[i+hd/2]) of each head,
	// i < hd/2, is rotated by the angle of its position p = pos0+t and
	// frequency i — Hugging Face's rotate_half layout, not Meta's
	// interleaved pairs:
	//	out[i]      = x[i]·cos − x[i+hd/2]·sin
	//	out[i+hd/2] = x[i+hd/2]·cos + x[i]·sin
	// with cos and sin from table (maxT,hd), row p: cos of the hd/2
	// angles, then their sines ([RoPE.Table]); maxT > pos0+T−1. The other
	// channels are copied; out may alias inp.
	RoPEForward(out, inp, table []float32, B, T, C, heads, hd, pos0 int)
	// RoPEBackward is the inverse rotation (the transpose) on the gradient:
	// dinp (B,T,C) from dout, with RoPEForward's arguments; dinp is
	// overwritten and may alias dout.
	RoPEBackward(dinp, dout, table []float32, B, T, C, heads, hd, pos0 int)

	// SwiGLUForward is the gated activation of the Llama MLP on the fused
	// output of its gate and up projections, inp (N,2F): each row holds the
	// gate (F) then the up projection (F). out (N,F) = silu(gate)·up,
	// silu(g) = g·σ(g) = g/(1+e⁻ᵍ).
	SwiGLUForward(out, inp []float32, N, F int)
	// SwiGLUBackward writes dinp (N,2F), overwritten, from dout (N,F) and
	// the forward pass's inp: dgate = dout·up·σ(g)·(1 + g·(1−σ(g))) in the
	// gate half of each row, dup = dout·silu(g) in the up half.
	SwiGLUBackward(dinp, inp, dout []float32, N, F int)

	// GQAForward is causal grouped-query attention: qkv (B,T,(NH+2·NKV)·hd)
	// holds per position NH query heads, then NKV key heads, then NKV
	// value heads, hd channels each; query head h attends with key/value
	// head h/(NH/NKV). out (B,T,NH·hd), and att as AttentionForward's
	// (B,NH,T,T) probabilities of the query heads, or [AttentionFloats]
	// values; dropout as AttentionForward's, per query head. With NKV = NH
	// this is AttentionForward, C = NH·hd.
	GQAForward(out, att, qkv []float32, B, T, NH, NKV, hd int, d Dropout, off uint64)
	// GQABackward writes dqkv (B,T,(NH+2·NKV)·hd), overwritten, from dout
	// (B,T,NH·hd) and what the forward pass returned and read; each
	// key/value head's gradient sums over the query heads of its group.
	GQABackward(dqkv, dout, out, qkv, att []float32, B, T, NH, NKV, hd int, d Dropout, off uint64)
	// GQADecode attends one new token per sequence, at position pos, to a
	// grouped key/value cache: q (B,NH·hd), kc and vc (B,maxT,NKV·hd)
	// filled in rows 0…pos; out (B,NH·hd).
	GQADecode(out, q, kc, vc []float32, B, pos, maxT, NH, NKV, hd int)

	// ---- end of the Llama family ----

	// ---- context parallelism: ring attention. A rank r of cp ranks holds,
	// of each of the B sequences of T tokens, two chunks of c = T/(2·cp)
	// positions, chunk r and chunk 2·cp−1−r, in rows = 2·B·c rows laid out
	// sequence-major (B,2c): row b·2c+half·c+t holds position
	// chunk(half)·c+t of sequence b, chunk(0) = r, chunk(1) = 2·cp−1−r, so
	// each sequence's 2c rows are contiguous (a (B,T/cp) batch whose rows'
	// positions are its chunk r, then its chunk 2·cp−1−r). A key/value
	// block is laid out the same way. Its queries meet every rank's keys and
	// values, one block kv (rows, 2·NKV·hd) per step around the ring (the
	// key heads then the value heads of a row), by an online softmax:
	// stats (rows,NH,2) holds each query row and head's running max m and
	// sum l, lse and delta are (rows,NH). Heads and causality as
	// GQAForward's; no dropout. Summed over the ranks and blocks, the
	// forward and backward passes are GQAForward and GQABackward of the
	// whole sequence, rows permuted. ----

	// RingKV writes kv (rows, 2·NKV·hd) from the key and value heads of
	// qkv (rows, (NH+2·NKV)·hd).
	RingKV(kv, qkv []float32, rows, NH, NKV, hd int)
	// RingAttentionForward folds the key/value block kv of rank kr into
	// the running attention of rank qr's queries (the query heads of qkv):
	// online softmax, out (rows, NH·hd) unnormalised, stats (m, l). first
	// starts the fold (out = 0, m = −Inf, l = 0) before folding kv. A
	// block wholly in the queries' future changes nothing (but first still
	// initialises).
	RingAttentionForward(out, stats, qkv, kv []float32, B, c, NH, NKV, hd, cp, qr, kr int, first bool)
	// RingAttentionFinish divides out by l and writes lse = m + ln l.
	RingAttentionFinish(out, lse, stats []float32, rows, NH, hd int)
	// RingAttentionDelta writes delta = Σ over each head's hd channels of
	// dout·out, dout and out (rows, NH·hd).
	RingAttentionDelta(delta, dout, out []float32, rows, NH, hd int)
	// RingAttentionBackward accumulates, for the key/value block kv of
	// rank kr and rank qr's queries, the queries' gradient into the query
	// part of dqkv (its key/value parts untouched) and the block's key and
	// value gradient into dkv (rows, 2·NKV·hd), as FlashAttention-2's
	// backward: P = exp(S − lse), dV += Pᵀ·dO, dP = dO·Vᵀ,
	// dS = P∘(dP − delta), dQ += scale·dS·K, dK += scale·dSᵀ·Q.
	RingAttentionBackward(dqkv, dkv, dout, qkv, kv, lse, delta []float32, B, c, NH, NKV, hd, cp, qr, kr int)
	// RingKVGrad writes (overwrites) the key and value parts of dqkv from
	// dkv, the block's gradient once it is home.
	RingKVGrad(dqkv, dkv []float32, rows, NH, NKV, hd int)

	// ---- end of context parallelism ----

	// GeluForward applies GELU (GPT-2's tanh approximation) elementwise:
	// out = ½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
	GeluForward(out, inp []float32)
	// GeluBackward writes dinp from dout, the pre-activation inp and the
	// forward output out (all of one length).
	GeluBackward(dinp, inp, out, dout []float32)
	// ResidualForward adds two streams: out = a + c; out may alias a.
	ResidualForward(out, a, c []float32)
	// DropoutForward: out[i] = inp[i]·mask[i]/(1−P), mask element i the one
	// d draws at index off+i; with P 0 it copies. out may alias inp.
	DropoutForward(out, inp []float32, d Dropout, off uint64)
	// DropoutBackward: dinp[i] = dout[i]·mask[i]/(1−P), the forward mask.
	DropoutBackward(dinp, dout []float32, d Dropout, off uint64)

	// CrossEntropy is the fused classifier over logits (N,ld), row
	// stride ld ≥ V, of which the first V columns are the real vocabulary
	// and the rest padding (llm.c's Vp): losses (N) =
	// −log softmax(logits[:, :V])[targets], the padding entering neither
	// the maximum nor the sum, and when grad is set the real columns are
	// overwritten by dscale·(softmax − onehot(targets)) and the padding
	// columns by 0 (so a GEMM backward through them adds nothing). A
	// target outside [0, V), padding included, is read nowhere: kernels/cpu
	// panics, CUDA counts it as ClassifierExp counts a target not held.
	CrossEntropy(losses, logits []float32, targets []int32, N, V, ld int, dscale float32, grad bool)
	// ClassifierMax, ClassifierExp and ClassifierFinish are CrossEntropy in
	// three passes over a vocabulary split between tensor-parallel ranks:
	// logits (N,ld) are this rank's columns, the first V of them real,
	// global ids vlo…vlo+V−1, the other ld−V padding (V may be 0: a rank
	// holding only padding), and the engine sums maxes (N) and stats
	// (N,2) between passes. The padding never enters a maximum or a sum.
	// ClassifierMax writes each row's maximum (−Inf for V 0).
	ClassifierMax(maxes, logits []float32, N, V, ld int)
	// ClassifierGlobalMax reduces the row maxima of the MP ranks,
	// all-gathered as gmax (MP,N), to the global ones: maxes (N) =
	// max over k of gmax[k,:].
	ClassifierGlobalMax(maxes, gmax []float32, N, MP int)
	// ClassifierExp writes each row's partial sum of the real logits'
	// exponentials against the global row maxima, and its target logit (0
	// where the target is not among this rank's real columns), to stats;
	// it writes nothing else (the logits stay as they are, so that under
	// bf16 no exponential is stored rounded before Finish divides it).
	ClassifierExp(stats []float64, logits []float32, targets []int32, maxes []float32, N, V, ld, vlo int)
	// ClassifierFinish writes losses (N) from the summed stats and, when
	// grad is set, turns the real logits into dscale times the loss
	// gradient, dscale·(e^(logit−max)/Σ − onehot(target)), and writes 0
	// over the padding columns.
	ClassifierFinish(losses, logits []float32, targets []int32, maxes []float32, stats []float64, N, V, ld, vlo int, dscale float32, grad bool)

	// AdamW updates params in place from grads, with moments m and v (all
	// of one length), as torch.optim.AdamW does: g = gscale·grad (gscale
	// the clipping factor), m = β1·m + (1−β1)·g, v = β2·v + (1−β2)·g²,
	// p −= lr·(m̂/(√v̂ + ε) + wd·p), bias-corrected for the 1-based step.
	AdamW(params, grads, m, v []float32, lr, beta1, beta2, eps, wd, gscale float32, step int)
	// Sum adds w·Σ x to out[0], a float64 the host reads through
	// [Download]: the sum is
	// accumulated in float64 in an order that depends on len(x) only, not
	// on the number of threads, and multiplied by w once. It reduces on the
	// device what the host needs as one number (the losses of a step).
	Sum(out []float64, x []float32, w float64)
	// SumSquares adds w·Σ x² to out[0], as Sum does (the gradient norm).
	SumSquares(out []float64, x []float32, w float64)
	// Copy sets dst to src, of one length, both in the backend's memory.
	Copy(dst, src []float32)
	// Zero sets every element of x to 0.
	Zero(x []float32)
	// Scale multiplies every element of x by s.
	Scale(x []float32, s float32)
}

// Memory is implemented by backends whose kernels cannot work on ordinary
// Go memory and run asynchronously (the GPU backend). The engine allocates
// every buffer a kernel reads or writes through it.
//
// # The device's memory
//
// The buffers are the device's: on a GPU, device memory (cuMemAlloc),
// which the host cannot address. They are Go slices so that the engine
// can slice them, take their lengths and hand them to kernels, Upload,
// Download and a communicator tied to the stream — none of which touches
// their elements on the host — but the host never reads or writes an
// element itself, not even after Sync: a read or write of a buffer other
// than through Upload and Download faults on a GPU (and on the test
// double kernels/deferred's sealed memory, NewSealed, which models it).
// What the host needs back (a loss, a norm, logits to sample from, the
// weights to save) it downloads; what it has (tokens, weights read from a
// file, a zero) it uploads, or a kernel writes on the device (Copy, Zero,
// Scale).
//
// # Ordering
//
// The backend's kernels run on one stream, in call order, after the
// methods that queue them have returned. Upload and Download are ordered
// on the stream like kernels: a Download returns what the kernels queued
// before it wrote, and an Upload lands after the kernels queued before it
// have read the buffer's old contents. A communicator tied to the stream
// (comm.Stream) is ordered the same way: it waits for the kernels queued
// before an operation, and kernels queued after it see its result. Sync
// waits for every kernel so far and returns the backend's first failure.
type Memory interface {
	// Float32s, Int32s and Float64s return zeroed buffers of the device's
	// memory: the kernels read and write them, the host only through
	// Upload and Download.
	Float32s(n int) []float32
	Int32s(n int) []int32
	Float64s(n int) []float64
	// Free gives back a buffer one of them returned (x is the slice),
	// once the kernels queued before have finished with it.
	Free(x any)
	// Upload copies src, host memory, into dst, a buffer of the backend of
	// the same type ([]float32, []int32 or []float64) and length, ordered
	// after the kernels queued before it: they still see dst's old
	// contents, the kernels queued after it see src's. src may be reused
	// as soon as Upload returns.
	Upload(dst, src any)
	// Download copies src, a buffer of the backend, into dst, host memory
	// of the same type and length, once every kernel queued before it has
	// finished, and returns the backend's first failure, if any.
	Download(dst, src any) error
	// Sync waits until every kernel launched so far has finished and
	// returns the backend's first failure, if any.
	Sync() error
}

// Float32s returns n zeroed float32s the backend's kernels can use: on a
// backend with [Memory], the device's, which the host reads and writes only
// through [Upload] and [Download].
func Float32s(be Backend, n int) []float32 {
	if m, ok := be.(Memory); ok {
		return m.Float32s(n)
	}
	x := make([]float32, n)
	if n > 0 {
		adviseHuge(unsafe.Pointer(&x[0]), uintptr(n)*unsafe.Sizeof(x[0]))
	}
	return x
}

// Int32s returns n zeroed int32s the backend's kernels can use, as
// [Float32s].
func Int32s(be Backend, n int) []int32 {
	if m, ok := be.(Memory); ok {
		return m.Int32s(n)
	}
	x := make([]int32, n)
	if n > 0 {
		adviseHuge(unsafe.Pointer(&x[0]), uintptr(n)*unsafe.Sizeof(x[0]))
	}
	return x
}

// Float64s returns n zeroed float64s the backend's kernels can use, as
// [Float32s].
func Float64s(be Backend, n int) []float64 {
	if m, ok := be.(Memory); ok {
		return m.Float64s(n)
	}
	x := make([]float64, n)
	if n > 0 {
		adviseHuge(unsafe.Pointer(&x[0]), uintptr(n)*unsafe.Sizeof(x[0]))
	}
	return x
}

// Free gives a buffer from Float32s, Int32s or Float64s back to the backend
// (a no-op for Go memory, which the garbage collector reclaims).
func Free(be Backend, x any) {
	if m, ok := be.(Memory); ok {
		m.Free(x)
	}
}

// Sync waits for the backend's kernels (a no-op for backends that compute
// synchronously) and returns the backend's first failure; it does not make
// a device's buffers the host's ([Memory]). Callers in the middle of a pass may ignore it:
// the failure stays and the step's final Sync reports it.
func Sync(be Backend) error {
	if m, ok := be.(Memory); ok {
		return m.Sync()
	}
	return nil
}

// Upload copies src, host memory, into dst, a buffer from Float32s, Int32s
// or Float64s of the same type and length, ordered on be's stream
// ([Memory.Upload]); for a backend that computes synchronously, a copy.
func Upload(be Backend, dst, src any) {
	if m, ok := be.(Memory); ok {
		m.Upload(dst, src)
		return
	}
	copyAny(dst, src)
}

// Download copies src, a buffer of be, into dst, host memory of the same
// type and length, once be's kernels queued before have finished
// ([Memory.Download]), and returns be's first failure.
func Download(be Backend, dst, src any) error {
	if m, ok := be.(Memory); ok {
		return m.Download(dst, src)
	}
	copyAny(dst, src)
	return nil
}

// copyAny copies src into dst, slices of one element type ([]float32,
// []int32 or []float64) and length; it panics on anything else, a
// programmer error.
func copyAny(dst, src any) {
	n := -1
	switch d := dst.(type) {
	case []float32:
		if s, ok := src.([]float32); ok && len(s) == len(d) {
			n = copy(d, s)
		}
	case []int32:
		if s, ok := src.([]int32); ok && len(s) == len(d) {
			n = copy(d, s)
		}
	case []float64:
		if s, ok := src.([]float64); ok && len(s) == len(d) {
			n = copy(d, s)
		}
	}
	if n < 0 {
		panic(fmt.Sprintf("kernels: copying %T into %T: want slices of one element type and length", src, dst))
	}
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
