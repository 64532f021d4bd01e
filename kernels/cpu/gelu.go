package cpu

import "math"

// geluK is sqrt(2/π) and geluA the cube's coefficient in GPT-2's tanh
// approximation of GELU.
const (
	geluK = 0.7978845608028654
	geluA = 0.044715
)

// GeluForward applies GELU (tanh approximation) elementwise.
//
//	out = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
func (b *Backend) GeluForward(out, inp []float32) {
	defer b.store(out)
	b.ParallelFor(len(inp), 4096, func(lo, hi int) {
		eachGeluTanh(inp[lo:hi], func(i int, x, th []float32) {
			o := out[lo+i:]
			for k, v := range x {
				o[k] = 0.5 * v * (1 + th[k])
			}
		})
	})
}

// geluTanh writes th[i] = tanh u, u = √(2/π)·(x + geluA·x³), of each
// x[i]: tanh u = 1 − 2/(e²ᵘ + 1), e²ᵘ by exp32's polynomial, written out
// so that the loop stays tight; |u| ≤ 9 keeps tanh exact in float32.
// kernels/cuda's gelu.cu computes it in this order, and so does the vector
// loop (geluTanhVec), to the bit.
func geluTanh(th, x []float32) {
	th = th[:len(x)]
	n := geluTanhVec(th, x)
	for i, v := range x[n:] {
		u := geluK * (v + geluA*v*v*v)
		e2 := 2 * min(max(u, -9), 9)
		t := e2*expLog2e + expMagic
		kf := t - expMagic
		r := e2 - kf*expLn2hi - kf*expLn2lo
		p := 1 + r*(1+r*(1.0/2+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720))))))
		k := int32(math.Float32bits(t)) - int32(math.Float32bits(expMagic))
		th[n+i] = 1 - 2/(p*math.Float32frombits(uint32(k+127)<<23)+1)
	}
}

// eachGeluTanh calls f(i, c, th) for each chunk c = x[i:i+len(c)] of at
// most 256 elements, th[k] = tanh u of c[k] (geluTanh).
func eachGeluTanh(x []float32, f func(i int, c, th []float32)) {
	var th [256]float32
	for i := 0; i < len(x); i += len(th) {
		c := x[i:min(i+len(th), len(x))]
		geluTanh(th[:len(c)], c)
		f(i, c, th[:len(c)])
	}
}

// geluGrad is GELU's derivative at v from th = tanh u:
//
//	0.5·(1+th) + 0.5·v·(1−th²)·√(2/π)·(1 + 3·0.044715·v²)
func geluGrad(v, th float32) float32 {
	return 0.5*(1+th) + 0.5*v*(1-th*th)*geluK*(1+3*geluA*v*v)
}

// GeluBackward computes dinp (overwritten) from the pre-activation inp and
// the forward output out, which gives tanh u without a second exponential:
// out = ½·x·(1 + tanh u), so tanh u = 2·out/x − 1 (absolute error about two
// float32 ulps; tanh u ≈ u for |x| < 1e-6, where the quotient loses it).
//
//	dinp = dout · (0.5·(1+tanh u) + 0.5·x·(1-tanh²u)·√(2/π)·(1 + 3·0.044715·x²))
func (b *Backend) GeluBackward(dinp, inp, out, dout []float32) {
	defer b.store(dinp)
	b.ParallelFor(len(inp), 4096, func(lo, hi int) {
		x, y, g, d := inp[lo:hi], out[lo:hi], dout[lo:hi], dinp[lo:hi]
		y, g, d = y[:len(x)], g[:len(x)], d[:len(x)]
		for i, v := range x {
			var th float32
			if v > 1e-6 || v < -1e-6 {
				th = 2*y[i]/v - 1
			} else {
				th = geluK * v
			}
			d[i] = g[i] * geluGrad(v, th)
		}
	})
}

// MatmulGeluForward is MatmulForward with GELU in its epilogue:
//
//	pre (N,OC) = v = inp (N,IC) · wᵀ + bias
//	out (N,OC) = GELU(v)
//
// GELU of the float32 sum v, before pre is stored: under Options.BF16
// pre and out are each rounded once from v (the bias read as a bfloat16,
// as MatmulForward's), as cuBLASLt's GELU_AUX_BIAS epilogue does.
func (b *Backend) MatmulGeluForward(out, pre, inp, w, bias []float32, N, IC, OC int) {
	defer b.store(pre)
	b.matmulGemm(false, true, N, OC, IC, inp, IC, w, IC, 0, pre, OC)
	b.addBias(pre, bias, N, OC)
	b.GeluForward(out, pre)
}

// MatmulBackwardGelu is MatmulBackward with GELU's backward in the input
// gradient's epilogue:
//
//	dinp (N,IC) = (dout (N,OC) · w) ∘ GELU'(pre)
//
// the product in float32 and the derivative from pre alone (tanh u
// computed, not recovered from GELU's output as GeluBackward does),
// rounded once under Options.BF16, as cuBLASLt's DGELU epilogue does. dw
// and dbias are MatmulBackward's.
func (b *Backend) MatmulBackwardGelu(dinp, dw, dbias, dout, inp, pre, w []float32, N, IC, OC int) {
	defer b.store(dinp)
	b.matmulGemm(false, false, N, IC, OC, dout, OC, w, IC, 0, dinp, IC)
	b.ParallelFor(N*IC, 4096, func(lo, hi int) {
		eachGeluTanh(pre[lo:hi], func(i int, x, th []float32) {
			d := dinp[lo+i:]
			for k, v := range x {
				d[k] *= geluGrad(v, th[k])
			}
		})
	})
	b.MatmulBackward(nil, dw, dbias, dout, inp, w, N, IC, OC)
}
