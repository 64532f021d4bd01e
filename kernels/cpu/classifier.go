package cpu

import (
	"fmt"
	"math"
)

// The classifier's logits are (N,ld), row-major with row stride ld ≥ V:
// the first V columns of each row are the real vocabulary, the other ld−V
// padding (the rows a padded vocabulary, llm.c's Vp, adds to the head's
// GEMM). The padding enters no maximum and no sum; training, its gradient
// is written 0, so that the GEMM's backward adds nothing to the padded
// rows of the weights nor to the input gradient.

// checkStride panics unless the logits (N,ld) of V real columns lie in x.
func checkStride(op string, x []float32, N, V, ld int) {
	if V < 0 || ld < V || len(x) < N*ld {
		panic(fmt.Sprintf("cpu: %s: logits of %d elements, N %d, V %d, ld %d: want 0 ≤ V ≤ ld and N·ld elements", op, len(x), N, V, ld))
	}
}

// CrossEntropy is the fused classifier: softmax over the V real logits of
// each of N rows, the loss against targets, and, when grad is true, the
// gradient written over the logits in place.
//
//	logits (N,ld): row-major, the first V columns real (padding never scores)
//	losses (N)  = −log softmax(logits[:, :V])[target]
//	logits[:, :V] ← dscale · (softmax − onehot(target))   when grad
//	logits[:, V:] ← 0                                       when grad
//
// A target outside [0, V) panics: the padding columns hold no target.
func (b *Backend) CrossEntropy(losses, logits []float32, targets []int32, N, V, ld int, dscale float32, grad bool) {
	defer b.store(losses, logits)
	checkStride("CrossEntropy", logits, N, V, ld)
	b.ParallelFor(N, 1, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			row := logits[r*ld : (r+1)*ld]
			x := row[:V]
			tgt := int(targets[r])
			xt := x[tgt]
			maxv := maxOf(x)
			var sum float64
			if grad {
				// Keep eˣ⁻ᵐᵃˣ in place: the gradient is a rescale of it.
				sum = expShift(x, maxv)
			} else {
				sum = expSum(x, maxv)
			}
			losses[r] = float32(float64(maxv) + math.Log(sum) - float64(xt))
			if !grad {
				continue
			}
			scale(x, dscale*float32(1/sum))
			x[tgt] -= dscale
			clear(row[V:])
		}
	})
}

// The vocabulary-parallel classifier splits CrossEntropy in three so that
// each rank of a tensor-parallel group works on its own columns of the
// logits and only per-row statistics cross the network (the full logits are
// never gathered):
//
//	ClassifierMax       maxes (N)    = max over this rank's real columns
//	                    … the caller takes the max over the ranks …
//	ClassifierExp       stats (N,2)  = [Σ e^(logits−max), logit of the target if this rank holds it, else 0]
//	                    … the caller sums stats over the ranks …
//	ClassifierFinish    losses (N)   = max + log Σ − logit[target];
//	                    logits       ← dscale · (e^(logits−max)/Σ − onehot(target)) when grad, 0 in the padding
//
// logits (N,ld) are this rank's ld columns, the first V of them real,
// global vocabulary ids vlo … vlo+V−1, the rest padding; V may be 0 for a
// rank holding only padding.

// ClassifierMax writes the maximum of the real columns of each row of
// logits (N,ld) to maxes; a row of no real columns has maximum −Inf.
func (b *Backend) ClassifierMax(maxes, logits []float32, N, V, ld int) {
	defer b.store(maxes)
	checkStride("ClassifierMax", logits, N, V, ld)
	b.ParallelFor(N, 1, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			if V == 0 {
				maxes[r] = float32(math.Inf(-1))
				continue
			}
			maxes[r] = maxOf(logits[r*ld : r*ld+V])
		}
	})
}

// ClassifierGlobalMax writes maxes[r] = max over k of gmax[k·N+r], the
// largest of the MP ranks' row maxima (gmax (MP,N)), taking the earliest
// rank's value on ties.
func (b *Backend) ClassifierGlobalMax(maxes, gmax []float32, N, MP int) {
	defer b.store(maxes)
	if MP == 0 {
		return
	}
	_ = gmax[MP*N-1]
	for r := range maxes[:N] {
		m := gmax[r]
		for k := 1; k < MP; k++ {
			if x := gmax[k*N+r]; x > m {
				m = x
			}
		}
		maxes[r] = m
	}
}

// ClassifierExp writes each row's partial sum of e^(logit − max) over the
// real columns, and its target logit, to stats; it does not write the
// logits.
func (b *Backend) ClassifierExp(stats []float64, logits []float32, targets []int32, maxes []float32, N, V, ld, vlo int) {
	checkStride("ClassifierExp", logits, N, V, ld)
	b.ParallelFor(N, 1, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			x := logits[r*ld : r*ld+V]
			stats[2*r+1] = 0
			if t := int(targets[r]) - vlo; t >= 0 && t < V {
				stats[2*r+1] = float64(x[t])
			}
			stats[2*r] = 0
			if V > 0 {
				stats[2*r] = expSum(x, maxes[r])
			}
		}
	})
}

// ClassifierFinish writes the losses from the summed stats and, when grad
// is true, turns the real logits into the loss gradient, exponentiating
// them again as CrossEntropy does, and writes 0 over the padding columns.
func (b *Backend) ClassifierFinish(losses, logits []float32, targets []int32, maxes []float32, stats []float64, N, V, ld, vlo int, dscale float32, grad bool) {
	defer b.store(losses, logits)
	checkStride("ClassifierFinish", logits, N, V, ld)
	b.ParallelFor(N, 1, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			sum := stats[2*r]
			losses[r] = float32(float64(maxes[r]) + math.Log(sum) - stats[2*r+1])
			if !grad {
				continue
			}
			row := logits[r*ld : (r+1)*ld]
			x := row[:V]
			expShift(x, maxes[r])
			scale(x, dscale*float32(1/sum))
			if t := int(targets[r]) - vlo; t >= 0 && t < V {
				x[t] -= dscale
			}
			clear(row[V:])
		}
	})
}
