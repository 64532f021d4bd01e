package cpu

import "math"

// lnEps is LayerNorm's variance epsilon, GPT-2's 1e-5.
const lnEps = 1e-5

// LayerNormForward normalises each of N rows of C channels.
//
//	out  (N,C) = (inp - mean) · rstd · w + bias
//	mean (N), rstd (N): kept for the backward pass
func (b *Backend) LayerNormForward(out, mean, rstd, inp, w, bias []float32, N, C int) {
	defer b.store(out)
	b.ParallelFor(N, 8, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			mean[r], rstd[r] = layerNormRow(out[r*C:(r+1)*C], inp[r*C:(r+1)*C], w, bias)
		}
	})
}

// layerNormRow normalises one row x into o, returning its mean and
// reciprocal standard deviation: the mean and the variance summed in
// float64.
func layerNormRow(o, x, w, bias []float32) (mean, rstd float32) {
	C := len(x)
	var m float64
	for _, v := range x {
		m += float64(v)
	}
	m /= float64(C)
	var vr float64
	for _, v := range x {
		d := float64(v) - m
		vr += d * d
	}
	vr /= float64(C)
	s := float32(1 / math.Sqrt(vr+lnEps))
	mf := float32(m)
	for i, v := range x {
		o[i] = (v-mf)*s*w[i] + bias[i]
	}
	return mf, s
}

// lnChunk is the number of rows whose dw/dbias partial sums one task adds up;
// fixed, so the reduction order (and the result, bit for bit) does not depend
// on the number of threads.
const lnChunk = 32

// LayerNormBackward accumulates into dinp, dw and dbias.
//
//	norm  = (inp - mean) · rstd
//	dbias += Σ_rows dout;   dw += Σ_rows dout · norm
//	dinp  += rstd · (dnorm - mean(dnorm) - norm · mean(dnorm · norm)),  dnorm = dout · w
func (b *Backend) LayerNormBackward(dinp, dw, dbias, dout, inp, w, mean, rstd []float32, N, C int) {
	defer b.store(dinp, dw, dbias)
	chunks := (N + lnChunk - 1) / lnChunk
	part := make([]float32, chunks*2*C) // per chunk: dw partial, then dbias partial
	b.ParallelFor(chunks, 1, func(clo, chi int) {
		for c := clo; c < chi; c++ {
			pw := part[c*2*C : c*2*C+C]
			pb := part[c*2*C+C : (c+1)*2*C]
			for r := c * lnChunk; r < min(N, (c+1)*lnChunk); r++ {
				x := inp[r*C : (r+1)*C]
				g := dout[r*C : (r+1)*C]
				di := dinp[r*C : (r+1)*C]
				m, s := mean[r], rstd[r]
				var dm, dnm float32
				for i := range g {
					n := (x[i] - m) * s
					dn := g[i] * w[i]
					dm += dn
					dnm += dn * n
				}
				dm /= float32(C)
				dnm /= float32(C)
				for i := range g {
					n := (x[i] - m) * s
					dn := g[i] * w[i]
					pb[i] += g[i]
					pw[i] += n * g[i]
					di[i] += (dn - dm - n*dnm) * s
				}
			}
		}
	})
	for c := 0; c < chunks; c++ {
		pw := part[c*2*C : c*2*C+C]
		pb := part[c*2*C+C : (c+1)*2*C]
		for i := 0; i < C; i++ {
			dw[i] += pw[i]
			dbias[i] += pb[i]
		}
	}
}
