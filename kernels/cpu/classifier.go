package cpu

import (
	"math"
)

// CrossEntropy is the fused classifier: softmax over the V real logits of
// each of N rows, the loss against targets, and, when grad is true, the
// gradient written over the logits in place.
//
//	logits (N,V): row-major, only real vocabulary columns (padding never scores)
//	losses (N)  = −log softmax(logits)[target]
//	logits ← dscale · (softmax(logits) − onehot(target))   when grad
func (b *Backend) CrossEntropy(losses, logits []float32, targets []int32, N, V int, dscale float32, grad bool) {
	b.ParallelFor(N, 1, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			x := logits[r*V : (r+1)*V]
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
		}
	})
}

// The vocabulary-parallel classifier splits CrossEntropy in three so that
// each rank of a tensor-parallel group works on its own columns of the
// logits and only per-row statistics cross the network (the full logits are
// never gathered):
//
//	ClassifierMax       maxes (N)    = max over this rank's columns
//	                    … the caller takes the max over the ranks …
//	ClassifierExp       logits       ← e^(logits − max);
//	                    stats (N,2)  = [Σ e^(logits−max), logit of the target if this rank holds it, else 0]
//	                    … the caller sums stats over the ranks …
//	ClassifierFinish    losses (N)   = max + log Σ − logit[target];
//	                    logits       ← dscale · (e/Σ − onehot(target)) when grad
//
// logits (N,V) are this rank's V columns, global vocabulary ids vlo …
// vlo+V−1; V may be 0 for a rank holding only padding.

// ClassifierMax writes the maximum of each row of logits (N,V) to maxes; a
// row of no columns has maximum −Inf.
func (b *Backend) ClassifierMax(maxes, logits []float32, N, V int) {
	b.ParallelFor(N, 1, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			if V == 0 {
				maxes[r] = float32(math.Inf(-1))
				continue
			}
			maxes[r] = maxOf(logits[r*V : (r+1)*V])
		}
	})
}

// ClassifierGlobalMax writes maxes[r] = max over k of gmax[k·N+r], the
// largest of the MP ranks' row maxima (gmax (MP,N)), taking the earliest
// rank's value on ties.
func (b *Backend) ClassifierGlobalMax(maxes, gmax []float32, N, MP int) {
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

// ClassifierExp exponentiates logits in place against the global row
// maxima and writes each row's partial sum and target logit to stats.
func (b *Backend) ClassifierExp(stats []float64, logits []float32, targets []int32, maxes []float32, N, V, vlo int) {
	b.ParallelFor(N, 1, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			x := logits[r*V : (r+1)*V]
			stats[2*r+1] = 0
			if t := int(targets[r]) - vlo; t >= 0 && t < V {
				stats[2*r+1] = float64(x[t])
			}
			stats[2*r] = 0
			if V > 0 {
				stats[2*r] = expShift(x, maxes[r])
			}
		}
	})
}

// ClassifierFinish writes the losses from the summed stats and, when grad
// is true, turns the exponentiated logits into the loss gradient.
func (b *Backend) ClassifierFinish(losses, logits []float32, targets []int32, maxes []float32, stats []float64, N, V, vlo int, dscale float32, grad bool) {
	b.ParallelFor(N, 1, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			sum := stats[2*r]
			losses[r] = float32(float64(maxes[r]) + math.Log(sum) - stats[2*r+1])
			if !grad {
				continue
			}
			x := logits[r*V : (r+1)*V]
			scale(x, dscale*float32(1/sum))
			if t := int(targets[r]) - vlo; t >= 0 && t < V {
				x[t] -= dscale
			}
		}
	})
}
