package cpu

// SwiGLUForward is the Llama MLP's gated activation on the fused output of
// the gate and up projections.
//
//	inp (N,2F): each row the gate g (F), then the up projection u (F)
//	out (N,F)  = silu(g) · u,  silu(g) = g·σ(g) = g / (1 + e⁻ᵍ)  (e⁻ᵍ by exp32)
func (b *Backend) SwiGLUForward(out, inp []float32, N, F int) {
	defer b.store(out)
	b.ParallelFor(N, max(1, 4096/max(F, 1)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			g, u := inp[2*r*F:(2*r+1)*F], inp[(2*r+1)*F:(2*r+2)*F]
			o := out[r*F : (r+1)*F]
			for i, v := range g {
				o[i] = v / (1 + exp32(-v)) * u[i]
			}
		}
	})
}

// SwiGLUBackward writes dinp (N,2F), overwritten, from dout (N,F) and the
// forward pass's inp (N,2F):
//
//	σ = 1 / (1 + e⁻ᵍ)
//	dgate = dout · u · σ·(1 + g·(1 − σ))   (the gate half of each row)
//	dup   = dout · g·σ                     (the up half)
func (b *Backend) SwiGLUBackward(dinp, inp, dout []float32, N, F int) {
	defer b.store(dinp)
	b.ParallelFor(N, max(1, 4096/max(F, 1)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			g, u := inp[2*r*F:(2*r+1)*F], inp[(2*r+1)*F:(2*r+2)*F]
			dg, du := dinp[2*r*F:(2*r+1)*F], dinp[(2*r+1)*F:(2*r+2)*F]
			d := dout[r*F : (r+1)*F]
			for i, v := range g {
				s := 1 / (1 + exp32(-v))
				dg[i] = d[i] * u[i] * s * (1 + v*(1-s))
				du[i] = d[i] * v * s
			}
		}
	})
}
