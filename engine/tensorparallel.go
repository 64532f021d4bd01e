package engine

import (
	"fmt"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/kernels"
)

// tensorParallel is tensor parallelism as a model's passes meet it: the
// hooks of parallel (parallel.go) for a rank's slice of the blocks, split
// as Megatron-LM's 1D scheme splits them (the package doc's "Tensor
// parallel" says what crosses the group and when; the slices each rank
// holds are in PartTensors, their sizes in sliceDims). It is the model's
// layout from the model's construction when its part is a slice
// (Part.MP > 1), and newGroups gives it its communicators; until then,
// and for a part built outside a job, it communicates nothing.
type tensorParallel struct {
	oneProcess                   // the hooks it leaves alone: the blocks' parameters lie in the model's buffers
	g          comm.Communicator // the tensor-parallel group; nil until newGroups
	copies     comm.Communicator // the ranks holding this rank's copies of a Llama's key/value head (copyGroup); nil if none

	rank, size int // this rank's index in the group and the group's size
	vlo        int // vocabulary id of the first row of wte held
	head0, nh  int // the query heads held are head0 … of nh

	// The cross-entropy's exchange buffers for its N rows, allocated at
	// its first pass.
	maxes []float32 // (N) this rank's row maxima, then the global ones
	gmax  []float32 // (size,N) every rank's row maxima
	stats []float64 // (N,2) Σ e^(x−max) and the target's logit

	// embed (N,C) is the ranks' lookups summed in float32, on the
	// embedding's stage: the sum is rounded once into the residual
	// stream, as one process stores its embeddings (under bf16, the
	// stream's activations are bfloat16, and sums stay float32:
	// kernels/activations.go).
	embed []float32
}

// embedFloats is the elements of the embedding's sum buffer (embed) for a
// micro-batch of N rows of width C (the account of it: Trainer.memory).
func embedFloats(N, C int) int { return N * C }

// buf returns *b, allocated from the backend with n float32s if it has
// another size.
func (tp *tensorParallel) buf(b *[]float32, n int) []float32 {
	if len(*b) != n {
		kernels.Free(tp.be, *b)
		*b = kernels.Float32s(tp.be, n)
	}
	return *b
}

// actBuf is buf for activations (kernels.Activations): what a hook
// gathers of them is of their kind.
func (tp *tensorParallel) actBuf(b *[]float32, n int) []float32 {
	if len(*b) != n {
		kernels.Free(tp.be, *b)
		*b = kernels.Activations(tp.be, n)
	}
	return *b
}

// newTensorParallel returns the tensor-parallel layout of part, a slice
// of a model of shape cfg, without communicators.
func newTensorParallel(be kernels.Backend, cfg ModelConfig, part Part) *tensorParallel {
	return &tensorParallel{oneProcess: oneProcess{be}, rank: part.MPRank, size: part.MP,
		vlo: part.MPRank * (cfg.Vp / part.MP), head0: part.MPRank * (cfg.NH / part.MP), nh: cfg.NH}
}

// sliceDims are the sizes of the slice of a block that part holds, a
// tensor-parallel rank's (the whole block for MP = 1), and of its
// vocabulary columns, as PartTensors cuts them: Vpl = Vp/MP rows of the
// padded vocabulary (the logits' columns), the first Vl of them real ids
// (0 for a rank holding only padding).
func sliceDims(cfg ModelConfig, part Part) dims {
	M := part.MP
	vpl := cfg.Vp / M
	vlo := part.MPRank * vpl
	d := dims{Cl: cfg.C / M, NHl: cfg.NH / M, Fl: cfg.F / M, Vl: min(max(cfg.V-vlo, 0), vpl), Vpl: vpl}
	if cfg.llama() {
		// NKV/MP key/value heads each, or, when MP exceeds NKV, the one
		// the rank's query heads share, alike on MP/NKV ranks.
		nkv := cfg.KVHeads()
		d.NKVl, d.kvCopies = nkv/M, 1
		if M > nkv {
			d.NKVl, d.kvCopies = 1, M/nkv
		}
	}
	return d
}

// join gives tp its communicators: the tensor-parallel group of topo and,
// when each of a Llama's key/value heads is held alike by k > 1 ranks,
// the group of its copies.
func (tp *tensorParallel) join(f comm.Fabric, topo Topology, k int) error {
	var err error
	if tp.g, err = f.Communicator("mp", topo.mpGroup()); err != nil {
		return err
	}
	if k > 1 {
		tp.copies, err = f.Communicator("mpkv", topo.copyGroup(k))
	}
	return err
}

// enterTP is f's forward pass: every rank holds x whole.
func (tp *tensorParallel) enterTP(_ *pass, x []float32) []float32 { return x }

// enterTPBackward is f's backward pass: the column-parallel GEMM's input
// gradients are partial sums over the rank's heads or hidden units,
// summed over the group.
func (tp *tensorParallel) enterTPBackward(ps *pass, dx []float32) []float32 {
	tp.allReduce(ps, dx)
	return dx
}

// exitTP is g's forward pass: the row-parallel GEMM's partial sums summed
// over the group.
func (tp *tensorParallel) exitTP(ps *pass, y []float32) []float32 {
	tp.allReduce(ps, y)
	return y
}

// exitTPBackward is g's backward pass: every rank holds dy whole.
func (tp *tensorParallel) exitTPBackward(_ *pass, dy []float32) []float32 { return dy }

// rowBias is a term held whole that a rank adds inside a region (the bias
// of a row-parallel projection, wpe) as this rank adds it: only the first
// rank of the group, so the sum has it once.
func (tp *tensorParallel) rowBias(b []float32) []float32 {
	if tp.rank != 0 {
		return nil
	}
	return b
}

// heads places the rank's query heads among all of them.
func (tp *tensorParallel) heads() (first, total int) { return tp.head0, tp.nh }

// sumKVCopies sums dw over the ranks that hold the same key/value head as
// this one (a Llama's, when mp_degree exceeds the key/value heads), in
// place; nothing without copies.
func (tp *tensorParallel) sumKVCopies(ps *pass, dw []float32) {
	if tp.copies == nil || ps.err != nil {
		return
	}
	if err := tp.copies.AllReduce(ps.ctx, dw); err != nil {
		ps.fail(fmt.Errorf("tensor parallel: summing a key/value head's gradients over its copies: %w", err))
	}
}

// embedForward is the vocabulary-parallel embedding: each rank looks up
// the tokens of its rows of wte (zeros for the others), the first adds
// the positions (wpe, if not nil), and the group sums.
func (tp *tensorParallel) embedForward(ps *pass, out []float32, inputs []int32, wte, wpe []float32, B, T, C int) {
	sum := tp.buf(&tp.embed, embedFloats(B*T, C))
	tp.be.EncoderShardForward(sum, inputs, wte, tp.vlo, tp.rowBias(wpe), B, T, C)
	tp.exitTP(ps, sum)
	tp.be.Copy(out, sum)
}

// embedBackward accumulates the gradients of the rank's rows of wte and,
// on every rank alike, of wpe (if not nil).
func (tp *tensorParallel) embedBackward(ps *pass, dwte, dwpe, dout []float32, inputs []int32, B, T, C int) {
	tp.exitTPBackward(ps, dout)
	tp.be.EncoderShardBackward(dwte, tp.vlo, dwpe, dout, inputs, B, T, C)
}

// crossEntropy is the vocabulary-parallel loss over the rank's ld columns
// of logits (N,ld), the first V of them real (V may be 0: a rank of only
// padding) and the rest padding, which enters no maximum or sum: the group
// agrees on each row's maximum (all-gather of the ranks' maxima), then
// sums Σ e^(x−max) and the target's logit (all-reduce), and each rank
// finishes the losses and, training, the gradient of its columns (0 in
// the padding), as oneProcess.crossEntropy.
func (tp *tensorParallel) crossEntropy(ps *pass, losses, logits []float32, targets []int32, N, V, ld int) {
	be := tp.be
	if len(tp.maxes) < N {
		kernels.Free(be, tp.maxes)
		kernels.Free(be, tp.gmax)
		kernels.Free(be, tp.stats)
		tp.maxes, tp.gmax, tp.stats = kernels.Float32s(be, N), kernels.Float32s(be, N*tp.size), kernels.Float64s(be, 2*N)
	}
	// The head's chunks of rows (classify) use the first N of each.
	maxes, gmax, stats := tp.maxes[:N], tp.gmax[:N*tp.size], tp.stats[:2*N]
	be.ClassifierMax(maxes, logits, N, V, ld)
	tp.allGather(ps, maxes, gmax)
	be.ClassifierGlobalMax(maxes, gmax, N, tp.size)
	be.ClassifierExp(stats, logits, targets, maxes, N, V, ld, tp.vlo)
	tp.allReduce64(ps, stats)
	be.ClassifierFinish(losses, logits, targets, maxes, stats, N, V, ld, tp.vlo, ps.dscale, ps.train)
}

// crossEntropyBytes is the bytes of the cross-entropy's exchange buffers
// for chunks of N rows, as crossEntropy allocates them: the maxima (N) and every
// rank's (size·N) in float32, the sums (2·N) in float64 (the account of
// them: Trainer.memory).
func (tp *tensorParallel) crossEntropyBytes(N int) int64 {
	return 4*int64(N) + 4*int64(N*tp.size) + 8*int64(2*N)
}

// allReduce sums x over the group in place, under ps's context; a failure
// fails ps, and a failed ps communicates no more.
func (tp *tensorParallel) allReduce(ps *pass, x []float32) {
	if tp.g == nil || ps.err != nil {
		return
	}
	if err := tp.g.AllReduce(ps.ctx, x); err != nil {
		ps.fail(fmt.Errorf("tensor parallel: all-reduce: %w", err))
	}
}

// allReduce64 sums x over the group in place, as allReduce.
func (tp *tensorParallel) allReduce64(ps *pass, x []float64) {
	if tp.g == nil || ps.err != nil {
		return
	}
	if err := tp.g.AllReduce64(ps.ctx, x); err != nil {
		ps.fail(fmt.Errorf("tensor parallel: all-reduce: %w", err))
	}
}

// allGather concatenates every rank's in into out, in group order, as
// allReduce.
func (tp *tensorParallel) allGather(ps *pass, in, out []float32) {
	if tp.g == nil || ps.err != nil {
		return
	}
	if err := tp.g.AllGather(ps.ctx, in, out); err != nil {
		ps.fail(fmt.Errorf("tensor parallel: all-gather: %w", err))
	}
}

// copyGroup lists the world ranks of this rank's tensor-parallel group
// that hold the same copies as it, when each block is held by k ranks
// alike: the k consecutive tensor-parallel indices it is among.
func (t Topology) copyGroup(k int) []int {
	first := t.MPIndex / k * k
	return t.group(k, func(i int) int { return t.rankOf(t.DPIndex, t.PPIndex, t.ShardIndex, first+i) })
}
