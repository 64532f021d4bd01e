package engine

import (
	"context"
	"fmt"
	"math"
)

// The update: the global gradient norm from each rank's Σ g² (weighted so
// that the ranks of one model count every gradient once), clipping, and
// AdamW on the parameters this rank updates — all of them, or its shard
// under sharding, whose parameters are then all-gathered.

// gradSquares adds to out[0], on the device, the Σ g² of the gradients
// this rank holds for the norm: its shard's reduced gradients under
// sharding stages 2 and 3, else all of its gradients.
func (tr *Trainer) gradSquares(out []float64) {
	m := tr.Model
	if tr.topo.Sharding > 1 && tr.topo.Stage >= 2 {
		m.gradSquares(out, tr.dp.grads, tr.dp.own())
		return
	}
	m.gradSquares(out, m.Grads, []Span{{0, 0, m.NumParams()}})
}

// update clips the gradients to their global norm and applies one AdamW
// step to the parameters this rank updates, given sq, this rank's Σ g²
// (gradSquares). It returns the norm.
func (tr *Trainer) update(ctx context.Context, sq float64, lr float32) (float64, error) {
	if tr.topo.Sharding > 1 {
		return tr.shardedUpdate(ctx, sq, lr)
	}
	m := tr.Model
	sq, err := tr.modelSum(ctx, sq)
	if err != nil {
		return 0, err
	}
	return tr.apply(m.Params, m.Grads, sq, lr), nil
}

// apply runs AdamW on params with grads, the parameters this rank updates
// and their gradients (laid out by Opt.Spans), given the
// global sum of the gradients' squares sq, and returns the global norm of
// the true gradient. Under fp16 the gradients are loss-scaled: the scale
// comes off inside the update, and a non-finite norm skips the step.
func (tr *Trainer) apply(params, grads []float32, sq float64, lr float32) float64 {
	s := tr.scaler.Scale()
	norm := math.Sqrt(sq) / s
	if !tr.scaler.update(norm) {
		tr.log.logf("[amp] gradient overflow at loss scale %g: step skipped, loss scale now %g (skipped steps: %d)", s, tr.scaler.Scale(), tr.scaler.skipped)
		return norm
	}
	tr.Opt.Apply(tr.be, tr.Model, params, grads, tr.Opt.ClipScale(norm)/float32(s), lr)
	return norm
}

// modelSum adds x up over the ranks that hold the parts of one model (the
// tensor- and pipeline-parallel groups).
func (tr *Trainer) modelSum(ctx context.Context, x float64) (float64, error) {
	if tr.modelGroup == nil {
		return x, nil
	}
	return sum64(ctx, tr.modelGroup, x, "model parallel: gradient norm")
}

// gradSquares adds to out[0], on the device, Σ g² over grads, the
// gradients of the parameters spans maps (laid out as a shard's), weighted
// so that summing it over the ranks of the tensor- and pipeline-parallel
// groups counts every gradient of the whole model once: a tensor held
// whole by every rank of the tensor-parallel group counts 1/mp on each,
// and the last pipeline stage's copy of the tied wte, whose gradient
// equals the first stage's, counts 0; a block held alike by k ranks of
// the group (Piece.Copies) counts 1/k on each.
func (m *Model) gradSquares(out []float64, grads []float32, spans []Span) {
	M := m.Part.MP
	tiedCopy := m.Part.Head && !m.Part.Embed
	if M == 1 && !tiedCopy && len(spans) == 1 {
		m.be.SumSquares(out, grads[spans[0].At:spans[0].At+spans[0].N], 1)
		return
	}
	for _, sp := range spans {
		for _, t := range m.Tensors {
			s, e := max(t.Offset, sp.Flat), min(t.Offset+t.Size, sp.Flat+sp.N)
			if s >= e || t.Name == "wte" && tiedCopy {
				continue
			}
			w := 1.0
			if !t.Split {
				w = 1 / float64(M)
			}
			if rs := copyRanges(t); rs != nil {
				for _, r := range rs {
					if a, b := max(s, r.lo), min(e, r.hi); a < b {
						m.be.SumSquares(out, grads[sp.At+a-sp.Flat:sp.At+b-sp.Flat], r.w)
					}
				}
				continue
			}
			m.be.SumSquares(out, grads[sp.At+s-sp.Flat:sp.At+e-sp.Flat], w)
		}
	}
}

// weightedRange is a range [lo, hi) of the flat layout whose gradients
// count w each in the norm.
type weightedRange struct {
	lo, hi int
	w      float64
}

// copyRanges cuts tensor t, split across the tensor-parallel group, into
// ranges of the flat layout weighted 1/Copies by its pieces, adjacent ones
// of one weight merged; nil when no piece has copies.
func copyRanges(t Tensor) []weightedRange {
	has := false
	for _, pc := range t.Pieces {
		has = has || pc.Copies > 1
	}
	if !has {
		return nil
	}
	var rs []weightedRange
	for _, pc := range t.Pieces {
		w := 1 / float64(max(pc.Copies, 1))
		eachRun(t.Shape, pc.Local, pc.Shape, t.Shape, pc.Local, 0, numRuns(pc.Shape), func(k, _, n int) bool {
			lo := t.Offset + k
			if i := len(rs) - 1; i >= 0 && rs[i].hi == lo && rs[i].w == w {
				rs[i].hi += n
			} else {
				rs = append(rs, weightedRange{lo, lo + n, w})
			}
			return true
		})
	}
	return rs
}

// shardedUpdate clips and applies one AdamW step to this rank's shard and
// all-gathers the parameters (the package doc's "Data parallel and
// sharding"), given sq, this rank's Σ g² (Trainer.gradSquares). It returns
// the global gradient norm: that of the full summed gradient, as one
// process would compute it.
func (tr *Trainer) shardedUpdate(ctx context.Context, sq float64, lr float32) (float64, error) {
	d, m := tr.dp, tr.Model
	var params, grads []float32
	switch z := m.stage3; {
	case z != nil:
		params, grads = z.shard, d.grads
	case tr.topo.Stage == 2:
		params, grads = m.Params[d.lo:d.hi], d.grads
	default:
		params, grads = m.Params[d.lo:d.hi], m.Grads[d.lo:d.hi]
	}
	if tr.topo.Stage >= 2 {
		// Each rank summed the squares of its shard.
		var err error
		if sq, err = sum64(ctx, d.shard, sq, "sharding: gradient norm"); err != nil {
			return 0, err
		}
	}
	sq, err := tr.modelSum(ctx, sq)
	if err != nil {
		return 0, err
	}
	norm := tr.apply(params, grads, sq, lr)
	if tr.topo.Stage == 3 {
		return norm, nil // the parameters stay sharded
	}
	return norm, tr.gatherParams(ctx)
}

// gatherParams all-gathers the parameter chunks of the sharding group
// (stages 1 and 2).
func (tr *Trainer) gatherParams(ctx context.Context) error {
	d, m := tr.dp, tr.Model
	full := m.Params[:d.padded]
	m.be.Copy(d.scratch, full[d.lo:d.hi])
	if err := d.shard.AllGather(ctx, d.scratch, full); err != nil {
		return fmt.Errorf("sharding: parameter all-gather: %w", err)
	}
	return nil
}
