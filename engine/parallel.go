package engine

import "github.com/gptui/gptui/kernels"

// parallel is the parallel layout as a model's passes meet it: the one
// interface through which the layers of gpt2.go and llama.go reach the
// parallel dimensions. The layers compute, as llm.c's do, and call these
// hooks at fixed points; each dimension implements the hooks it needs in
// its own file and leaves the others to the one it wraps:
//
//	oneProcess      (this file) a whole model: no communication, the whole vocabulary
//	tensorParallel  (tensorparallel.go) a rank's slice of the blocks: Megatron-LM's
//	                regions, the vocabulary-parallel embedding and loss, the heads
//	                and key/value copies it holds
//	stage3          (sharding.go) wraps either: the blocks' parameters gathered
//	                before their passes, their gradients reduce-scattered after
//
// Model.par is the model's layout; data parallelism and the pipeline work
// between passes (dataparallel.go, pipeline.go) and need no hook.
//
// The fixed points, in Megatron-LM's terms (x a (B,T,C) tensor every rank
// of the group holds whole):
//
//	enterTP          f forward, before a column-parallel GEMM reads x (qkv, fc, the
//	                 head): identity
//	enterTPBackward  f backward, after that GEMM's backward: the partial input
//	                 gradients summed (all-reduce)
//	exitTP           g forward, after a row-parallel GEMM (attproj, fcproj, the
//	                 embedding's lookup): its partial sums summed (all-reduce)
//	exitTPBackward   g backward, before that GEMM's backward: identity
//	rowBias          which rank adds a term held whole inside a region (a
//	                 row-parallel bias, wpe), so that exitTP's sum has it once
//	heads            the query heads held, first … of total (total 0: all of
//	                 them), placing the attention dropout's masks
//	sumKVCopies      a Llama's key/value head held alike by several ranks: its
//	                 weight gradient summed over them
//	embedForward,    the vocabulary-parallel embedding: each rank looks up the
//	embedBackward    tokens of its rows, then exitTP
//	crossEntropy     the vocabulary-parallel loss: the row maxima and the sums of
//	                 the softmax cross the group, never the logits
//	blockBegin,      a block's parameters available before each pass through it
//	blockWeights     (stage 3's all-gather), and where they then lie
//	blockEnd         a block's gradients complete after its backward pass
//	                 (stage 3's reduce-scatter)
//
// The ordering rules every implementation keeps, and the layers may rely on:
//
//  1. Same hooks, same order: the ranks of a group run the same passes
//     over the same layers in the same order (the pipeline's schedule is
//     the same on every rank of a tensor-parallel or sharding group), and
//     call every hook whether or not their slice of it is empty (a rank
//     holding no real vocabulary column still exchanges its maxima), so
//     the collectives pair up by order alone.
//  2. Stream order: a hook is called in program order with the kernels.
//     The buffers it is given were written by kernels queued before it,
//     which may not have run yet (the GPU's one stream, kernels/deferred);
//     its collectives are ordered after them on the backend's stream
//     (NCCL's run on it, the TCP ring waits for it: backendStream), and
//     the kernels queued after it read its result. A hook never reads or
//     writes a buffer from the host, nor syncs.
//  3. In place: a hook's result is left in the buffers it is given, of
//     the backend's memory, their shapes unchanged, and it holds on to
//     none of them once it returns. Buffers of its own (the loss's maxima
//     and sums) it allocates from the backend and reuses.
//  4. Mirrored: the backward pass calls the adjoint of each forward hook
//     at the mirrored point, and blockBegin precedes every pass through a
//     block (its forward, the recompute of RecomputeFull, its backward),
//     blockEnd follows each of its backward passes, before ps.onGrads;
//     the views blockWeights returns are good until the next blockBegin.
//     The tensors outside the blocks are gathered and reduced around the
//     whole step (stage3.gather and reduce of unit 0, step.go).
//  5. Failure: a hook that fails to communicate fails ps (pass.fail); a
//     failed pass communicates no more, its kernels run on, and the
//     caller checks ps.err once the pass is done.
//  6. Numbers: a hook moves sums between ranks, never changes what is
//     summed: every layout computes one process's losses and gradients
//     up to the order of the sums (parallel_test.go's parity matrix).
type parallel interface {
	enterTP(ps *pass, x []float32)
	enterTPBackward(ps *pass, dx []float32)
	exitTP(ps *pass, y []float32)
	exitTPBackward(ps *pass, dy []float32)
	rowBias(b []float32) []float32
	heads() (first, total int)
	sumKVCopies(ps *pass, dw []float32)

	embedForward(ps *pass, out []float32, inputs []int32, wte, wpe []float32, B, T, C int)
	embedBackward(ps *pass, dwte, dwpe, dout []float32, inputs []int32, B, T, C int)
	crossEntropy(ps *pass, losses, logits []float32, targets []int32, N, V int)

	blockBegin(ps *pass, li int)
	blockWeights(li int) (p, g weights, ok bool)
	blockEnd(ps *pass, li int)
}

// newParallel returns the layout of a model's part as it is built, before
// its job's groups join it (newGroups gives tensor parallelism its
// communicators, newStage3 wraps stage 3 around it): one process's, or a
// tensor-parallel rank's, which it returns as tp too.
func newParallel(be kernels.Backend, cfg ModelConfig, part Part) (par parallel, tp *tensorParallel) {
	if part.MP == 1 {
		return oneProcess{be}, nil
	}
	tp = newTensorParallel(be, cfg, part)
	return tp, tp
}

// oneProcess is the layout of a whole model: the regions' hooks do
// nothing, the rank adds every term, holds every head and the whole
// vocabulary, and a block's parameters lie in the model's buffers.
type oneProcess struct{ be kernels.Backend }

func (oneProcess) enterTP(*pass, []float32)                 {}
func (oneProcess) enterTPBackward(*pass, []float32)         {}
func (oneProcess) exitTP(*pass, []float32)                  {}
func (oneProcess) exitTPBackward(*pass, []float32)          {}
func (oneProcess) rowBias(b []float32) []float32            { return b }
func (oneProcess) heads() (first, total int)                { return 0, 0 } // kernels.Dropout: all of them
func (oneProcess) sumKVCopies(*pass, []float32)             {}
func (oneProcess) blockBegin(*pass, int)                    {}
func (oneProcess) blockWeights(int) (p, g weights, ok bool) { return }
func (oneProcess) blockEnd(*pass, int)                      {}

// embedForward writes out (B,T,C) = wte[inputs] + wpe[t], or without
// positions when wpe is nil (a Llama's).
func (o oneProcess) embedForward(_ *pass, out []float32, inputs []int32, wte, wpe []float32, B, T, C int) {
	if wpe == nil {
		o.be.EncoderShardForward(out, inputs, wte, 0, nil, B, T, C)
		return
	}
	o.be.EncoderForward(out, inputs, wte, wpe, B, T, C)
}

// embedBackward accumulates embedForward's gradients into dwte and, if
// not nil, dwpe.
func (o oneProcess) embedBackward(_ *pass, dwte, dwpe, dout []float32, inputs []int32, B, T, C int) {
	if dwpe == nil {
		o.be.EncoderShardBackward(dwte, 0, nil, dout, inputs, B, T, C)
		return
	}
	o.be.EncoderBackward(dwte, dwpe, dout, inputs, B, T, C)
}

// crossEntropy writes the loss of each of the N rows of logits (N,V)
// against targets to losses and, training, leaves the logits' gradient,
// scaled by ps.dscale, in place.
func (o oneProcess) crossEntropy(ps *pass, losses, logits []float32, targets []int32, N, V int) {
	o.be.CrossEntropy(losses, logits, targets, N, V, ps.dscale, ps.train)
}

// The layouts a model's passes may meet.
var (
	_ parallel = oneProcess{}
	_ parallel = (*tensorParallel)(nil)
	_ parallel = (*stage3)(nil)
)
