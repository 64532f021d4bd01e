package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/kernels"
)

// bucketBytes is the size the gradient all-reduce's buckets are cut to:
// Megatron's and PyTorch DDP's default, 25 MiB (a test sets a smaller
// dataParallel.bucketBytes). A single block's slice of one tensor larger
// than that is a bucket of its own.
const bucketBytes = 25 << 20

// dataParallel keeps the replicas' gradients in step: data parallelism,
// and the gradient side of sharding.
//
// Plain data parallel and sharding stage 1 all-reduce the gradients over
// every replica, in buckets of about bucketBytes (gradBuckets), each one
// contiguous range of the flat gradient buffer: one layered tensor's
// slices of consecutive blocks, or neighbouring ranges that complete
// together. A bucket's all-reduce starts (AllReduceAsync) as soon as the
// last micro-batch's backward pass has finished the blocks it holds (the
// pass's onGrads), so communication runs while the blocks below are still
// computing; the embeddings and final LayerNorm, complete only at the end
// of the backward pass, go last, in finish, which then waits for every
// bucket: before the optimizer. An all-reduce is elementwise: each
// element the sum of the replicas' values, however the buckets are cut —
// bit for bit with two replicas; with more, the ring's order of the
// additions (the TCP ring's by the element's place in its bucket, NCCL's
// its own) can move the last bit, the same on every replica.
//
// Sharding stage 2 instead reduce-scatters the whole gradient buffer inside
// the sharding group, so that each rank receives the summed gradients of its
// own shard only, and then all-reduces that shard across the dp group.
// Stage 3 does the reduce-scatter unit by unit during the backward pass
// (sharding.go) and the same all-reduce at the end.
//
// Under Engine.mix_precision.reduce_dtype bf16 the buckets are summed in
// bfloat16 (reduceInBF16): each bucket's gradients are rounded into a
// bfloat16 copy (half) as it is launched, all-reduced there with every sum
// rounded to bfloat16 (comm's AllReduceBF16Async: NCCL's ncclBfloat16,
// half the bytes), and widened back into the float32 gradients once
// waited for, before the optimizer. Sharding stages 2 and 3 reduce-scatter
// in float32 whatever it says: their shard's sum is what the moments read.
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
	pending []inflight        // the buckets' all-reduces launched and not yet waited for
	// Plain data parallel and stage 1: the buckets of the gradient
	// all-reduce, cut to bucketBytes at the first hook or finish, and the
	// buckets holding each local block.
	bucketBytes int
	buckets     []gradBucket
	byBlock     [][]int
	// observe, if not nil, is told of each bucket's all-reduce as it is
	// launched and as it is waited for, in the rank's goroutine: a test's
	// window on the ordering of communication and kernels
	// (dataparallel_test.go). nil in training.
	observe func(bucketEvent)
	// half is the gradients' bfloat16 copy the buckets are all-reduced
	// in, as long as Model.Grads (reduceInBF16); nil: in float32.
	half    []float32
	lo, hi  int       // stages 1 and 2: this rank's chunk of the padded flat buffers
	padded  int       // stages 1 and 2: the flat buffers' length padded to sharding_degree chunks
	spans   [][]Span  // each sharding group member's shard (stage 3: stage3.spans)
	length  int       // the elements of every member's shard, padding included
	grads   []float32 // stages 2 and 3: the reduced gradients of this rank's shard
	scratch []float32 // stages 1 and 2: a chunk-sized buffer for the parameter all-gather
}

func newDataParallel(w *comm.World, f comm.Fabric, topo Topology, m *Model) (*dataParallel, error) {
	d := &dataParallel{topo: topo, bucketBytes: bucketBytes}
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

// gradBucket is one all-reduce of the gradients: a contiguous range of
// the flat buffer whose every element is complete once the backward pass
// has finished local blocks lo … hi (an outer bucket's, the outer
// tensors', only at the end: it is launched by finish).
type gradBucket struct {
	start, end int // [start, end) of Model.Grads
	lo, hi     int // the blocks it waits for; -1 for an outer bucket
	outer      bool

	left     int  // this step: blocks lo … hi not yet finished
	launched bool // this step
}

// inflight is a bucket's all-reduce, launched.
type inflight struct {
	req    comm.Request
	bucket int
}

// bucketEvent is what dataParallel.observe is told: bucket's all-reduce
// launched, or (wait) waited for.
type bucketEvent struct {
	bucket int
	wait   bool
}

// gradBuckets cuts the gradients of tensors ts, of a part holding l
// blocks, into buckets of at most capBytes (or one block's slice of one
// tensor, where that is larger): the blocks' buckets first, in the flat
// layout's order, then the outer tensors'.
//
// The blocks' tensors are layered, block li of tensor t at t.Offset +
// li·size, so the slices of consecutive blocks of one tensor are one
// contiguous range, while a block's slices of different tensors are not.
// Each layered tensor is cut into runs of consecutive blocks, from the top
// (the backward pass finishes the last block first) down, as many blocks
// as fit in capBytes; then neighbouring runs that complete together (the
// same lowest block: a small tensor whole, and the next tensor's lowest
// run) are merged while they fit. The outer tensors' neighbouring ranges
// are merged whatever their size: they are all launched at once.
func gradBuckets(ts []Tensor, l, capBytes int) []gradBucket {
	capN := max(capBytes/4, 1)
	var runs []gradBucket
	for _, t := range ts {
		switch {
		case t.Size == 0:
		case outerTensor(t.Name):
			runs = append(runs, gradBucket{start: t.Offset, end: t.Offset + t.Size, lo: -1, hi: -1, outer: true})
		case l > 0 && t.Size/l > 0:
			n := t.Size / l
			for hi := l - 1; hi >= 0; {
				lo := hi
				for lo > 0 && (hi-lo+2)*n <= capN {
					lo--
				}
				runs = append(runs, gradBucket{start: t.Offset + lo*n, end: t.Offset + (hi+1)*n, lo: lo, hi: hi})
				hi = lo - 1
			}
		}
	}
	slices.SortFunc(runs, func(a, b gradBucket) int { return cmp.Compare(a.start, b.start) })
	var bs []gradBucket
	for _, r := range runs {
		if k := len(bs) - 1; k >= 0 {
			b := &bs[k]
			if b.end == r.start && b.outer == r.outer && (b.outer || b.lo == r.lo && r.end-b.start <= capN) {
				b.end, b.hi = r.end, max(b.hi, r.hi)
				continue
			}
		}
		bs = append(bs, r)
	}
	slices.SortStableFunc(bs, func(a, b gradBucket) int {
		switch {
		case a.outer == b.outer:
			return 0
		case a.outer:
			return 1
		}
		return -1
	})
	return bs
}

// plan cuts the buckets, once.
func (d *dataParallel) plan(m *Model) {
	if d.buckets != nil {
		return
	}
	l := m.numLayers()
	d.buckets = gradBuckets(m.Tensors, l, d.bucketBytes)
	d.byBlock = make([][]int, l)
	for k, b := range d.buckets {
		for li := max(b.lo, 0); li <= b.hi; li++ {
			d.byBlock[li] = append(d.byBlock[li], k)
		}
	}
}

// rearm readies the buckets for a step: none launched, every block to
// come.
func (d *dataParallel) rearm() {
	for k := range d.buckets {
		b := &d.buckets[k]
		b.left, b.launched = b.hi-b.lo+1, false
	}
}

// reduceInBF16 has the buckets summed in bfloat16 (reduce_dtype bf16):
// a no-op without replicas to sum with, and under sharding stages 2 and
// 3, which reduce-scatter in float32.
func (d *dataParallel) reduceInBF16(m *Model) {
	if d == nil || d.topo.Stage >= 2 || d.dp.Size() == 1 || d.half != nil {
		return
	}
	d.half = kernels.Activations(m.be, len(m.Grads))
}

// launch starts bucket k's all-reduce: of its gradients, or of their
// bfloat16 copy (half), rounded into it first.
func (d *dataParallel) launch(m *Model, k int) {
	b := &d.buckets[k]
	b.launched = true
	if d.observe != nil {
		d.observe(bucketEvent{bucket: k})
	}
	g := m.Grads[b.start:b.end]
	if d.half == nil {
		d.pending = append(d.pending, inflight{d.dp.AllReduceAsync(g), k})
		return
	}
	h := d.half[b.start:b.end]
	m.be.Copy(h, g) // rounded to bfloat16
	d.pending = append(d.pending, inflight{d.dp.AllReduceBF16Async(h), k})
}

// hook returns the onGrads of a pass that starts the all-reduce of every
// bucket that block l completes, or nil when the gradients are reduced in
// one piece at the end (stage 2) or unit by unit (stage 3), or there are
// no replicas (d nil). The pass must be the step's last backward pass
// over the blocks.
func (d *dataParallel) hook(m *Model) func(int) {
	if d == nil || d.topo.Stage >= 2 {
		return nil
	}
	d.plan(m)
	d.rearm()
	return func(l int) {
		for _, k := range d.byBlock[l] {
			if b := &d.buckets[k]; !b.launched {
				if b.left--; b.left == 0 {
					d.launch(m, k)
				}
			}
		}
	}
}

// finish completes the gradient reduction after the last backward pass
// (nothing without replicas). Plain data parallel and stage 1 launch the
// outer tensors' buckets (and any the backward pass did not) and wait for
// them all.
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
	d.plan(m)
	for k := range d.buckets {
		if !d.buckets[k].launched {
			d.launch(m, k)
		}
	}
	var errs []error
	for _, p := range d.pending {
		if d.observe != nil {
			d.observe(bucketEvent{bucket: p.bucket, wait: true})
		}
		if err := p.req.Wait(ctx); err != nil {
			errs = append(errs, err)
		} else if d.half != nil {
			b := d.buckets[p.bucket]
			m.be.Copy(m.Grads[b.start:b.end], d.half[b.start:b.end]) // after the all-reduce, on the stream
		}
	}
	d.pending = d.pending[:0]
	d.rearm()
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
