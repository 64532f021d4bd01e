package cpu

import "math"

// RMSNormForward normalises each of N rows of C channels by their root mean
// square (the Llama family's norm: no centring, no bias).
//
//	rstd (N)  = 1/√(mean(inp²) + eps), the mean of squares summed in float64; kept for backward
//	out (N,C) = inp · rstd · w
func (b *Backend) RMSNormForward(out, rstd, inp, w []float32, N, C int, eps float32) {
	defer b.store(out)
	b.ParallelFor(N, 8, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			rstd[r] = rmsNormRow(out[r*C:(r+1)*C], inp[r*C:(r+1)*C], w, eps)
		}
	})
}

// rmsNormRow normalises one row x into o by its root mean square and
// returns the reciprocal, the mean of squares summed in float64.
func rmsNormRow(o, x, w []float32, eps float32) (rstd float32) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	s := float32(1 / math.Sqrt(ss/float64(len(x))+float64(eps)))
	for i, v := range x {
		o[i] = v * s * w[i]
	}
	return s
}

// RMSNormBackward accumulates into dinp and dw. dw's partial sums are taken
// over fixed chunks of lnChunk rows and added in chunk order, so the result
// does not depend on the number of threads.
//
//	n = inp · rstd,  dn = dout · w
//	dw   += Σ_rows dout · n
//	dinp += rstd · (dn − n · mean(dn · n))
func (b *Backend) RMSNormBackward(dinp, dw, dout, inp, w, rstd []float32, N, C int) {
	defer b.store(dinp, dw)
	chunks := (N + lnChunk - 1) / lnChunk
	part := make([]float32, chunks*C) // per chunk: its dw partial sum
	b.ParallelFor(chunks, 1, func(clo, chi int) {
		for c := clo; c < chi; c++ {
			pw := part[c*C : (c+1)*C]
			for r := c * lnChunk; r < min(N, (c+1)*lnChunk); r++ {
				x := inp[r*C : (r+1)*C]
				g := dout[r*C : (r+1)*C]
				di := dinp[r*C : (r+1)*C]
				s := rstd[r]
				var dnm float32
				for i := range g {
					dnm += g[i] * w[i] * (x[i] * s)
				}
				dnm /= float32(C)
				for i := range g {
					n := x[i] * s
					pw[i] += n * g[i]
					di[i] += (g[i]*w[i] - n*dnm) * s
				}
			}
		}
	})
	for c := 0; c < chunks; c++ {
		pw := part[c*C : (c+1)*C]
		for i := range C {
			dw[i] += pw[i]
		}
	}
}
