package engine

import "fmt"

// sequenceParallel is tensor parallelism with Megatron-LM's sequence
// parallelism (Distributed.sequence_parallel): between the regions the
// N = B·T rows of the residual stream are split over the group, rank r
// holding rows r·N/MP … (r+1)·N/MP − 1 (contiguous, so a rank's share of
// the stream is one span of the dropout streams too), and every norm,
// dropout and residual add runs on a rank's rows only. The regions'
// hooks change with it:
//
//	f forward   all-gather the rows of the region's input  (was: identity)
//	f backward  reduce-scatter the input gradients         (was: all-reduce)
//	g forward   reduce-scatter the partial sums             (was: all-reduce)
//	g backward  all-gather the output gradient's rows       (was: identity)
//
// which moves the same bytes as the all-reduces (an all-reduce is a
// reduce-scatter and an all-gather) and divides the activations kept
// between the regions by MP. The backward pass gathers a region's input
// again rather than keeping it whole (enterTP, called there too). The
// norms' weights see only a rank's rows: their gradients are summed over
// the group (sumRowShared) before they are accumulated. Inside the regions
// — attention, the MLP, the vocabulary-parallel loss — nothing changes.
type sequenceParallel struct {
	*tensorParallel

	// The hooks' own buffers, sized at first use: gathered rows (N·C)
	// for enterTP and for exitTPBackward, and a rank's rows of a sum
	// (N·C/MP) for exitTP and for enterTPBackward; one each, so that no
	// hook's result is overwritten by another's.
	in, dout, out, din []float32
}

// spBufferBytes is the memory of the hooks' own buffers once the passes
// of a micro-batch of N rows of width C have used them, a rank holding nr
// of the rows between the regions: in and dout all N rows, out and din
// the rank's nr (the account of them: Trainer.memory). in gathers
// activations (the norms' outputs) and dout the branches' output
// gradients, activations too (kernels.Activations, ab bytes each); out
// and din hold sums, float32s.
func spBufferBytes(N, nr, C, ab int) int64 { return int64(2*ab*N*C + 4*2*nr*C) }

// rows are rank r's N/MP rows of N, from row r·N/MP.
func (sp *sequenceParallel) rows(N int) (first, n int) {
	n = N / sp.size
	return sp.rank * n, n
}

// enterTP gathers x's rows from the group: the region's input, all N
// rows.
func (sp *sequenceParallel) enterTP(ps *pass, x []float32) []float32 {
	all := sp.actBuf(&sp.in, len(x)*sp.size)
	sp.allGather(ps, x, all)
	return all
}

// enterTPBackward sums the region's partial input gradients dx (N rows)
// over the group, keeping this rank's rows of the sum.
func (sp *sequenceParallel) enterTPBackward(ps *pass, dx []float32) []float32 {
	mine := sp.buf(&sp.din, len(dx)/sp.size)
	sp.reduceScatter(ps, dx, mine)
	return mine
}

// exitTP sums the region's partial outputs y (N rows) over the group,
// keeping this rank's rows of the sum.
func (sp *sequenceParallel) exitTP(ps *pass, y []float32) []float32 {
	mine := sp.buf(&sp.out, len(y)/sp.size)
	sp.reduceScatter(ps, y, mine)
	return mine
}

// exitTPBackward gathers the output gradient's rows: all N of them, as
// the row-parallel GEMM's backward reads them.
func (sp *sequenceParallel) exitTPBackward(ps *pass, dy []float32) []float32 {
	all := sp.actBuf(&sp.dout, len(dy)*sp.size)
	sp.allGather(ps, dy, all)
	return all
}

// sumRowShared sums a norm's weight gradient over the group.
func (sp *sequenceParallel) sumRowShared(ps *pass, dw []float32) { sp.allReduce(ps, dw) }

// embedForward looks up the tokens of the rank's vocabulary rows for all
// N positions (the first rank adding wpe) and keeps its rows of the
// group's sum in out (N/MP rows).
func (sp *sequenceParallel) embedForward(ps *pass, out []float32, inputs []int32, wte, wpe []float32, B, T, C int) {
	all := sp.buf(&sp.embed, embedFloats(B*T, C))
	sp.be.EncoderShardForward(all, inputs, wte, sp.vlo, sp.rowBias(wpe), B, T, C)
	mine := sp.buf(&sp.out, len(out))
	sp.reduceScatter(ps, all, mine)
	sp.be.Copy(out, mine) // the sum rounded once, as tensorParallel's
}

// embedBackward gathers dout's rows (N/MP a rank), the residual
// stream's gradient, activations as every exitTPBackward's, and
// accumulates the gradients of the rank's rows of wte and, on every rank
// alike, of wpe.
func (sp *sequenceParallel) embedBackward(ps *pass, dwte, dwpe, dout []float32, inputs []int32, B, T, C int) {
	sp.be.EncoderShardBackward(dwte, sp.vlo, dwpe, sp.exitTPBackward(ps, dout), inputs, B, T, C)
}

// reduceScatter sums in (N rows) over the group and leaves this rank's
// rows of the sum in out, as allReduce.
func (sp *sequenceParallel) reduceScatter(ps *pass, in, out []float32) {
	if sp.g == nil || ps.err != nil {
		return
	}
	if err := sp.g.ReduceScatter(ps.ctx, in, out); err != nil {
		ps.fail(fmt.Errorf("sequence parallel: reduce-scatter: %w", err))
	}
}
