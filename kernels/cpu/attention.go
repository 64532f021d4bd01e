package cpu

import "math"

// AttentionForward is causal multi-head self-attention on packed q, k, v.
//
//	qkv (B,T,3C): per row q (C), k (C), v (C); head h owns channels h·hs…(h+1)·hs, hs = C/NH
//	att (B,NH,T,T): softmax(q·kᵀ/√hs) with the causal mask, before dropout; kept for backward
//	out (B,T,C):    (dropout(att) · v), heads side by side
//	off: index of att[0,0,0,0] in the dropout stream (global sample offset · NH·T·T)
//
// Scores are materialised one row at a time, per (b, h) task, as llm.c's CPU
// reference does; a flash-style kernel that never stores att belongs to the
// GPU backend.
func (b *Backend) AttentionForward(out, att, qkv []float32, B, T, C, NH int, d Dropout, off uint64) {
	hs := C / NH
	scale := float32(1 / math.Sqrt(float64(hs)))
	ds := d.Scale()
	b.ParallelFor(B*NH, 1, func(lo, hi int) {
		for bh := lo; bh < hi; bh++ {
			bb, h := bh/NH, bh%NH
			for t := 0; t < T; t++ {
				q := qkv[(bb*T+t)*3*C+h*hs : (bb*T+t)*3*C+h*hs+hs]
				row := att[(bh*T+t)*T : (bh*T+t+1)*T]
				maxv := float32(math.Inf(-1))
				for t2 := 0; t2 <= t; t2++ {
					k := qkv[(bb*T+t2)*3*C+C+h*hs : (bb*T+t2)*3*C+C+h*hs+hs]
					var s float32
					for i, qv := range q {
						s += qv * k[i]
					}
					s *= scale
					row[t2] = s
					maxv = max(maxv, s)
				}
				var sum float32
				for t2 := 0; t2 <= t; t2++ {
					e := exp32(row[t2] - maxv)
					row[t2] = e
					sum += e
				}
				inv := 1 / sum
				for t2 := 0; t2 <= t; t2++ {
					row[t2] *= inv
				}
				clear(row[t+1:])
				o := out[(bb*T+t)*C+h*hs : (bb*T+t)*C+h*hs+hs]
				clear(o)
				for t2 := 0; t2 <= t; t2++ {
					p := row[t2]
					if d.On() {
						if !d.Keep(off + uint64((bh*T+t)*T+t2)) {
							continue
						}
						p *= ds
					}
					v := qkv[(bb*T+t2)*3*C+2*C+h*hs : (bb*T+t2)*3*C+2*C+h*hs+hs]
					for i := range o {
						o[i] += p * v[i]
					}
				}
			}
		}
	})
}

// AttentionBackward computes dqkv (overwritten) from dout, the packed qkv and
// the stored (or recomputed) probabilities att.
//
//	dp  = dout · vᵀ, then the dropout mask;  dv += dropout(att)ᵀ · dout
//	ds  = att ⊙ (dp − Σ att⊙dp)             (softmax backward)
//	dq  = ds · k / √hs;  dk = dsᵀ · q / √hs
func (b *Backend) AttentionBackward(dqkv, dout, qkv, att []float32, B, T, C, NH int, d Dropout, off uint64) {
	hs := C / NH
	scale := float32(1 / math.Sqrt(float64(hs)))
	ds := d.Scale()
	b.ParallelFor(B*NH, 1, func(lo, hi int) {
		dp := make([]float32, T)
		for bh := lo; bh < hi; bh++ {
			bb, h := bh/NH, bh%NH
			for t := 0; t < T; t++ {
				r := (bb*T + t) * 3 * C
				clear(dqkv[r+h*hs : r+h*hs+hs])
				clear(dqkv[r+C+h*hs : r+C+h*hs+hs])
				clear(dqkv[r+2*C+h*hs : r+2*C+h*hs+hs])
			}
			for t := 0; t < T; t++ {
				row := att[(bh*T+t)*T : (bh*T+t+1)*T]
				g := dout[(bb*T+t)*C+h*hs : (bb*T+t)*C+h*hs+hs]
				var dot float32
				for t2 := 0; t2 <= t; t2++ {
					p := row[t2]
					m := float32(1)
					if d.On() {
						if d.Keep(off + uint64((bh*T+t)*T+t2)) {
							m = ds
						} else {
							m = 0
						}
					}
					vo := (bb*T+t2)*3*C + 2*C + h*hs
					v := qkv[vo : vo+hs]
					dv := dqkv[vo : vo+hs]
					var s float32
					pm := p * m
					for i, gv := range g {
						s += gv * v[i]
						dv[i] += pm * gv
					}
					dp[t2] = s * m
					dot += p * dp[t2]
				}
				qo := (bb*T+t)*3*C + h*hs
				q := qkv[qo : qo+hs]
				dq := dqkv[qo : qo+hs]
				for t2 := 0; t2 <= t; t2++ {
					dsc := row[t2] * (dp[t2] - dot) * scale
					ko := (bb*T+t2)*3*C + C + h*hs
					k := qkv[ko : ko+hs]
					dk := dqkv[ko : ko+hs]
					for i := range q {
						dq[i] += dsc * k[i]
						dk[i] += dsc * q[i]
					}
				}
			}
		}
	})
}
