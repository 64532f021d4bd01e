package engine

import (
	"context"
	"time"

	"github.com/gptui/gptui/kernels"
)

// One training step, as llm.c's train loop reads: the batch, the forward
// and backward passes of this rank's micro-batches (over which the
// weights hold still: the backend may keep a 16-bit copy of them for its
// GEMMs, copyWeights), the gradients reduced
// across the ranks that share them, the loss and the gradient norm read
// back once, the update. Each parallel dimension takes part through a
// hook of its own file, a no-op where the dimension is not in use:
//
//	pipeline (pipeline.go)      runs the micro-batches' passes in its schedule; sumTied
//	data parallel (dataparallel.go)  hook: starts a block's all-reduce as its gradients complete; finish; sumLoss
//	sharding stage 3 (sharding.go)   gathers the outer tensors for the step; reduces their gradients
//	tensor parallel (tensorparallel.go, sequenceparallel.go) inside the passes
//	context parallel (contextparallel.go) inside the passes, on the rank's rows
//	                                  of each sequence (localRows); its gradients summed with the replicas'
//	the update (update.go)     the norm over the model's ranks, clipping, AdamW, sharding's all-gather

// batch holds a step's global batch of token ids: every rank reads all of
// it and trains on the micro-batches of its data index.
type batch struct {
	inputs, targets []int32 // (G, T)
}

func (tr *Trainer) newBatch() *batch {
	n := tr.Cfg.Global.GlobalBatchSize * tr.T
	return &batch{inputs: make([]int32, n), targets: make([]int32, n)}
}

// trainStep runs one optimizer step at learning rate lr and returns the
// mean loss of the global batch, the gradient norm before clipping and
// the time spent reading data.
//
// Every rank reads the whole global batch and keeps the micro-batches of its
// data index (rank d takes micro-batches d·accum … (d+1)·accum−1), so the
// samples, their order and their dropout masks (DropoutKey.Sample is the
// global sample index) are those of one process training on the whole batch.
func (tr *Trainer) trainStep(ctx context.Context, step int, lr float64, b *batch) (loss, norm float64, reader time.Duration, err error) {
	r0 := time.Now()
	tr.train.Next(b.inputs, b.targets)
	reader = time.Since(r0)
	outer, err := tr.beginStep(ctx)
	if err != nil {
		return 0, 0, reader, err
	}
	drop := tr.copyWeights()
	err = tr.forwardBackward(ctx, step, b)
	drop()
	if err != nil {
		return 0, 0, reader, err
	}
	if err := tr.reduceGrads(ctx, outer); err != nil {
		return 0, 0, reader, err
	}
	loss, sq, err := tr.readSums(ctx)
	if err != nil {
		return 0, 0, reader, err
	}
	if norm, err = tr.update(ctx, sq, float32(lr)); err != nil {
		return loss, norm, reader, err
	}
	// The update runs asynchronously on a GPU: its failures surface here.
	return loss, norm, reader, kernels.Sync(tr.be)
}

// beginStep zeroes the step's sums (its loss and Σ g², added up on the
// device in tr.sums) and the gradients, and returns the pass of the work
// on the tensors outside the blocks that brackets the step: stage 3
// gathers them for the whole step, and its reduced shard, zeroed,
// accumulates the micro-batches.
func (tr *Trainer) beginStep(ctx context.Context) (*pass, error) {
	m := tr.Model
	kernels.Upload(tr.be, tr.sums, []float64{0, 0})
	outer := &pass{ctx: ctx}
	if z := m.stage3; z != nil {
		tr.be.Zero(z.grads) // the unit gradient buffers are zero already
		z.gather(outer, 0)
		return outer, outer.err
	}
	m.ZeroGrad()
	return outer, nil
}

// copyWeights has the backend keep a 16-bit copy of the weights for its
// GEMMs (kernels.CopyWeights) while they hold still — a step's forward and
// backward passes, an evaluation — and returns the function that ends its
// use. Under sharding stage 3 the GEMMs read the weights from the gather
// buffers, which change block by block: no copy.
func (tr *Trainer) copyWeights() (drop func()) {
	if tr.Model.stage3 != nil {
		return func() {}
	}
	kernels.CopyWeights(tr.be, tr.Model.Params)
	return func() { kernels.DropWeights(tr.be) }
}

// forwardBackward runs the forward and backward passes of this rank's
// micro-batches, each adding its mean loss to tr.sums[0]: through the
// pipeline's schedule, or one after another. The last micro-batch's
// backward pass tells data parallelism of each block's finished gradients.
//
// A rank of a context-parallel ring trains on its rows of every sequence
// (cpRows), a (B, T/cp) micro-batch; the gradient's scale is still that
// of the whole sequences' mean loss.
func (tr *Trainer) forwardBackward(ctx context.Context, step int, b *batch) error {
	m, d := tr.Model, tr.topo.DataIndex()
	dscale := 1 / float32(tr.B*tr.T*tr.Accum*tr.topo.Replicas())
	if tr.scaler != nil {
		dscale *= float32(tr.scaler.Scale())
	}
	inputs, targets, T := tr.localRows(b.inputs), tr.localRows(b.targets), tr.T/tr.topo.CP
	bt := tr.B * T
	hook := tr.dp.hook(m)
	if tr.pp != nil {
		return tr.pp.step(ctx, m, step, d*tr.Accum, inputs, targets, tr.B, T, dscale, hook, tr.sums[:1])
	}
	for gm := d * tr.Accum; gm < (d+1)*tr.Accum; gm++ {
		ps := &pass{ctx: ctx, DropoutKey: DropoutKey{Step: step, Sample: gm * tr.B}, train: true, dscale: dscale, loss: tr.sums[:1]}
		if gm == (d+1)*tr.Accum-1 {
			ps.onGrads = hook // the last micro-batch completes each block's gradients
		}
		m.forward(ps, inputs[gm*bt:(gm+1)*bt], targets[gm*bt:(gm+1)*bt], tr.B, T)
		m.backward(ps)
		if ps.err != nil {
			return ps.err
		}
	}
	return nil
}

// localRows are this rank's rows of the sequences of x: all of them, or
// under context parallelism its chunks of each (cpRows).
func (tr *Trainer) localRows(x []int32) []int32 {
	return cpRows(x, tr.T, tr.topo.CP, tr.topo.CPIndex)
}

// reduceGrads completes the gradients: the pipeline's two copies of the
// tied embedding summed, stage 3's outer tensors reduce-scattered, and
// the replicas' gradients all-reduced (or reduce-scattered, sharding).
func (tr *Trainer) reduceGrads(ctx context.Context, outer *pass) error {
	if err := tr.pp.sumTied(ctx, tr.Model); err != nil {
		return err
	}
	if tr.Model.stage3.reduce(outer, 0); outer.err != nil {
		return outer.err
	}
	return tr.dp.finish(ctx, tr.Model)
}

// readSums reads the step's sums back, once: the mean loss of the global
// batch (summed over the replicas, from the last pipeline stage) and this
// rank's Σ g² for the norm.
func (tr *Trainer) readSums(ctx context.Context) (loss, sq float64, err error) {
	tr.gradSquares(tr.sums[1:])
	sums := []float64{0, 0}
	if err := kernels.Download(tr.be, sums, tr.sums); err != nil {
		return 0, 0, err
	}
	loss = sums[0]
	if loss, err = tr.dp.sumLoss(ctx, loss); err != nil {
		return 0, 0, err
	}
	if tr.pp != nil {
		if loss, err = tr.lastStageSum(ctx, loss); err != nil {
			return 0, 0, err
		}
	}
	return loss / float64(tr.Accum*tr.topo.Replicas()), sums[1], nil
}
