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
				for _, v := range x {
					sum += float64(exp32(v - maxv))
				}
			}
			losses[r] = float32(float64(maxv) + math.Log(sum) - float64(xt))
			if !grad {
				continue
			}
			s := dscale * float32(1/sum)
			for i := range x {
				x[i] *= s
			}
			x[tgt] -= dscale
		}
	})
}
