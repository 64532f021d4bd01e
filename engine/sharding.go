package engine

import (
	"context"
	"fmt"
	"math"
)

// Sharding (ZeRO) splits the flat parameter buffer into sharding_degree equal
// shards (padded with zeros to divide evenly); each rank of a sharding group
// keeps the AdamW moments of its shard only and updates only its shard of the
// parameters, then the group all-gathers the updated parameters.
//
//	stage 1: gradients are all-reduced in full; optimizer state is 1/S per rank
//	stage 2: gradients are reduce-scattered, so each rank sums only its shard
//
// The update is the one a single process would make: the global gradient
// norm is the norm of the full summed gradient (stage 2 adds up the shards'
// squares across the group), and each element sees the same AdamW step.

// shardedUpdate clips and applies one AdamW step to this rank's shard and
// all-gathers the parameters. It returns the global gradient norm.
func (tr *Trainer) shardedUpdate(ctx context.Context, lr float32) (float64, error) {
	d, m, be := tr.dp, tr.Model, tr.be
	n := m.NumParams()
	lo, hi := d.shardOf(n)
	var grads []float32
	var sq float64
	if tr.topo.Stage >= 2 {
		grads = d.grads[:hi-lo]
		s := []float64{m.gradSquares(grads, lo)}
		if err := d.shard.AllReduce64(ctx, s); err != nil {
			return 0, fmt.Errorf("sharding: gradient norm: %w", err)
		}
		sq = s[0]
	} else {
		grads = m.Grads[lo:hi]
		sq = m.gradSquares(m.Grads, 0)
	}
	sq, err := tr.modelSum(ctx, sq)
	if err != nil {
		return 0, err
	}
	norm := math.Sqrt(sq)
	tr.Opt.Apply(be, m, grads, tr.Opt.ClipScale(norm), lr)
	return norm, tr.gatherParams(ctx)
}

// gatherParams all-gathers the parameter shards of the sharding group.
func (tr *Trainer) gatherParams(ctx context.Context) error {
	d, m := tr.dp, tr.Model
	copy(d.scratch, m.Params[d.lo:d.hi:d.hi][:len(d.scratch)])
	if err := d.shard.AllGather(ctx, d.scratch, m.Params[:cap(m.Params)]); err != nil {
		return fmt.Errorf("sharding: parameter all-gather: %w", err)
	}
	return nil
}

// fullMoments returns the AdamW moments of every parameter: this rank's own
// when it holds them all, else the sharding group's shards gathered (a
// collective: every member calls it, for a checkpoint).
func (tr *Trainer) fullMoments(ctx context.Context) (mo, vo []float32, err error) {
	n := tr.Model.NumParams()
	if tr.dp == nil || tr.topo.Sharding == 1 {
		return tr.Opt.M, tr.Opt.V, nil
	}
	d := tr.dp
	full := cap(tr.Model.Params)
	gather := func(own []float32) ([]float32, error) {
		in := make([]float32, d.hi-d.lo)
		copy(in, own)
		out := make([]float32, full)
		if err := d.shard.AllGather(ctx, in, out); err != nil {
			return nil, fmt.Errorf("sharding: gathering optimizer state: %w", err)
		}
		return out[:n], nil
	}
	if mo, err = gather(tr.Opt.M); err != nil {
		return nil, nil, err
	}
	vo, err = gather(tr.Opt.V)
	return mo, vo, err
}
