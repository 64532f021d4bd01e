package cpu

import "math"

// AdamW updates params in place from grads with decoupled weight decay, as
// llm.c and torch.optim.AdamW do. m and v are the first and second moments;
// step is 1-based (for the bias corrections); every gradient is first
// multiplied by gscale (the global-norm clipping factor, 1 for none), which
// saves a separate pass over the gradients.
//
//	g = gscale·grad
//	m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
//	p -= lr · (m̂ / (√v̂ + ε) + wd · p),  m̂ = m/(1−β1^step), v̂ = v/(1−β2^step)
func (b *Backend) AdamW(params, grads, m, v []float32, lr, beta1, beta2, eps, wd, gscale float32, step int) {
	defer b.store(params, m, v)
	rc1 := float32(1 / (1 - math.Pow(float64(beta1), float64(step)))) // 1/(1−β1^step)
	rc2 := float32(1 / (1 - math.Pow(float64(beta2), float64(step)))) // 1/(1−β2^step)
	k := [10]float32{gscale, beta1, 1 - beta1, beta2, 1 - beta2, rc2, eps, rc1, lr, wd}
	b.ParallelFor(len(params), 1<<14, func(lo, hi int) {
		p := params[lo:hi]
		g, mm, vv := grads[lo:hi:hi], m[lo:hi:hi], v[lo:hi:hi]
		g, mm, vv = g[:len(p)], mm[:len(p)], vv[:len(p)] // one bounds check, not four per element
		if !b.scalarAdamW {
			d := adamwVec(p, g, mm, vv, &k)
			p, g, mm, vv = p[d:], g[d:], mm[d:], vv[d:]
		}
		for i := range p {
			gi := g[i] * gscale
			mi := beta1*mm[i] + (1-beta1)*gi
			vi := beta2*vv[i] + (1-beta2)*gi*gi
			mm[i], vv[i] = mi, vi
			den := float32(math.Sqrt(float64(vi*rc2))) + eps
			p[i] -= lr * (mi*rc1/den + wd*p[i])
		}
	})
}

// normChunk is the fixed size of the pieces Sum and SumSquares add up
// separately, so the result does not depend on the number of threads.
const normChunk = 1 << 16

// Sum adds w·Σ x to out[0], Σ x accumulated in float64 in a fixed order:
// chunks of normChunk elements in order, each summed from its first
// element.
func (b *Backend) Sum(out []float64, x []float32, w float64) {
	out[0] += w * b.sum(x, false)
}

// SumSquares adds w·Σ x² to out[0], accumulated as Sum does.
func (b *Backend) SumSquares(out []float64, x []float32, w float64) {
	out[0] += w * b.sum(x, true)
}

// sum returns Σ x (Σ x² when square is set) in float64, chunk by chunk
// in parallel, the chunks' sums added in order.
func (b *Backend) sum(x []float32, square bool) float64 {
	chunks := (len(x) + normChunk - 1) / normChunk
	part := make([]float64, chunks)
	b.ParallelFor(chunks, 1, func(lo, hi int) {
		for c := lo; c < hi; c++ {
			var s float64
			xs := x[c*normChunk : min(len(x), (c+1)*normChunk)]
			if square {
				for _, v := range xs {
					s += float64(v) * float64(v)
				}
			} else {
				for _, v := range xs {
					s += float64(v)
				}
			}
			part[c] = s
		}
	})
	var s float64
	for _, p := range part {
		s += p
	}
	return s
}
