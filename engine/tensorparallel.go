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
	g comm.Communicator
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

// gradSquares adds to out[0], on the device, Σ g² over grads, the
// gradients of the parameters spans maps (laid out as a shard's), weighted
// so that summing it over the ranks of the tensor- and pipeline-parallel
// groups counts every gradient of the whole model once: a tensor held
// whole by every rank of the tensor-parallel group counts 1/mp on each,
// and the last pipeline stage's copy of the tied wte, whose gradient
// equals the first stage's, counts 0.
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
			m.be.SumSquares(out, grads[sp.At+s-sp.Flat:sp.At+e-sp.Flat], w)
		}
	}
}
