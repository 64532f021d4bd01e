package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/gptui/gptui/comm"
)

// dataParallel keeps the replicas' gradients in step: data parallelism,
// and the gradient side of sharding.
//
// Plain data parallel and sharding stage 1 all-reduce the gradients over
// every replica. The all-reduce of a block's gradients starts as soon as the
// last micro-batch's backward pass has finished that block (the pass's onGrads),
// so communication runs while the blocks below are still computing; each
// tensor of the block is one bucket, and the embeddings and final LayerNorm,
// complete only at the end of the backward pass, go last.
//
// Sharding stage 2 instead reduce-scatters the whole gradient buffer inside
// the sharding group, so that each rank receives the summed gradients of its
// own shard only, and then all-reduces that shard across the dp group.
// Stage 3 does the reduce-scatter unit by unit during the backward pass
// (sharding.go) and the same all-reduce at the end.
//
// Every buffer the communicators are given is the backend's memory; the
// checkpoints' gathering of the shards is the control plane's (ctl, a TCP
// group, in host memory).
type dataParallel struct {
	topo    Topology
	dp      comm.Communicator // every replica of this rank's part of the model
	shard   comm.Communicator // the sharding group (ranks with this dp index)
	dpShard comm.Communicator // ranks holding the same shard
	ctl     *comm.Group       // the sharding group on the control plane; nil without sharding
	pending []comm.Request
	lo, hi  int       // stages 1 and 2: this rank's chunk of the padded flat buffers
	padded  int       // stages 1 and 2: the flat buffers' length padded to sharding_degree chunks
	spans   [][]Span  // each sharding group member's shard (stage 3: stage3.spans)
	length  int       // the elements of every member's shard, padding included
	grads   []float32 // stages 2 and 3: the reduced gradients of this rank's shard
	scratch []float32 // stages 1 and 2: a chunk-sized buffer for the parameter all-gather
}

func newDataParallel(w *comm.World, f comm.Fabric, topo Topology, m *Model) (*dataParallel, error) {
	d := &dataParallel{topo: topo}
	var err error
	if d.dp, err = f.Communicator("dp", topo.replicaGroup()); err != nil {
		return nil, err
	}
	if d.shard, err = f.Communicator("sharding", topo.shardGroup()); err != nil {
		return nil, err
	}
	if d.dpShard, err = f.Communicator("dp-shard", topo.dpGroup()); err != nil {
		return nil, err
	}
	n := m.NumParams()
	d.spans, d.length = [][]Span{{{0, 0, n}}}, n
	if topo.Sharding == 1 {
		return d, nil
	}
	if d.ctl, err = w.NamedGroup("sharding control", topo.shardGroup()); err != nil {
		return nil, err
	}
	S := topo.Sharding
	if topo.Stage == 3 {
		z := newStage3(d.shard, m)
		m.stage3 = z
		d.grads = z.grads
		d.spans, d.length = make([][]Span, S), len(z.shard)
		for k := range S {
			d.spans[k] = z.spans(k)
		}
		return d, nil
	}
	m.padBuffers(S)
	chunk, spans := flatShards(n, S)
	d.padded = S * chunk
	d.lo, d.hi = topo.ShardIndex*chunk, (topo.ShardIndex+1)*chunk
	d.spans, d.length = spans, chunk
	if topo.Stage == 2 {
		d.grads = m.floats(chunk)
	}
	d.scratch = m.floats(chunk)
	return d, nil
}

// flatShards cuts a flat buffer of n elements, padded to a multiple of S,
// into S equal chunks (sharding stages 1 and 2): it returns their length
// and each member's span of the layout (none for a chunk of padding only).
func flatShards(n, S int) (int, [][]Span) {
	chunk := (n + S - 1) / S
	spans := make([][]Span, S)
	for k := range S {
		if lo := k * chunk; lo < n {
			spans[k] = []Span{{0, lo, min(chunk, n-lo)}}
		}
	}
	return chunk, spans
}

// own is this rank's shard: its spans of the flat layout.
func (d *dataParallel) own() []Span { return d.spans[d.topo.ShardIndex] }

// hook returns the onGrads of a pass that starts block l's all-reduce, or nil
// when the gradients are reduced in one piece at the end (stage 2) or
// there are no replicas (d nil).
func (d *dataParallel) hook(m *Model) func(int) {
	if d == nil || d.topo.Stage >= 2 {
		return nil
	}
	return func(l int) {
		for _, r := range m.layerRanges(l) {
			d.pending = append(d.pending, d.dp.AllReduceAsync(m.Grads[r[0]:r[1]]))
		}
	}
}

// finish completes the gradient reduction after the last backward pass
// (nothing without replicas).
func (d *dataParallel) finish(ctx context.Context, m *Model) error {
	if d == nil {
		return nil
	}
	if d.topo.Stage >= 2 {
		if d.topo.Stage == 2 {
			full := m.Grads[:cap(m.Grads)]
			if err := d.shard.ReduceScatter(ctx, full, d.grads); err != nil {
				return fmt.Errorf("sharding: reduce-scatter of gradients: %w", err)
			}
		} // stage 3 reduce-scattered unit by unit
		if d.topo.DP*d.topo.CP > 1 {
			if err := d.dpShard.AllReduce(ctx, d.grads); err != nil {
				return fmt.Errorf("data parallel: all-reduce of gradient shard: %w", err)
			}
		}
		return nil
	}
	for _, r := range m.globalRanges() {
		d.pending = append(d.pending, d.dp.AllReduceAsync(m.Grads[r[0]:r[1]]))
	}
	var errs []error
	for _, p := range d.pending {
		if err := p.Wait(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	d.pending = d.pending[:0]
	if len(errs) > 0 {
		return fmt.Errorf("data parallel: gradient all-reduce: %w", errors.Join(errs...))
	}
	return nil
}

// sumLoss adds up the replicas' loss sums (loss itself without replicas).
func (d *dataParallel) sumLoss(ctx context.Context, loss float64) (float64, error) {
	if d == nil {
		return loss, nil
	}
	return sum64(ctx, d.dp, loss, "data parallel: loss all-reduce")
}

// traffic sums the bytes this rank sent through its groups.
func (d *dataParallel) traffic() map[string]int64 {
	t := map[string]int64{"dp": d.dp.Traffic().SentBytes}
	if d.topo.Sharding > 1 {
		t["dp"] = d.dp.Traffic().SentBytes + d.dpShard.Traffic().SentBytes
		t["sharding"] = d.shard.Traffic().SentBytes
	}
	return t
}
