package engine

import (
	"context"
	"fmt"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/kernels"
)

// gatherShards returns in host memory, laid out by the model's layout, a
// buffer the sharding group holds in shards, own being this rank's (in
// the backend's memory, laid out by its spans): a collective of the
// control plane, by which the tests compare the ranks' weights.
func (tr *Trainer) gatherShards(ctx context.Context, own []float32) ([]float32, error) {
	d := tr.dp
	in := make([]float32, d.length)
	if err := kernels.Download(tr.be, in[:len(own)], own); err != nil {
		return nil, err
	}
	out := make([]float32, len(d.spans)*d.length)
	if err := d.ctl.AllGather(ctx, in, out); err != nil {
		return nil, fmt.Errorf("sharding: gathering the shards for a checkpoint: %w", err)
	}
	full := make([]float32, tr.Model.NumParams())
	for k, spans := range d.spans {
		for _, s := range spans {
			copy(full[s.Flat:s.Flat+s.N], out[k*d.length+s.At:])
		}
	}
	return full, nil
}

// fullParams returns in host memory the parameters of the rank's part of
// the model under stage 3, gathered from the sharding group's shards (a
// collective, for the tests).
func (tr *Trainer) fullParams(ctx context.Context) ([]float32, error) {
	return tr.gatherShards(ctx, tr.Model.stage3.shard)
}

// stage3 shards a model's parameters for sharding stage 3 unit by unit, as
// FSDP shards its flat parameters. A unit is one block, or the tensors
// outside the blocks (wte, wpe, lnf); laid out as its ranges of the flat
// buffer one after another, padded to a multiple of S elements, it is cut
// into S equal pieces, and member k holds piece k of every unit, one after
// another: its shard (spans maps it to the layout). A rank holds its
// shard and the reduced gradients of it for good, in the backend's memory,
// and no whole-model buffer.
//
// A unit's parameters are all-gathered — the members' pieces, in member
// order, are the unit itself — into a reusable gather buffer just before
// the unit is used: a block's for its forward pass, again for its backward
// pass, into the one block buffer (the model's views of a block,
// blockViews, lie in it); the outer tensors into their own buffer, for the
// whole step (the model's views of them, m.p and m.g, lie there). After a
// block's backward pass (after the step for the outer tensors) its
// gradients, accumulated in the matching gradient buffer, are
// reduce-scattered into the unit's parameter buffer, free by then, each
// rank adding its piece's sums to its reduced gradients, and the gradient
// buffer is zeroed. So a rank holds its shard, the outer tensors and one
// block. The update is stage 2's, on the shard.
//
// Its hooks (parallel) are the blocks': blockBegin gathers a block,
// blockWeights says where it lies, blockEnd reduce-scatters its
// gradients; it leaves the others to the layout it wraps (newStage3).
type stage3 struct {
	parallel // the layout it wraps: one process's or tensor parallelism's

	g     comm.Communicator // the sharding group
	be    kernels.Backend
	units []unit    // 0: the tensors outside the blocks; 1+li: local block li
	shard []float32 // this rank's pieces of every unit
	grads []float32 // their reduced gradients (dataParallel.grads)

	outer, gouter []float32 // unit 0's parameters and gradients
	block, gblock []float32 // the block in use: its parameters and gradients
	bp, bg        weights   // views of block and gblock, as blockViews returns them
	held          int       // the unit whose parameters block holds (0: none)
}

// unit is a set of ranges of the flat buffer gathered together.
type unit struct {
	ranges [][2]int
	names  []string // the tensor of each range
	size   int      // the elements of all ranges
	piece  int      // the elements of each member's piece: ⌈size/S⌉
	at     int      // where the pieces lie in every member's shard
}

// views returns the views of buf, u's buffer, as the model's weights:
// each range as its tensor.
func (u *unit) views(buf []float32) weights {
	var ts []Tensor
	at := 0
	for i, r := range u.ranges {
		ts = append(ts, Tensor{Name: u.names[i], Offset: at, Size: r[1] - r[0]})
		at += r[1] - r[0]
	}
	return viewWeights(buf, ts)
}

// newStage3 lays out the units of m, a model without whole buffers
// (newShardedModel), for its sharding group g, allocates the rank's
// buffers, points m's views of the outer tensors at their gather
// buffers (filled by the first gather) and wraps m's layout (m.par). The
// shard is zero until the parameters are initialised or restored
// straight into it.
func newStage3(g comm.Communicator, m *Model) *stage3 {
	S := g.Size()
	z := &stage3{parallel: m.par, g: g, be: m.be}
	var length int
	z.units, length = stage3Units(m.Tensors, m.numLayers(), S)
	z.shard, z.grads = m.floats(length), m.floats(length)
	z.outer, z.gouter = m.floats(S*z.units[0].piece), m.floats(S*z.units[0].piece)
	if len(z.units) > 1 {
		z.block, z.gblock = m.floats(S*z.units[1].piece), m.floats(S*z.units[1].piece)
		z.bp, z.bg = z.units[1].views(z.block), z.units[1].views(z.gblock)
	}
	m.param, m.grad = z.units[0].views(z.outer), z.units[0].views(z.gouter)
	m.par = z
	return z
}

// blockBegin gathers local block li's parameters into the block buffer,
// before each pass through it.
func (z *stage3) blockBegin(ps *pass, li int) { z.gather(ps, 1+li) }

// blockWeights returns the views of local block li's parameters and
// gradients: in the block buffers, which must hold it (blockBegin).
func (z *stage3) blockWeights(li int) (p, g weights, ok bool) {
	if z.held != 1+li {
		panic(fmt.Sprintf("engine: block %d used while the gather buffer holds unit %d", li, z.held))
	}
	return z.bp, z.bg, true
}

// blockEnd reduce-scatters local block li's gradients once its backward
// pass is done.
func (z *stage3) blockEnd(ps *pass, li int) { z.reduce(ps, 1+li) }

// stage3Units lays out the units of a part whose tensors are ts, holding
// l blocks, for a sharding group of S members: the outer tensors, then
// each block. It returns them and the length of every member's shard.
// It allocates nothing of the model, so the engine's account of a rank
// (StartupMemory) uses it too.
func stage3Units(ts []Tensor, l, S int) ([]unit, int) {
	var units []unit
	at := 0
	add := func(ranges [][2]int) {
		u := unit{ranges: ranges, at: at}
		for _, r := range ranges {
			u.size += r[1] - r[0]
			for _, t := range ts {
				if r[0] >= t.Offset && r[0] < t.Offset+t.Size {
					u.names = append(u.names, t.Name)
				}
			}
		}
		u.piece = (u.size + S - 1) / S
		at += u.piece
		units = append(units, u)
	}
	add(globalRanges(ts))
	for li := range l {
		add(layerRanges(ts, l, li))
	}
	return units, at
}

// spans maps member k's shard to the flat layout: its piece of each unit,
// range by range, the padding left out.
func (z *stage3) spans(k int) []Span { return unitSpans(z.units, k) }

// unitSpans maps member k's shard of units to the flat layout.
func unitSpans(units []unit, k int) []Span {
	var out []Span
	for _, u := range units {
		lo, hi := k*u.piece, min((k+1)*u.piece, u.size)
		at := 0
		for _, r := range u.ranges {
			if s, e := max(lo, at), min(hi, at+r[1]-r[0]); s < e {
				out = append(out, Span{At: u.at + s - lo, Flat: r[0] + s - at, N: e - s})
			}
			at += r[1] - r[0]
		}
	}
	return out
}

// bufs are unit i's parameter and gradient buffers.
func (z *stage3) bufs(i int) (p, g []float32) {
	if i == 0 {
		return z.outer, z.gouter
	}
	return z.block, z.gblock
}

// resident is the number of parameter elements the rank holds: its shard
// and the gather buffers of the outer tensors and of one block.
func (z *stage3) resident() int { return len(z.shard) + len(z.outer) + len(z.block) }

// gather all-gathers unit i's parameters into its buffer, under ps's
// context; a failure fails ps, and a failed ps communicates no more.
func (z *stage3) gather(ps *pass, i int) {
	if z == nil || ps.err != nil {
		return
	}
	u, S := &z.units[i], z.g.Size()
	if i > 0 {
		z.held = i
	}
	if u.size == 0 {
		return
	}
	buf, _ := z.bufs(i)
	if err := z.g.AllGather(ps.ctx, z.shard[u.at:u.at+u.piece], buf[:S*u.piece]); err != nil {
		ps.fail(fmt.Errorf("sharding stage 3: gathering parameters: %w", err))
	}
}

// reduce reduce-scatters unit i's gradients, once the unit's last pass
// is done: each member adds the sums of its piece to its reduced
// gradients, the piece landing first in the unit's parameter buffer,
// which the next gather refills. The unit's gradient buffer is then
// zeroed. It communicates as gather.
func (z *stage3) reduce(ps *pass, i int) {
	if z == nil || ps.err != nil {
		return
	}
	u, S := &z.units[i], z.g.Size()
	if u.size == 0 {
		return
	}
	pbuf, gbuf := z.bufs(i)
	if i > 0 {
		z.held = 0
	}
	out := pbuf[:u.piece]
	if err := z.g.ReduceScatter(ps.ctx, gbuf[:S*u.piece], out); err != nil {
		ps.fail(fmt.Errorf("sharding stage 3: reduce-scatter of gradients: %w", err))
		return
	}
	dst := z.grads[u.at : u.at+u.piece]
	z.be.ResidualForward(dst, dst, out)
	z.be.Zero(gbuf)
}
