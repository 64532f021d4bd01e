package engine

import (
	"context"
	"fmt"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/kernels"
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

// pipeXfer is one point-to-point transfer of the pipeline: the (B,T,C)
// residual stream of micro-batch mb from virtual stage from to virtual
// stage to — activations forward, their gradients (grad) backward.
type pipeXfer struct {
	grad     bool
	mb       int
	from, to int
}

// pipeExchange is what a rank sends and receives between two passes, all
// issued together (one NCCL group): at most one transfer of each kind
// each way — activations and gradients sent, activations and gradients
// received.
type pipeExchange struct {
	sends, recvs []pipeXfer
}

// pipeComms lists the exchanges of stage s's passes ops in a pp-stage
// pipeline of vpp chunks per rank: exchange i comes before pass i and
// exchange len(ops) after the last.
//
// A transfer completes only when both its send and its receive have been
// issued (NCCL's semantics), so what is issued together matters. Each
// pass's output goes with the next pass's input: two neighbours that each
// finished a pass and want the other's next output would otherwise both
// send first and wait forever (1F1B's steady state). The interleaved
// schedule needs more, as Megatron-LM does it: in its steady state a
// forward pass and the backward pass after it run back to back, the
// backward's input received with the forward's and the forward's output
// sent with the backward's. The transfers between two ranks, in each
// direction, come in the same order on the sending and the receiving
// side, so one communicator carries both kinds. TestPipeCommsRendezvous
// proves every schedule runs to its end this way.
func pipeComms(ops []pipeOp, pp, vpp, s int) []pipeExchange {
	nv := pp * vpp
	ex := make([]pipeExchange, len(ops)+1)
	for i, op := range ops {
		v := op.chunk*pp + s
		in, out := &ex[i], &ex[i+1]
		switch {
		case !op.backward && v > 0:
			in.recvs = append(in.recvs, pipeXfer{false, op.mb, v - 1, v})
		case op.backward && v < nv-1:
			in.recvs = append(in.recvs, pipeXfer{true, op.mb, v + 1, v})
		}
		switch {
		case !op.backward && v < nv-1:
			out.sends = append(out.sends, pipeXfer{false, op.mb, v, v + 1})
		case op.backward && v > 0:
			out.sends = append(out.sends, pipeXfer{true, op.mb, v, v - 1})
		}
	}
	if vpp > 1 {
		// Steady state: a forward pass i, then a backward pass, with
		// another such pair before or after (without one, when all the
		// forwards come first, the plain pairing holds).
		for i := 0; i+1 < len(ops); i++ {
			fb := func(j int) bool { return j >= 0 && j+1 < len(ops) && !ops[j].backward && ops[j+1].backward }
			if !fb(i) || !fb(i-2) && !fb(i+2) {
				continue
			}
			mid := &ex[i+1]
			ex[i].recvs = append(ex[i].recvs, mid.recvs...)
			ex[i+2].sends = append(mid.sends, ex[i+2].sends...)
			mid.recvs, mid.sends = nil, nil
		}
	}
	return ex
}

// pipeline runs the schedule of one pipeline rank. Between virtual stages
// flow the (B,T,C) residual stream forward and its gradient backward, point
// to point on one communicator, in the exchanges of pipeComms. The first
// and last stages both hold wte and sum its gradients after the backward
// passes (sumTied), as ColossalAI's PipelineSharedModuleWrapper does —
// unless the model's head is its own (an untied Llama's lm_head).
type pipeline struct {
	topo  Topology
	c     comm.Communicator // the stages: member i is pipeline rank i
	tied  comm.Communicator // first and last stage (the tied wte); nil if they are one rank or untied
	ops   []pipeOp
	ex    []pipeExchange   // ex[i] before ops[i], ex[len(ops)] after the last
	last  int              // the step's last micro-batch
	lc    int              // blocks per chunk
	free  [][]*activations // per chunk: activations of finished micro-batches, for reuse
	done  []finished       // finished since the last exchange, whose outputs it may still send
	dnext []float32        // where a gradient arrives while sc.dresid is still being sent
	swap  bool             // sc.dresid and dnext are swapped

	// split issues each exchange's transfers one at a time, sends first:
	// the defect the rendezvous tests must catch.
	split bool
}

func newPipeline(f comm.Fabric, topo Topology, m *Model, accum int) (*pipeline, error) {
	p := &pipeline{topo: topo, lc: m.numLayers() / topo.VPP, last: accum - 1, free: make([][]*activations, topo.VPP)}
	p.ops = pipeSchedule(topo.Schedule, topo.PP, topo.VPP, topo.PPIndex, accum)
	p.ex = pipeComms(p.ops, topo.PP, topo.VPP, topo.PPIndex)
	var err error
	if p.c, err = f.Communicator("pp", topo.ppGroup()); err != nil {
		return nil, err
	}
	if (m.Part.Embed || m.Part.Head) && m.Cfg.Tied() {
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
// targets) and, on the last stage, adds their mean losses to loss, a
// float64 of the backend's memory. hook, if not nil, is the onGrads of the
// backward passes of the last micro-batch, which complete the gradients of
// the chunks they go through.
func (p *pipeline) step(ctx context.Context, m *Model, step, first int, inputs, targets []int32, B, T int, dscale float32, hook func(int), loss []float64) error {
	nv := p.topo.PP * p.topo.VPP
	live := map[[2]int]*activations{} // by micro-batch and chunk
	bt := B * T
	defer p.restoreGrad(m)
	for i, op := range p.ops {
		v := p.virtual(op.chunk)
		lo, hi := op.chunk*p.lc, (op.chunk+1)*p.lc
		gm := first + op.mb
		ps := &pass{ctx: ctx, DropoutKey: DropoutKey{Step: step, Sample: gm * B}, train: true, dscale: dscale, loss: loss}
		key := [2]int{op.mb, op.chunk}
		if !op.backward {
			a := p.get(m, B, T, op.chunk)
			live[key] = a
			m.stage(a, inputs[gm*bt:(gm+1)*bt], targets[gm*bt:(gm+1)*bt])
		}
		if err := p.exchange(ctx, m, i, live); err != nil {
			return err
		}
		if !op.backward {
			a := live[key]
			if v == 0 {
				m.fam.embedForward(a, ps)
			}
			m.blocksForward(a, lo, hi, ps)
			if v == nv-1 {
				m.fam.headForward(a, ps)
			}
		} else {
			a := live[key]
			if op.mb == p.last {
				ps.onGrads = hook
			}
			if v == nv-1 {
				m.fam.headBackward(a, ps)
			}
			m.blocksBackward(a, lo, hi, ps)
			if v == 0 {
				m.fam.embedBackward(a, ps)
			}
			delete(live, key)
			p.done = append(p.done, finished{a, op.chunk})
		}
		if ps.err != nil {
			return ps.err
		}
	}
	return p.exchange(ctx, m, len(p.ops), live)
}

// exchange runs exchange i of the schedule: the outputs of the passes
// before it, from their activations (live, by micro-batch and chunk) or
// the model's gradient buffer, and the inputs of the passes after it, into
// their activations or p.dnext, which then becomes the gradient buffer.
func (p *pipeline) exchange(ctx context.Context, m *Model, i int, live map[[2]int]*activations) error {
	e := p.ex[i]
	var sends, recvs []comm.Transfer
	gradIn := false
	for _, x := range e.sends {
		buf := m.scratch.dresid
		if !x.grad {
			k := x.from / p.topo.PP
			buf = live[[2]int{x.mb, k}].resid[(k+1)*p.lc]
		}
		sends = append(sends, comm.Transfer{Peer: p.holder(x.to), Buf: buf})
	}
	for _, x := range e.recvs {
		var buf []float32
		if x.grad {
			if len(p.dnext) != len(m.scratch.dresid) {
				kernels.Free(m.be, p.dnext)
				p.dnext = kernels.Activations(m.be, len(m.scratch.dresid)) // as dresid, which it is copied into
			}
			buf, gradIn = p.dnext, true
		} else {
			k := x.to / p.topo.PP
			buf = live[[2]int{x.mb, k}].resid[k*p.lc]
		}
		recvs = append(recvs, comm.Transfer{Peer: p.holder(x.from), Buf: buf})
	}
	var err error
	switch {
	case len(sends)+len(recvs) == 0:
	case p.split:
		for _, x := range sends {
			if err = p.c.Send(ctx, x.Buf, x.Peer); err != nil {
				break
			}
		}
		for _, x := range recvs {
			if err != nil {
				break
			}
			err = p.c.Recv(ctx, x.Buf, x.Peer)
		}
	default:
		err = p.c.Exchange(ctx, sends, recvs)
	}
	if err != nil {
		return fmt.Errorf("pipeline: exchange %d of the schedule (before pass %d of %d): %w", i, i+1, len(p.ops), err)
	}
	if gradIn {
		m.scratch.dresid, p.dnext = p.dnext, m.scratch.dresid
		p.swap = !p.swap
	}
	for k, f := range p.done {
		p.free[f.chunk] = append(p.free[f.chunk], f.a)
		p.done[k] = finished{}
	}
	p.done = p.done[:0]
	return nil
}

// dnextBytes is the bytes of dnext once the schedule has run: a buffer
// of the model's gradient buffer's size (sc.dresid), allocated where an
// exchange receives a gradient — every stage but the last without
// interleaving (the account of it: Trainer.memory).
func (p *pipeline) dnextBytes(m *Model) int64 {
	for _, e := range p.ex {
		for _, x := range e.recvs {
			if x.grad {
				return int64(kernels.ActivationBytes(m.be) * len(m.scratch.dresid)) // as dresid
			}
		}
	}
	return 0
}

// finished are the activations of a pass through local chunk chunk.
type finished struct {
	a     *activations
	chunk int
}

// restoreGrad gives the model back its own gradient buffer (which it
// frees with its scratch), should the step end with the two swapped.
func (p *pipeline) restoreGrad(m *Model) {
	if p.swap {
		m.scratch.dresid, p.dnext = p.dnext, m.scratch.dresid
		p.swap = false
	}
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

// sumTied adds up the tied wte's gradients of the first and last stage
// (nothing without a pipeline, or when one rank holds both).
func (p *pipeline) sumTied(ctx context.Context, m *Model) error {
	if p == nil || p.tied == nil {
		return nil
	}
	if err := p.tied.AllReduce(ctx, m.grad.wte); err != nil {
		return fmt.Errorf("pipeline: summing the tied embedding's gradients: %w", err)
	}
	return nil
}

// evaluate runs the forward pass of one (B,T) batch without dropout
// through every stage and, on the last stage, adds its mean loss to loss,
// a float64 of the backend's memory.
func (p *pipeline) evaluate(ctx context.Context, m *Model, inputs, targets []int32, B, T int, loss []float64) error {
	nv := p.topo.PP * p.topo.VPP
	m.ensureActs(B, T)
	a := m.acts
	m.stage(a, inputs, targets)
	ps := &pass{ctx: ctx, loss: loss}
	for k := 0; k < p.topo.VPP; k++ {
		v := p.virtual(k)
		lo, hi := k*p.lc, (k+1)*p.lc
		if v == 0 {
			m.fam.embedForward(a, ps)
		} else if err := p.c.Recv(ctx, a.resid[lo], p.holder(v-1)); err != nil {
			return fmt.Errorf("pipeline: evaluation: %w", err)
		}
		m.blocksForward(a, lo, hi, ps)
		if v == nv-1 {
			m.fam.headForward(a, ps)
		} else if err := p.c.Send(ctx, a.resid[hi], p.holder(v+1)); err != nil {
			return fmt.Errorf("pipeline: evaluation: %w", err)
		}
	}
	return ps.err
}
