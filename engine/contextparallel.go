package engine

import (
	"fmt"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/kernels"
)

// contextParallel is context parallelism (Distributed.cp_degree) as a
// model's passes meet it: each sequence of T tokens is cut into 2·cp
// chunks of c = T/(2·cp) positions and rank r of the ring holds two of
// them, chunk r and chunk 2·cp−1−r, so that under the causal mask every
// rank has the same work (Megatron-Core's and torchtitan's load
// balancing). A rank's B·T/cp rows are a (B, 2c) micro-batch, each
// sequence's chunk r then its chunk 2·cp−1−r (cpRows cuts them from the
// batch); everything but attention works on rows alone and runs on them
// unchanged, with the positions of the rows (positions: wpe's rows here,
// a Llama's rotary table in ensureRope).
//
// Attention is the ring's (kernels.Backend's Ring* kernels): the rank's
// queries fold in every rank's keys and values, one block per step, by
// FlashAttention's online softmax, the blocks passed to the next rank of
// the ring while the next one arrives from the previous; the forward pass
// keeps one log-sum-exp per row and head (att), not the probabilities.
// The backward pass passes the blocks around again, each with the
// gradient of its keys and values, which is home after cp steps.
//
// The ring's ranks hold the same parameters and train on the same samples:
// their gradients, each from its rows, are summed with the replicas'
// (Topology.replicaGroup and dpGroup include them), and each rank's losses
// are weighed by 1/(B·T), not 1/(B·T/cp) (lossWeight), so that the sum is
// the mean. Dropout is refused (presets): the masks would need the rows'
// places in the dropout streams.
//
// It wraps the layout of the rank's slice (one process's, tensor
// parallelism's), whose hooks it leaves alone but attention's and the
// embedding's; stage 3 wraps it in turn.
type contextParallel struct {
	parallel                   // the layout it wraps
	be         kernels.Backend //
	g          comm.Communicator
	rank, size int

	// The ring's buffers, sized at first use: two key/value blocks and
	// their gradients (one computed with, one arriving), the online
	// softmax's running max and sum, backward's Σ dout·out, the float32
	// sums the ring folds its steps into (the attention's output and qkv's
	// gradient: out and dqkv may be bfloat16 activations, which would round
	// every step), and the rank's rows of wpe and of its gradient.
	kv, dkv      [2][]float32
	stats, delta []float32
	acc, dacc    []float32
	wpe, dwpe    []float32
}

// newContextParallel wraps inner for rank of a ring of size ranks.
func newContextParallel(be kernels.Backend, inner parallel, rank, size int) *contextParallel {
	return &contextParallel{parallel: inner, be: be, rank: rank, size: size}
}

// join gives cp its ring: the context-parallel group of topo.
func (cp *contextParallel) join(f comm.Fabric, topo Topology) error {
	var err error
	cp.g, err = f.Communicator("cp", topo.cpGroup())
	return err
}

// chunk is the chunk of each sequence that half (0 or 1) of rank r's rows
// holds.
func (cp *contextParallel) chunk(r, half int) int {
	if half == 0 {
		return r
	}
	return 2*cp.size - 1 - r
}

// positions are the places in its sequence of each of the rank's T rows
// of one (T = 2c): chunk rank's c positions, then chunk 2·cp−1−rank's.
func (cp *contextParallel) positions(T int) []int {
	c := T / 2
	pos := make([]int, T)
	for j := range pos {
		pos[j] = cp.chunk(cp.rank, j/c)*c + j%c
	}
	return pos
}

// attentionFloats is the ring's att: one log-sum-exp per row and head.
func (cp *contextParallel) attentionFloats(B, T, NH int) int { return B * T * NH }

// attention is the ring's forward pass over the rank's (B,T) rows
// (T = 2c): out (B,T,NH·hd) and the log-sum-exps in att (B·T,NH). The
// steps fold into cp.acc, stored into out once.
func (cp *contextParallel) attention(ps *pass, out, att, qkv []float32, B, T int, h attnShape, _ kernels.Dropout, _ uint64) {
	be, rows, c := cp.be, B*T, T/2
	cp.ensure(rows, h)
	be.RingKV(cp.kv[0], qkv, rows, h.NH, h.NKV, h.hd)
	for s := 0; s < cp.size; s++ {
		kr := (cp.rank - s + cp.size) % cp.size // the block in hand: rank kr's
		be.RingAttentionForward(cp.acc, cp.stats, qkv, cp.kv[s%2], B, c, h.NH, h.NKV, h.hd, cp.size, cp.rank, kr, s == 0)
		if s < cp.size-1 {
			cp.pass(ps, "keys and values", cp.kv[s%2], cp.kv[(s+1)%2])
		}
	}
	be.RingAttentionFinish(cp.acc, att, cp.stats, rows, h.NH, h.hd)
	be.Copy(out, cp.acc)
}

// attentionBackward is the ring's backward pass: dqkv overwritten from
// dout and what the forward pass returned (out, the log-sum-exps in att)
// and read (qkv). Each block travels with the gradient of its keys and
// values, which every rank adds to; after cp steps each is home. The
// steps fold into cp.dacc, stored into dqkv once.
func (cp *contextParallel) attentionBackward(ps *pass, dqkv, dout, out, qkv, att []float32, B, T int, h attnShape, _ kernels.Dropout, _ uint64) {
	be, rows, c := cp.be, B*T, T/2
	cp.ensure(rows, h)
	be.Zero(cp.dacc)
	be.RingAttentionDelta(cp.delta, dout, out, rows, h.NH, h.hd)
	be.RingKV(cp.kv[0], qkv, rows, h.NH, h.NKV, h.hd)
	be.Zero(cp.dkv[0])
	for s := 0; s < cp.size; s++ {
		kr := (cp.rank - s + cp.size) % cp.size
		i, j := s%2, (s+1)%2
		be.RingAttentionBackward(cp.dacc, cp.dkv[i], dout, qkv, cp.kv[i], att, cp.delta, B, c, h.NH, h.NKV, h.hd, cp.size, cp.rank, kr)
		if s < cp.size-1 {
			cp.pass(ps, "keys, values and their gradients", cp.kv[i], cp.kv[j], cp.dkv[i], cp.dkv[j])
		} else {
			cp.pass(ps, "key and value gradients", cp.dkv[i], cp.dkv[j])
		}
	}
	be.RingKVGrad(cp.dacc, cp.dkv[cp.size%2], rows, h.NH, h.NKV, h.hd)
	be.Copy(dqkv, cp.dacc)
}

// pass sends each even-numbered buffer of bufs to the next rank of the
// ring and receives the one after it from the previous, together; a
// failure fails ps.
func (cp *contextParallel) pass(ps *pass, what string, bufs ...[]float32) {
	if cp.g == nil || ps.err != nil {
		return
	}
	next, prev := (cp.rank+1)%cp.size, (cp.rank-1+cp.size)%cp.size
	var sends, recvs []comm.Transfer
	for k := 0; k < len(bufs); k += 2 {
		sends = append(sends, comm.Transfer{Peer: next, Buf: bufs[k]})
		recvs = append(recvs, comm.Transfer{Peer: prev, Buf: bufs[k+1]})
	}
	if err := cp.g.Exchange(ps.ctx, sends, recvs); err != nil {
		ps.fail(fmt.Errorf("context parallel: passing %s around the ring: %w", what, err))
	}
}

// ensure sizes the ring's buffers for rows rows of attention shape h.
func (cp *contextParallel) ensure(rows int, h attnShape) {
	kv, stats, delta, acc, dacc := ringFloats(rows, h)
	for _, b := range []*[]float32{&cp.kv[0], &cp.kv[1], &cp.dkv[0], &cp.dkv[1]} {
		cp.resize(b, kv)
	}
	cp.resize(&cp.stats, stats)
	cp.resize(&cp.delta, delta)
	cp.resize(&cp.acc, acc)
	cp.resize(&cp.dacc, dacc)
}

// ringFloats are the elements of the ring's buffers for rows rows of
// attention shape h: each of the four key/value blocks (kv, dkv), the
// online softmax's statistics, backward's Σ dout·out, the sums of the
// output (rows, NH·hd) and of qkv's gradient (rows, (NH+2·NKV)·hd).
func ringFloats(rows int, h attnShape) (kv, stats, delta, acc, dacc int) {
	return rows * 2 * h.NKV * h.hd, rows * h.NH * 2, rows * h.NH, rows * h.NH * h.hd, rows * (h.NH + 2*h.NKV) * h.hd
}

// bufferBytes is the bytes of the ring's buffers once the passes of a
// (B,T) micro-batch of the rank's rows (T = 2c) of attention shape h have
// used them (ensure), and, where wpe is held (a GPT-2's first stage), of
// the rank's rows of wpe and of its gradient, (T,C) each (the account of
// them: Trainer.memory).
func (cp *contextParallel) bufferBytes(B, T, C int, h attnShape, wpe bool) int64 {
	kv, stats, delta, acc, dacc := ringFloats(B*T, h)
	n := 4*kv + stats + delta + acc + dacc
	if wpe {
		n += 2 * T * C
	}
	return 4 * int64(n)
}

// resize makes *b a buffer of the backend's memory of n elements.
func (cp *contextParallel) resize(b *[]float32, n int) {
	if len(*b) != n {
		kernels.Free(cp.be, *b)
		*b = kernels.Float32s(cp.be, n)
	}
}

// embedForward is the wrapped layout's, with the rows of wpe (if not nil)
// at the rank's positions.
func (cp *contextParallel) embedForward(ps *pass, out []float32, inputs []int32, wte, wpe []float32, B, T, C int) {
	if wpe != nil {
		cp.resize(&cp.wpe, T*C)
		cp.eachHalf(T, C, func(local, global int, n int) { cp.be.Copy(cp.wpe[local:local+n], wpe[global:global+n]) })
		wpe = cp.wpe
	}
	cp.parallel.embedForward(ps, out, inputs, wte, wpe, B, T, C)
}

// embedBackward is the wrapped layout's, the gradient of the rank's rows
// of wpe (if dwpe is not nil) added to theirs.
func (cp *contextParallel) embedBackward(ps *pass, dwte, dwpe, dout []float32, inputs []int32, B, T, C int) {
	if dwpe == nil {
		cp.parallel.embedBackward(ps, dwte, nil, dout, inputs, B, T, C)
		return
	}
	cp.resize(&cp.dwpe, T*C)
	cp.be.Zero(cp.dwpe)
	cp.parallel.embedBackward(ps, dwte, cp.dwpe, dout, inputs, B, T, C)
	cp.eachHalf(T, C, func(local, global int, n int) {
		g := dwpe[global : global+n]
		cp.be.ResidualForward(g, g, cp.dwpe[local:local+n])
	})
}

// eachHalf calls f with the offsets in a (T,C) table of the rank's rows
// and in wpe of their positions, and the length, for each of its two
// chunks.
func (cp *contextParallel) eachHalf(T, C int, f func(local, global, n int)) {
	c := T / 2
	for half := 0; half < 2; half++ {
		f(half*c*C, cp.chunk(cp.rank, half)*c*C, c*C)
	}
}

// cpRows returns rank r's rows of a batch x of sequences of T tokens for a
// ring of cp ranks: of each sequence, chunk r then chunk 2·cp−1−r of
// T/(2·cp) tokens, B·T/cp tokens in all; x itself for cp ≤ 1.
func cpRows(x []int32, T, cp, r int) []int32 {
	if cp <= 1 {
		return x
	}
	c := T / (2 * cp)
	out := make([]int32, 0, len(x)/cp)
	for s := 0; s+T <= len(x); s += T {
		out = append(out, x[s+r*c:s+(r+1)*c]...)
		k := 2*cp - 1 - r
		out = append(out, x[s+k*c:s+(k+1)*c]...)
	}
	return out
}
