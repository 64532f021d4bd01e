package ref

import "math"

// The Llama family's layers, in float64.

// RMSNorm normalises N rows of C by their root mean square:
// x/√(mean(x²)+eps)·w.
func RMSNorm(inp, w []float64, N, C int, eps float64) []float64 {
	out := make([]float64, N*C)
	for r := 0; r < N; r++ {
		x := inp[r*C : (r+1)*C]
		var ss float64
		for _, e := range x {
			ss += e * e
		}
		s := 1 / math.Sqrt(ss/float64(C)+eps)
		for i, e := range x {
			out[r*C+i] = e * s * w[i]
		}
	}
	return out
}

// RoPE rotates the first heads·hd channels of each (B,T,C) row, heads of
// hd, by the angles (pos0+t)·invFreq[i] in Hugging Face's rotate_half
// pairing (channel i with channel i+hd/2), computing cos and sin itself;
// the other channels are copied.
func RoPE(inp, invFreq []float64, B, T, C, heads, hd, pos0 int) []float64 {
	out := append([]float64(nil), inp...)
	h := hd / 2
	for r := 0; r < B*T; r++ {
		p := float64(pos0 + r%T)
		for k := 0; k < heads; k++ {
			x := inp[r*C+k*hd : r*C+(k+1)*hd]
			o := out[r*C+k*hd : r*C+(k+1)*hd]
			for i := 0; i < h; i++ {
				c, s := math.Cos(p*invFreq[i]), math.Sin(p*invFreq[i])
				o[i] = x[i]*c - x[h+i]*s
				o[h+i] = x[h+i]*c + x[i]*s
			}
		}
	}
	return out
}

// SwiGLU is silu(gate)·up for N rows of (gate (F), up (F)).
func SwiGLU(inp []float64, N, F int) []float64 {
	out := make([]float64, N*F)
	for r := 0; r < N; r++ {
		for i := 0; i < F; i++ {
			g, u := inp[2*r*F+i], inp[(2*r+1)*F+i]
			out[r*F+i] = g / (1 + math.Exp(-g)) * u
		}
	}
	return out
}

// GQA is causal grouped-query attention on packed qkv (B,T,(NH+2·NKV)·hd):
// NH query heads, NKV key heads, NKV value heads per position, query head h
// reading key/value head h/(NH/NKV); out (B,T,NH·hd). keep, when not nil,
// says whether probability (b,h,t,t2) survives dropout p (index
// ((b·NH+h)·T+t)·T+t2).
func GQA(qkv []float64, B, T, NH, NKV, hd int, p float64, keep func(i int) bool) []float64 {
	ld, C := (NH+2*NKV)*hd, NH*hd
	out := make([]float64, B*T*C)
	sc := 1 / math.Sqrt(float64(hd))
	for b := 0; b < B; b++ {
		for h := 0; h < NH; h++ {
			kv := h / (NH / NKV)
			for t := 0; t < T; t++ {
				q := qkv[(b*T+t)*ld+h*hd:]
				s := make([]float64, t+1)
				mx := math.Inf(-1)
				for t2 := 0; t2 <= t; t2++ {
					k := qkv[(b*T+t2)*ld+(NH+kv)*hd:]
					for i := 0; i < hd; i++ {
						s[t2] += q[i] * k[i]
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
					v := qkv[(b*T+t2)*ld+(NH+NKV+kv)*hd:]
					for i := 0; i < hd; i++ {
						out[(b*T+t)*C+h*hd+i] += pr * v[i]
					}
				}
			}
		}
	}
	return out
}
