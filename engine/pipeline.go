package engine

import (
	"context"
	"fmt"

	"github.com/gptui/gptui/comm"
)

// pipeOp is one pass of a schedule: the forward or backward pass of
// micro-batch mb through local chunk chunk.
type pipeOp struct {
	backward bool
	mb       int
	chunk    int
}

// pipeSchedule lists the passes stage s of a pp-stage pipeline with vpp
// chunks per rank runs for m micro-batches, in order:
//
//	gpipe        every forward, then every backward
//	1f1b         pp−s−1 warm-up forwards on stage s, then one forward, one
//	             backward, …, then the remaining backwards: at most pp−s
//	             micro-batches in flight (Megatron, PipeDream-Flush)
//	interleaved  1F1B over virtual stages in Megatron's order: groups of pp
//	             micro-batches go through chunk 0, then chunk 1, …; warm-up
//	             (pp−s−1)·2 + (vpp−1)·pp; the bubble shrinks by vpp
//
// Virtual stage v = k·pp + s is chunk k of pipeline rank s (rank s holds
// chunks s, s+pp, s+2pp, …; with vpp = 1 it is simply stage s). The losses,
// gradients and dropout masks are those of one process: each micro-batch
// keeps its Pass, and the order of the micro-batches' gradient sums is the
// same.
func pipeSchedule(kind string, pp, vpp, s, m int) []pipeOp {
	var ops []pipeOp
	switch {
	case kind == "gpipe":
		for k := 0; k < vpp; k++ {
			for j := 0; j < m; j++ {
				ops = append(ops, pipeOp{false, j, k})
			}
		}
		for k := vpp - 1; k >= 0; k-- {
			for j := 0; j < m; j++ {
				ops = append(ops, pipeOp{true, j, k})
			}
		}
		return ops
	case vpp == 1:
		warm := min(pp-s-1, m)
		for j := 0; j < warm; j++ {
			ops = append(ops, pipeOp{false, j, 0})
		}
		for j := 0; j < m-warm; j++ {
			ops = append(ops, pipeOp{false, warm + j, 0}, pipeOp{true, j, 0})
		}
		for j := m - warm; j < m; j++ {
			ops = append(ops, pipeOp{true, j, 0})
		}
		return ops
	}
	// Interleaved: virtual step i of the forward (backward) order.
	total := m * vpp
	fwd := func(i int) pipeOp {
		return pipeOp{false, i/(pp*vpp)*pp + i%pp, i / pp % vpp}
	}
	bwd := func(i int) pipeOp {
		return pipeOp{true, i/(pp*vpp)*pp + i%pp, vpp - 1 - i/pp%vpp}
	}
	warm := total
	if m != pp {
		warm = min((pp-s-1)*2+(vpp-1)*pp, total)
	}
	for i := 0; i < warm; i++ {
		ops = append(ops, fwd(i))
	}
	for i := 0; i < total-warm; i++ {
		ops = append(ops, fwd(warm+i), bwd(i))
	}
	for i := total - warm; i < total; i++ {
		ops = append(ops, bwd(i))
	}
	return ops
}

// pipeline runs the schedule of one pipeline rank. Between virtual stages
// flow the (B,T,C) residual stream forward and its gradient backward, point
// to point: activations on one communicator and gradients on another, so
// that on each pair of ranks each kind arrives in the order it was sent.
// Sends return once the data is queued, so a schedule that is
// deadlock-free with buffered sends runs as written. The first and last
// stages both hold wte and sum its gradients after the backward passes
// (sumTied), as ColossalAI's PipelineSharedModuleWrapper does.
type pipeline struct {
	topo  Topology
	acts  comm.Communicator // activations, forward: member i is stage i
	grads comm.Communicator // gradients, backward
	tied  comm.Communicator // first and last stage (the tied wte); nil if they are one rank
	ops   []pipeOp
	last  int              // the step's last micro-batch
	lc    int              // blocks per chunk
	free  [][]*activations // per chunk: activations of finished micro-batches, for reuse
}

func newPipeline(f comm.Fabric, topo Topology, m *Model, accum int) (*pipeline, error) {
	p := &pipeline{topo: topo, lc: m.numLayers() / topo.VPP, last: accum - 1, free: make([][]*activations, topo.VPP)}
	p.ops = pipeSchedule(topo.Schedule, topo.PP, topo.VPP, topo.PPIndex, accum)
	var err error
	if p.acts, err = f.Communicator("pp", topo.ppGroup()); err != nil {
		return nil, err
	}
	if p.grads, err = f.Communicator("pp grads", topo.ppGroup()); err != nil {
		return nil, err
	}
	if m.Part.Embed || m.Part.Head {
		pg := topo.ppGroup()
		if p.tied, err = f.Communicator("tied", []int{pg[0], pg[len(pg)-1]}); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// activationBytes is the most activation memory the schedule keeps at once
// for (B,T) micro-batches: each (micro-batch, chunk) holds its chunk's
// activations from its forward to its backward pass.
func (p *pipeline) activationBytes(m *Model, B, T int) int64 {
	size := make([]int64, p.topo.VPP)
	for k := range size {
		a := p.get(m, B, T, k)
		size[k] = int64(a.stored)
		p.free[k] = append(p.free[k], a)
	}
	var live, most int64
	for _, op := range p.ops {
		if op.backward {
			live -= size[op.chunk]
		} else {
			live += size[op.chunk]
			most = max(most, live)
		}
	}
	return most
}

// virtual is the virtual stage of local chunk k.
func (p *pipeline) virtual(k int) int { return k*p.topo.PP + p.topo.PPIndex }

// holder is the pipeline member that holds virtual stage v.
func (p *pipeline) holder(v int) int { return v % p.topo.PP }

// step runs the forward and backward passes of this rank's micro-batches
// (micro-batch j is micro-batch first+j of the global batch in inputs and
// targets) and returns the sum of their mean losses on the last stage, 0 on the
// others. hook, if not nil, is the onGrads of the backward passes of the
// last micro-batch, which complete the gradients of the chunks they go
// through.
func (p *pipeline) step(ctx context.Context, m *Model, step, first int, inputs, targets []int32, B, T int, dscale float32, hook func(int)) (float64, error) {
	nv := p.topo.PP * p.topo.VPP
	live := map[[2]int]*activations{} // by micro-batch and chunk
	bt := B * T
	var loss float64
	for _, op := range p.ops {
		v := p.virtual(op.chunk)
		lo, hi := op.chunk*p.lc, (op.chunk+1)*p.lc
		gm := first + op.mb
		ps := &pass{ctx: ctx, Pass: Pass{Step: step, Sample: gm * B}, train: true, dscale: dscale}
		key := [2]int{op.mb, op.chunk}
		if !op.backward {
			a := p.get(m, B, T, op.chunk)
			live[key] = a
			copy(a.inputs, inputs[gm*bt:(gm+1)*bt])
			copy(a.targets, targets[gm*bt:(gm+1)*bt])
			if v == 0 {
				m.embedForward(a, ps)
			} else if err := p.acts.Recv(ctx, a.resid[lo], p.holder(v-1)); err != nil {
				return 0, fmt.Errorf("pipeline: receiving activations of micro-batch %d: %w", op.mb, err)
			}
			m.blocksForward(a, lo, hi, ps)
			if v == nv-1 {
				loss += m.headForward(a, ps) / float64(bt)
			} else if err := p.acts.Send(ctx, a.resid[hi], p.holder(v+1)); err != nil {
				return 0, fmt.Errorf("pipeline: sending activations of micro-batch %d: %w", op.mb, err)
			}
		} else {
			a := live[key]
			if op.mb == p.last {
				ps.onGrads = hook
			}
			if v == nv-1 {
				m.headBackward(a, ps)
			} else if err := p.grads.Recv(ctx, m.sc.dresid, p.holder(v+1)); err != nil {
				return 0, fmt.Errorf("pipeline: receiving gradients of micro-batch %d: %w", op.mb, err)
			}
			m.blocksBackward(a, lo, hi, ps)
			if v == 0 {
				m.embedBackward(a, ps)
			} else if err := p.grads.Send(ctx, m.sc.dresid, p.holder(v-1)); err != nil {
				return 0, fmt.Errorf("pipeline: sending gradients of micro-batch %d: %w", op.mb, err)
			}
			delete(live, key)
			p.free[op.chunk] = append(p.free[op.chunk], a)
		}
		if ps.err != nil {
			return 0, ps.err
		}
	}
	return loss, nil
}

// get returns activations for a (B,T) micro-batch through local chunk k,
// reusing freed ones.
func (p *pipeline) get(m *Model, B, T, k int) *activations {
	for len(p.free[k]) > 0 {
		a := p.free[k][len(p.free[k])-1]
		p.free[k] = p.free[k][:len(p.free[k])-1]
		if a.B == B && a.T == T {
			return a
		}
	}
	return m.newActivations(B, T, k*p.lc, (k+1)*p.lc)
}

// sumTied adds up the tied wte's gradients of the first and last stage.
func (p *pipeline) sumTied(ctx context.Context, m *Model) error {
	if p.tied == nil {
		return nil
	}
	if err := p.tied.AllReduce(ctx, m.g.wte); err != nil {
		return fmt.Errorf("pipeline: summing the tied embedding's gradients: %w", err)
	}
	return nil
}

// evaluate runs the forward pass of one (B,T) batch without dropout
// through every stage and returns the sum of its losses on the last stage,
// 0 on the others.
func (p *pipeline) evaluate(ctx context.Context, m *Model, inputs, targets []int32, B, T int) (float64, error) {
	nv := p.topo.PP * p.topo.VPP
	m.ensureActs(B, T)
	a := m.acts
	copy(a.inputs, inputs)
	copy(a.targets, targets)
	var loss float64
	ps := &pass{ctx: ctx}
	for k := 0; k < p.topo.VPP; k++ {
		v := p.virtual(k)
		lo, hi := k*p.lc, (k+1)*p.lc
		if v == 0 {
			m.embedForward(a, ps)
		} else if err := p.acts.Recv(ctx, a.resid[lo], p.holder(v-1)); err != nil {
			return 0, fmt.Errorf("pipeline: evaluation: %w", err)
		}
		m.blocksForward(a, lo, hi, ps)
		if v == nv-1 {
			loss = m.headForward(a, ps)
		} else if err := p.acts.Send(ctx, a.resid[hi], p.holder(v+1)); err != nil {
			return 0, fmt.Errorf("pipeline: evaluation: %w", err)
		}
	}
	return loss, ps.err
}
