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
//	                and key/value copies it holds; with sequence parallelism
//	                (sequenceparallel.go) the residual stream's rows split over the
//	                group between the regions
//	contextParallel (contextparallel.go) wraps either: the rank's chunks of every
//	                sequence, attention a ring over the ranks' keys and values
//	stage3          (sharding.go) wraps any of them: the blocks' parameters gathered
//	                before their passes, their gradients reduce-scattered after
//
// Model.par is the model's layout; data parallelism and the pipeline work
// between passes (dataparallel.go, pipeline.go) and need no hook.
//
// The fixed points, in Megatron-LM's terms. Between the regions a rank
// holds rows(N) of the N = B·T rows of the residual stream (and of the
// norms' outputs and their gradients): all of them, or under sequence
// parallelism its share; inside a region every rank of the group holds
// all N rows of its columns.
//
//	rows             the rows of the residual stream this rank holds: the first
//	                 and how many (0, N without sequence parallelism)
//	enterTP          f forward, before a column-parallel GEMM reads x (qkv, fc, the
//	                 head), and again in the backward pass before that GEMM's
//	                 backward reads it: x's N rows (x itself, or its rows
//	                 gathered from the group: all-gather)
//	enterTPBackward  f backward, after that GEMM's backward: the partial input
//	                 gradients (N rows) summed, this rank's rows of the sum
//	                 (all-reduce, or reduce-scatter)
//	exitTP           g forward, after a row-parallel GEMM (attproj, fcproj, the
//	                 embedding's lookup): its partial sums (N rows) summed, this
//	                 rank's rows of the sum (all-reduce, or reduce-scatter)
//	exitTPBackward   g backward, before that GEMM's backward: dy's N rows (dy
//	                 itself, or gathered: all-gather)
//	sumRowShared     the gradient of a weight every row of the residual stream
//	                 meets (a norm's), computed from this rank's rows: summed over
//	                 the ranks holding the others (sequence parallelism), in place
//	rowBias          which rank adds a term held whole inside a region (a
//	                 row-parallel bias, wpe), so that exitTP's sum has it once
//	heads            the query heads held, first … of total (total 0: all of
//	                 them), placing the attention dropout's masks
//	sumKVCopies      a Llama's key/value head held alike by several ranks: its
//	                 weight gradient summed over them
//	attention,       the block's causal attention over its (B,T) rows and what it
//	attentionBackward keeps for the backward pass (attentionFloats per layer):
//	                 one process's kernels, or context parallelism's ring, which
//	                 passes the keys and values around its ranks
//	positions        the places in their sequences of a micro-batch's T rows of
//	                 each (nil: 0 … T−1; context parallelism's chunks otherwise)
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
//  3. In place, or its own: a hook's result is left in the buffers it is
//     given, of the backend's memory, or, where its shape differs (the
//     region hooks under sequence parallelism), in a buffer of its own
//     that it returns, good until its next call of the same hook; it holds
//     on to none of the buffers it is given once it returns. Buffers of its
//     own (those, the loss's maxima and sums) it allocates from the backend
//     and reuses.
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
	rows(N int) (first, n int)
	enterTP(ps *pass, x []float32) []float32
	enterTPBackward(ps *pass, dx []float32) []float32
	exitTP(ps *pass, y []float32) []float32
	exitTPBackward(ps *pass, dy []float32) []float32
	sumRowShared(ps *pass, dw []float32)
	rowBias(b []float32) []float32
	heads() (first, total int)
	sumKVCopies(ps *pass, dw []float32)

	attention(ps *pass, out, att, qkv []float32, B, T int, h attnShape, d kernels.Dropout, off uint64)
	attentionBackward(ps *pass, dqkv, dout, out, qkv, att []float32, B, T int, h attnShape, d kernels.Dropout, off uint64)
	attentionFloats(B, T, NH int) int
	positions(T int) []int

	embedForward(ps *pass, out []float32, inputs []int32, wte, wpe []float32, B, T, C int)
	embedBackward(ps *pass, dwte, dwpe, dout []float32, inputs []int32, B, T, C int)
	crossEntropy(ps *pass, losses, logits []float32, targets []int32, N, V, ld int)

	blockBegin(ps *pass, li int)
	blockWeights(li int) (p, g weights, ok bool)
	blockEnd(ps *pass, li int)
}

// attnShape is the shape of a block's attention on a rank: NH query
// heads and NKV key/value heads of hd channels; gqa for a Llama's kernels
// (GQAForward), else GPT-2's (AttentionForward, NKV = NH).
type attnShape struct {
	NH, NKV, hd int
	gqa         bool
}

// newParallel returns the layout of a model's part as it is built, before
// its job's groups join it (newGroups gives tensor and context
// parallelism their communicators, newStage3 wraps stage 3 around it):
// one process's, or a tensor-parallel rank's, which it returns as tp too,
// wrapped by context parallelism's, which it returns as cp.
func newParallel(be kernels.Backend, cfg ModelConfig, part Part) (par parallel, tp *tensorParallel, cp *contextParallel) {
	par = oneProcess{be}
	if part.MP > 1 {
		tp = newTensorParallel(be, cfg, part)
		par = tp
		if part.SP {
			par = &sequenceParallel{tensorParallel: tp}
		}
	}
	if part.CP > 1 {
		cp = newContextParallel(be, par, part.CPRank, part.CP)
		par = cp
	}
	return par, tp, cp
}

// normGrads returns where the gradients of the norms' weights gs (of a
// block, or of the head) accumulate in a backward pass: gs themselves
// when the rank holds every row of the residual stream, else zeroed views
// of the scratch of the same sizes, each from this rank's rows only,
// which addNormGrads then sums over the layout's group and adds to gs —
// after, not before, the micro-batch's backward, so that a sum over the
// group counts each micro-batch once.
func (m *Model) normGrads(gs ...[]float32) [][]float32 {
	if !m.Part.SP {
		return gs
	}
	ns, n := make([][]float32, len(gs)), 0
	for i, g := range gs {
		ns[i] = m.scratch.dnorm[n : n+len(g)]
		n += len(g)
	}
	m.be.Zero(m.scratch.dnorm[:n])
	return ns
}

// lossWeight is the weight of each of a micro-batch's N losses on this
// rank in its mean: 1/N, or, when the ranks of a context-parallel ring
// each hold N of its B·T positions, 1/(N·cp), the ring's sum then being the
// mean.
func (m *Model) lossWeight(N int) float64 { return 1 / float64(N*max(m.Part.CP, 1)) }

// addNormGrads sums the norms' gradients ns that normGrads returned for
// gs over the layout's group (par.sumRowShared) and adds them to gs.
func (m *Model) addNormGrads(ps *pass, ns, gs [][]float32) {
	if !m.Part.SP {
		return
	}
	n := 0
	for _, g := range gs {
		n += len(g)
	}
	m.par.sumRowShared(ps, m.scratch.dnorm[:n])
	for i, g := range gs {
		m.be.ResidualForward(g, g, ns[i])
	}
}

// oneProcess is the layout of a whole model: the regions' hooks do
// nothing, the rank adds every term, holds every head and the whole
// vocabulary, and a block's parameters lie in the model's buffers.
type oneProcess struct{ be kernels.Backend }

func (oneProcess) rows(N int) (first, n int)                       { return 0, N }
func (oneProcess) enterTP(_ *pass, x []float32) []float32          { return x }
func (oneProcess) enterTPBackward(_ *pass, dx []float32) []float32 { return dx }
func (oneProcess) exitTP(_ *pass, y []float32) []float32           { return y }
func (oneProcess) exitTPBackward(_ *pass, dy []float32) []float32  { return dy }
func (oneProcess) sumRowShared(*pass, []float32)                   {}
func (oneProcess) rowBias(b []float32) []float32                   { return b }
func (oneProcess) heads() (first, total int)                       { return 0, 0 } // kernels.Dropout: all of them
func (oneProcess) sumKVCopies(*pass, []float32)                    {}
func (oneProcess) blockBegin(*pass, int)                           {}
func (oneProcess) blockWeights(int) (p, g weights, ok bool)        { return }
func (oneProcess) blockEnd(*pass, int)                             {}
func (oneProcess) positions(int) []int                             { return nil }

// attention is the block's causal attention over whole sequences: out
// (B,T,NH·hd), att what the backend keeps ([kernels.AttentionFloats]).
func (o oneProcess) attention(_ *pass, out, att, qkv []float32, B, T int, h attnShape, d kernels.Dropout, off uint64) {
	if h.gqa {
		o.be.GQAForward(out, att, qkv, B, T, h.NH, h.NKV, h.hd, d, off)
		return
	}
	o.be.AttentionForward(out, att, qkv, B, T, h.NH*h.hd, h.NH, d, off)
}

// attentionBackward overwrites dqkv with attention's input gradient.
func (o oneProcess) attentionBackward(_ *pass, dqkv, dout, out, qkv, att []float32, B, T int, h attnShape, d kernels.Dropout, off uint64) {
	if h.gqa {
		o.be.GQABackward(dqkv, dout, out, qkv, att, B, T, h.NH, h.NKV, h.hd, d, off)
		return
	}
	o.be.AttentionBackward(dqkv, dout, out, qkv, att, B, T, h.NH*h.hd, h.NH, d, off)
}

// attentionFloats is the backend's att of a layer.
func (o oneProcess) attentionFloats(B, T, NH int) int { return kernels.AttentionFloats(o.be, B, NH, T) }

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

// crossEntropy writes the loss of each of the N rows of logits (N,ld),
// the first V columns real and the rest the padded vocabulary's, against
// targets to losses and, training, leaves the logits' gradient, scaled by
// ps.dscale, in place, 0 in the padding.
func (o oneProcess) crossEntropy(ps *pass, losses, logits []float32, targets []int32, N, V, ld int) {
	o.be.CrossEntropy(losses, logits, targets, N, V, ld, ps.dscale, ps.train)
}

// The layouts a model's passes may meet.
var (
	_ parallel = oneProcess{}
	_ parallel = (*tensorParallel)(nil)
	_ parallel = (*sequenceParallel)(nil)
	_ parallel = (*contextParallel)(nil)
	_ parallel = (*stage3)(nil)
)
