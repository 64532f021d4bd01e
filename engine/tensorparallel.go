package engine

import (
	"fmt"

	"github.com/gptui/gptui/comm"
)

// tensorParallel is the communication of a model's tensor-parallel group
// (the package doc's "Tensor parallel" says what crosses it and when; the
// slices each rank holds are in PartTensors). A nil *tensorParallel does
// nothing: the model is not split.
type tensorParallel struct {
	g      comm.Communicator
	copies comm.Communicator // the ranks holding this rank's copies of a Llama's key/value head (copyGroup); nil if none
}

// allReduce sums x over the group in place, under ps's context; a failure
// fails ps, and a failed ps communicates no more.
func (tp *tensorParallel) allReduce(ps *pass, x []float32) {
	if tp == nil || ps.err != nil {
		return
	}
	if err := tp.g.AllReduce(ps.ctx, x); err != nil {
		ps.fail(fmt.Errorf("tensor parallel: all-reduce: %w", err))
	}
}

// sumCopies sums x over the ranks that hold the same copies as this one
// (a Llama's key/value head, when mp_degree exceeds the key/value heads),
// as allReduce; nothing without copies.
func (tp *tensorParallel) sumCopies(ps *pass, x []float32) {
	if tp == nil || tp.copies == nil || ps.err != nil {
		return
	}
	if err := tp.copies.AllReduce(ps.ctx, x); err != nil {
		ps.fail(fmt.Errorf("tensor parallel: summing a key/value head's gradients over its copies: %w", err))
	}
}

// copyGroup lists the world ranks of this rank's tensor-parallel group
// that hold the same copies as it, when each block is held by k ranks
// alike: the k consecutive tensor-parallel indices it is among.
func (t Topology) copyGroup(k int) []int {
	first := t.MPIndex / k * k
	return t.group(k, func(i int) int { return t.rankOf(t.DPIndex, t.PPIndex, t.ShardIndex, first+i) })
}

// allReduce64 sums x over the group in place, as allReduce.
func (tp *tensorParallel) allReduce64(ps *pass, x []float64) {
	if tp == nil || ps.err != nil {
		return
	}
	if err := tp.g.AllReduce64(ps.ctx, x); err != nil {
		ps.fail(fmt.Errorf("tensor parallel: all-reduce: %w", err))
	}
}

// allGather concatenates every rank's in into out, in group order, as
// allReduce.
func (tp *tensorParallel) allGather(ps *pass, in, out []float32) {
	if tp == nil || ps.err != nil {
		return
	}
	if err := tp.g.AllGather(ps.ctx, in, out); err != nil {
		ps.fail(fmt.Errorf("tensor parallel: all-gather: %w", err))
	}
}
