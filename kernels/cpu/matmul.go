package cpu

// MatmulForward is a linear layer.
//
//	out  (N,OC) = inp (N,IC) · wᵀ + bias
//	w    (OC,IC), as torch.nn.Linear and llm.c store it
//	bias (OC) or nil
func (b *Backend) MatmulForward(out, inp, w, bias []float32, N, IC, OC int) {
	b.Sgemm(false, true, N, OC, IC, 1, inp, IC, w, IC, 0, out, OC)
	if bias != nil {
		b.ParallelFor(N, 16, func(lo, hi int) {
			for r := lo; r < hi; r++ {
				o := out[r*OC : (r+1)*OC]
				for i := range o {
					o[i] += bias[i]
				}
			}
		})
	}
}

// MatmulBackward computes the input gradient (overwritten) and accumulates
// the weight and bias gradients.
//
//	dinp  (N,IC)  = dout (N,OC) · w          (skipped when dinp is nil)
//	dw    (OC,IC) += doutᵀ · inp
//	dbias (OC)    += Σ_rows dout              (skipped when dbias is nil)
func (b *Backend) MatmulBackward(dinp, dw, dbias, dout, inp, w []float32, N, IC, OC int) {
	if dinp != nil {
		b.Sgemm(false, false, N, IC, OC, 1, dout, OC, w, IC, 0, dinp, IC)
	}
	b.Sgemm(true, false, OC, IC, N, 1, dout, OC, inp, IC, 1, dw, IC)
	if dbias != nil {
		b.ParallelFor(OC, 64, func(lo, hi int) {
			for r := 0; r < N; r++ {
				g := dout[r*OC+lo : r*OC+hi]
				db := dbias[lo:hi]
				for i, v := range g {
					db[i] += v
				}
			}
		})
	}
}
