package engine

import (
	"context"
	"fmt"

	"github.com/gptui/gptui/comm"
)

// shardedUpdate clips and applies one AdamW step to this rank's shard and
// all-gathers the parameters (the package doc's "Data parallel and
// sharding"). It returns the global gradient norm: that of the full summed
// gradient, as one process would compute it.
func (tr *Trainer) shardedUpdate(ctx context.Context, lr float32) (float64, error) {
	d, m := tr.dp, tr.Model
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
	norm := tr.apply(grads, sq, lr)
	if tr.topo.Stage == 3 {
		return norm, nil // the parameters stay sharded
	}
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

// zero3 gathers and releases a model's units for sharding stage 3, which
// also shards the parameters. A rank keeps its shard of the flat buffer
// [lo, hi) for good; the parameters of a unit — one block, or the tensors
// outside the blocks (wte, wpe, lnf) — are all-gathered into the model's
// buffer just before the unit is used and given back right after: a block's for its forward pass, again for its backward pass
// (whose gradients are then reduce-scattered, each rank adding its shard's
// sums to its reduced gradients), the outer tensors for the whole step.
// The model's Params and Grads are anonymous mappings whose pages are
// returned to the system when a unit is released, so a rank holds its
// shard plus the outer tensors and one block at a time. The update and the
// checkpoints are stage 2's, on the same shards.
type zero3 struct {
	g       comm.Communicator // the sharding group
	rank    int               // this rank's place in it
	lo, hi  []int             // each member's chunk of the padded flat buffer
	units   []unit            // 0: the tensors outside the blocks; 1+li: local block li
	grads   []float32         // this rank's reduced gradients of Params[lo:hi] (dataParallel.grads)
	in, out []float32         // packing buffers
}

// unit is a set of ranges of the flat buffer gathered together.
type unit struct {
	ranges [][2]int
	segs   [][][2]int // per member: the ranges' parts in its chunk
	width  int        // the most elements any member holds of the unit
}

func newZero3(g comm.Communicator, m *Model, chunk int, grads []float32) *zero3 {
	S := g.Size()
	z := &zero3{g: g, rank: g.Rank(), lo: make([]int, S), hi: make([]int, S), grads: grads}
	for k := range S {
		z.lo[k], z.hi[k] = k*chunk, (k+1)*chunk
	}
	add := func(ranges [][2]int) {
		u := unit{ranges: ranges, segs: make([][][2]int, S)}
		for k := range S {
			n := 0
			for _, r := range ranges {
				if s, e := max(r[0], z.lo[k]), min(r[1], z.hi[k]); s < e {
					u.segs[k] = append(u.segs[k], [2]int{s, e})
					n += e - s
				}
			}
			u.width = max(u.width, n)
		}
		z.units = append(z.units, u)
	}
	add(m.globalRanges())
	for li := range m.numLayers() {
		add(m.layerRanges(li))
	}
	most := 0
	for _, u := range z.units {
		most = max(most, u.width)
	}
	z.in, z.out = make([]float32, S*most), make([]float32, S*most)
	return z
}

// unitSize is the element count of unit i.
func (z *zero3) unitSize(i int) int {
	n := 0
	for _, r := range z.units[i].ranges {
		n += r[1] - r[0]
	}
	return n
}

// gather all-gathers unit i's parameters into m.Params, under ps's
// context; a failure fails ps, and a failed ps communicates no more.
func (z *zero3) gather(ps *pass, m *Model, i int) {
	if z == nil || ps.err != nil {
		return
	}
	u, S := &z.units[i], z.g.Size()
	if u.width == 0 {
		return
	}
	in, out := z.in[:u.width], z.out[:S*u.width]
	n := 0
	for _, s := range u.segs[z.rank] {
		n += copy(in[n:], m.Params[s[0]:s[1]])
	}
	clear(in[n:])
	if err := z.g.AllGather(ps.ctx, in, out); err != nil {
		ps.fail(fmt.Errorf("sharding stage 3: gathering parameters: %w", err))
		return
	}
	for k := range S {
		if k == z.rank {
			continue
		}
		n := k * u.width
		for _, s := range u.segs[k] {
			n += copy(m.Params[s[0]:s[1]], out[n:])
		}
	}
}

// drop gives back the memory of unit i's parameters outside this rank's
// shard.
func (z *zero3) drop(m *Model, i int) {
	if z == nil {
		return
	}
	lo, hi := z.lo[z.rank], z.hi[z.rank]
	for _, r := range z.units[i].ranges {
		if r[0] < lo {
			release(m.Params[r[0]:min(r[1], lo)])
		}
		if r[1] > hi {
			release(m.Params[max(r[0], hi):r[1]])
		}
	}
}

// reduce reduce-scatters unit i's gradients: each member adds the sums of
// its shard's elements to its reduced gradients. The unit's gradients in
// m.Grads are then zeroed and their memory given back. It communicates as
// gather.
func (z *zero3) reduce(ps *pass, m *Model, i int) {
	if z == nil || ps.err != nil {
		return
	}
	u, S := &z.units[i], z.g.Size()
	if u.width == 0 {
		return
	}
	in, out := z.in[:S*u.width], z.out[:u.width]
	for k := range S {
		n := k * u.width
		for _, s := range u.segs[k] {
			n += copy(in[n:], m.Grads[s[0]:s[1]])
		}
		clear(in[n : (k+1)*u.width])
	}
	if err := z.g.ReduceScatter(ps.ctx, in, out); err != nil {
		ps.fail(fmt.Errorf("sharding stage 3: reduce-scatter of gradients: %w", err))
		return
	}
	n, lo := 0, z.lo[z.rank]
	for _, s := range u.segs[z.rank] {
		dst := z.grads[s[0]-lo : s[1]-lo]
		for j := range dst {
			dst[j] += out[n+j]
		}
		n += s[1] - s[0]
	}
	for _, r := range u.ranges {
		clear(m.Grads[r[0]:r[1]])
		release(m.Grads[r[0]:r[1]])
	}
}

// gatherAll all-gathers every unit (for a checkpoint) under ctx; dropAll
// gives them back.
func (z *zero3) gatherAll(ctx context.Context, m *Model) error {
	ps := &pass{ctx: ctx}
	for i := range z.units {
		z.gather(ps, m, i)
	}
	return ps.err
}

func (z *zero3) dropAll(m *Model) {
	if z == nil {
		return
	}
	for i := range z.units {
		z.drop(m, i)
	}
}
