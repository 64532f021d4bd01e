package cpu

// geluK is sqrt(2/π), the constant of GPT-2's tanh approximation of GELU.
const geluK = 0.7978845608028654

// GeluForward applies GELU (tanh approximation) elementwise.
//
//	out = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
func (b *Backend) GeluForward(out, inp []float32) {
	b.ParallelFor(len(inp), 4096, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x := inp[i]
			u := geluK * (x + 0.044715*x*x*x)
			out[i] = 0.5 * x * (1 + tanh32(u))
		}
	})
}

// GeluBackward computes dinp (overwritten) from the pre-activation inp.
//
//	dinp = dout · (0.5·(1+tanh u) + 0.5·x·(1-tanh²u)·√(2/π)·(1 + 3·0.044715·x²))
func (b *Backend) GeluBackward(dinp, inp, dout []float32) {
	b.ParallelFor(len(inp), 4096, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x := inp[i]
			u := geluK * (x + 0.044715*x*x*x)
			th := tanh32(u)
			g := 0.5*(1+th) + 0.5*x*(1-th*th)*geluK*(1+3*0.044715*x*x)
			dinp[i] = dout[i] * g
		}
	})
}

// tanh32 is tanh in float32 precision through one exponential.
func tanh32(u float32) float32 {
	if u > 10 {
		return 1
	}
	if u < -10 {
		return -1
	}
	e := exp32(2 * u)
	return (e - 1) / (e + 1)
}
