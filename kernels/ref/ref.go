// Package ref holds float64 reference implementations of each layer's
// forward pass. They are plain loops, written for clarity: tests compare the
// fast kernels against them and take numerical gradients through them.
package ref

import "math"

// Encoder: out (B,T,C) = wte[inp] + wpe[t].
func Encoder(inp []int32, wte, wpe []float64, B, T, C int) []float64 {
	out := make([]float64, B*T*C)
	for bt := 0; bt < B*T; bt++ {
		for i := 0; i < C; i++ {
			out[bt*C+i] = wte[int(inp[bt])*C+i] + wpe[(bt%T)*C+i]
		}
	}
	return out
}

// LayerNorm normalises N rows of C: (x−mean)/√(var+1e-5)·w + b.
func LayerNorm(inp, w, b []float64, N, C int) []float64 {
	out := make([]float64, N*C)
	for r := 0; r < N; r++ {
		x := inp[r*C : (r+1)*C]
		var m, v float64
		for _, e := range x {
			m += e
		}
		m /= float64(C)
		for _, e := range x {
			v += (e - m) * (e - m)
		}
		v /= float64(C)
		s := 1 / math.Sqrt(v+1e-5)
		for i, e := range x {
			out[r*C+i] = (e-m)*s*w[i] + b[i]
		}
	}
	return out
}

// Matmul: out (N,OC) = inp (N,IC) · wᵀ + bias (bias may be nil).
func Matmul(inp, w, bias []float64, N, IC, OC int) []float64 {
	out := make([]float64, N*OC)
	for r := 0; r < N; r++ {
		for o := 0; o < OC; o++ {
			s := 0.0
			if bias != nil {
				s = bias[o]
			}
			for i := 0; i < IC; i++ {
				s += inp[r*IC+i] * w[o*IC+i]
			}
			out[r*OC+o] = s
		}
	}
	return out
}

// Gemm: C (m,n) = op(A)·op(B) for row-major A and B with row strides lda
// and ldb, op(A) = A (m,k) or Aᵀ when transA (A stored (k,m)), op(B) = B
// (k,n) or Bᵀ when transB (B stored (n,k)): Sgemm's product.
func Gemm(transA, transB bool, m, n, k int, a []float64, lda int, b []float64, ldb int) []float64 {
	c := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			s := 0.0
			for p := 0; p < k; p++ {
				var av, bv float64
				if transA {
					av = a[p*lda+i]
				} else {
					av = a[i*lda+p]
				}
				if transB {
					bv = b[j*ldb+p]
				} else {
					bv = b[p*ldb+j]
				}
				s += av * bv
			}
			c[i*n+j] = s
		}
	}
	return c
}

// Attention is causal multi-head attention on packed qkv (B,T,3C); keep, when
// not nil, says whether probability (b,h,t,t2) survives dropout p (index
// ((b·NH+h)·T+t)·T+t2).
func Attention(qkv []float64, B, T, C, NH int, p float64, keep func(i int) bool) []float64 {
	hs := C / NH
	out := make([]float64, B*T*C)
	sc := 1 / math.Sqrt(float64(hs))
	for b := 0; b < B; b++ {
		for h := 0; h < NH; h++ {
			for t := 0; t < T; t++ {
				s := make([]float64, t+1)
				mx := math.Inf(-1)
				for t2 := 0; t2 <= t; t2++ {
					for i := 0; i < hs; i++ {
						s[t2] += qkv[(b*T+t)*3*C+h*hs+i] * qkv[(b*T+t2)*3*C+C+h*hs+i]
					}
					s[t2] *= sc
					mx = math.Max(mx, s[t2])
				}
				var z float64
				for t2 := range s {
					s[t2] = math.Exp(s[t2] - mx)
					z += s[t2]
				}
				for t2 := range s {
					pr := s[t2] / z
					if keep != nil {
						if keep(((b*NH+h)*T+t)*T + t2) {
							pr /= 1 - p
						} else {
							pr = 0
						}
					}
					for i := 0; i < hs; i++ {
						out[(b*T+t)*C+h*hs+i] += pr * qkv[(b*T+t2)*3*C+2*C+h*hs+i]
					}
				}
			}
		}
	}
	return out
}

// Gelu is GELU's tanh approximation, elementwise.
func Gelu(x []float64) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = 0.5 * v * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(v+0.044715*v*v*v)))
	}
	return out
}

// CrossEntropy returns −log softmax(logits row)[target] for N rows of V.
func CrossEntropy(logits []float64, targets []int32, N, V int) []float64 {
	out := make([]float64, N)
	for r := 0; r < N; r++ {
		x := logits[r*V : (r+1)*V]
		mx := math.Inf(-1)
		for _, v := range x {
			mx = math.Max(mx, v)
		}
		var z float64
		for _, v := range x {
			z += math.Exp(v - mx)
		}
		out[r] = mx + math.Log(z) - x[targets[r]]
	}
	return out
}

// Add returns a + b elementwise.
func Add(a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i] + b[i]
	}
	return out
}

// NumGrad returns the central-difference gradient of f at x (x is restored).
func NumGrad(f func() float64, x []float64, h float64) []float64 {
	g := make([]float64, len(x))
	for i := range x {
		v := x[i]
		x[i] = v + h
		fp := f()
		x[i] = v - h
		fm := f()
		x[i] = v
		g[i] = (fp - fm) / (2 * h)
	}
	return g
}

// RelErr is ‖a − b‖ / max(‖b‖, tiny): the relative error of a against b.
func RelErr(a []float32, b []float64) float64 {
	var num, den float64
	for i := range b {
		d := float64(a[i]) - b[i]
		num += d * d
		den += b[i] * b[i]
	}
	return math.Sqrt(num) / math.Max(math.Sqrt(den), 1e-30)
}

// To64 widens a float32 slice.
func To64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

// Dot is Σ a·b.
func Dot(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}
