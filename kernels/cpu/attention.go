package cpu

import (
	"math"

	"github.com/gptui/gptui/kernels"
)

// AttentionForward is causal multi-head self-attention on packed q, k, v:
// GQAForward with one key/value head per query head.
//
//	qkv (B,T,3C): per row q (C), k (C), v (C); head h owns channels h·hs…(h+1)·hs, hs = C/NH
//	att (B,NH,T,T), out (B,T,C): as GQAForward's
func (b *Backend) AttentionForward(out, att, qkv []float32, B, T, C, NH int, d kernels.Dropout, off uint64) {
	defer b.store(out, att)
	b.GQAForward(out, att, qkv, B, T, NH, NH, C/NH, d, off)
}

// AttentionBackward is GQABackward with one key/value head per query head.
func (b *Backend) AttentionBackward(dqkv, dout, out, qkv, att []float32, B, T, C, NH int, d kernels.Dropout, off uint64) {
	defer b.store(dqkv)
	b.GQABackward(dqkv, dout, out, qkv, att, B, T, NH, NH, C/NH, d, off)
}

// AttentionDecode is GQADecode with one key/value head per query head:
// q (B,C), kc and vc (B,maxT,C), out (B,C).
func (b *Backend) AttentionDecode(out, q, kc, vc []float32, B, pos, maxT, C, NH int) {
	defer b.store(out)
	b.GQADecode(out, q, kc, vc, B, pos, maxT, NH, NH, C/NH)
}

// GQAForward is causal grouped-query self-attention on packed q, k, v.
//
//	qkv (B,T,(NH+2·NKV)·hd): per row NH query heads, NKV key heads, NKV value heads, hd each;
//	                         query head h reads key/value head h/G, G = NH/NKV
//	att (B,NH,T,T): softmax(q·kᵀ/√hd) with the causal mask, before dropout; kept for backward
//	out (B,T,NH·hd):  dropout(att) · v, query heads side by side
//	off: index of att[0,0,0,0] in the dropout stream (global sample offset · NH·T·T);
//	     under tensor parallelism d.Heads and d.Head0 place this rank's query heads
//
// For each batch row b the work runs in three phases: the score products
// S = q·kᵀ of every head through sgemm (q, k and v are read in place, with a
// row stride of (NH+2·NKV)·hd), the causal softmax of all NH·T rows in
// parallel, and the products out = P·v through sgemm. The full T×T products
// are computed and the upper triangle discarded: at CPU sizes the GEMM
// library's speed is worth more than the skipped half. A flash-style kernel
// that never stores att belongs to the GPU backend.
func (b *Backend) GQAForward(out, att, qkv []float32, B, T, NH, NKV, hd int, d kernels.Dropout, off uint64) {
	defer b.store(out, att)
	ld, C, G := (NH+2*NKV)*hd, NH*hd, NH/NKV
	kofs, vofs := NH*hd, (NH+NKV)*hd // the key and value heads in a row
	scale := float32(1 / math.Sqrt(float64(hd)))
	var pd []float32 // dropout(att) of one batch row, when dropout is on
	if d.On() {
		var done func()
		pd, done = b.scratch(NH * T * T)
		defer done()
	}
	for bb := 0; bb < B; bb++ {
		base := bb * T * ld
		for h := 0; h < NH; h++ {
			s := att[(bb*NH+h)*T*T : (bb*NH+h+1)*T*T]
			b.sgemm(false, true, T, T, hd, scale, qkv[base+h*hd:], ld, qkv[base+kofs+h/G*hd:], ld, 0, s, T)
		}
		b.ParallelFor(NH*T, 16, func(lo, hi int) {
			for r := lo; r < hi; r++ { // r = h·T + t
				t := r % T
				row := att[(bb*NH*T+r)*T : (bb*NH*T+r+1)*T]
				causal := row[:t+1]
				sum := expShift(causal, maxOf(causal))
				inv := float32(1 / sum)
				for i := range causal {
					causal[i] *= inv
				}
				clear(row[t+1:])
				if pd != nil { // the row's zeros stay zeros
					dropApply(d, pd[r*T:r*T+t+1], causal, d.AttIndex(off, bb, NH, r, T))
					clear(pd[r*T+t+1 : (r+1)*T])
				}
			}
		})
		for h := 0; h < NH; h++ {
			p := att[(bb*NH+h)*T*T : (bb*NH+h+1)*T*T]
			if pd != nil {
				p = pd[h*T*T : (h+1)*T*T]
			}
			b.sgemm(false, false, T, hd, T, 1, p, T, qkv[base+vofs+h/G*hd:], ld, 0, out[bb*T*C+h*hd:], C)
		}
	}
}

// GQABackward computes dqkv (overwritten) from dout, the packed qkv and the
// stored (or recomputed) probabilities att.
//
//	P' = dropout(att);  dP' = dout · vᵀ;  dP = dropout(dP')
//	dS = att ⊙ (dP − D) / √hd      (softmax backward, causal rows)
//	dq = dS · k;  dk = Σ_group dSᵀ · q;  dv = Σ_group P'ᵀ · dout
//
// D = rowsum(att ⊙ dP) in float32; when out, the forward pass's output, is
// bfloat16 activations (kernels.Activations under bf16), D = rowsum(dout ⊙
// out) instead, as the GPU's flash-style backward takes it (it keeps each
// row's log-sum-exp, not att): the same sum, but for out's rounding, which
// then shows in dS as it does on the GPU.
//
// In the same three phases per batch row as the forward pass. A key/value
// head's gradients sum its group's query heads in head order (the first
// product overwrites, the others add), so the result does not depend on the
// number of threads.
func (b *Backend) GQABackward(dqkv, dout, out, qkv, att []float32, B, T, NH, NKV, hd int, d kernels.Dropout, off uint64) {
	defer b.store(dqkv)
	ld, C, G := (NH+2*NKV)*hd, NH*hd, NH/NKV
	kofs, vofs := NH*hd, (NH+NKV)*hd
	scale := float32(1 / math.Sqrt(float64(hd)))
	fromOut := b.isHalf(out)
	dp, done := b.scratch(NH * T * T) // each head's written whole by its first product
	defer done()
	var pd []float32
	if d.On() {
		pd, done = b.scratch(NH * T * T)
		defer done()
	}
	for bb := 0; bb < B; bb++ {
		base := bb * T * ld
		if pd != nil {
			b.ParallelFor(NH*T, 16, func(lo, hi int) {
				for r := lo; r < hi; r++ { // the causal part: the rest of the row is zeros
					t := r % T
					dropApply(d, pd[r*T:r*T+t+1], att[(bb*NH*T+r)*T:(bb*NH*T+r)*T+t+1], d.AttIndex(off, bb, NH, r, T))
					clear(pd[r*T+t+1 : (r+1)*T])
				}
			})
		}
		for h := 0; h < NH; h++ {
			p := att[(bb*NH+h)*T*T : (bb*NH+h+1)*T*T]
			if pd != nil {
				p = pd[h*T*T : (h+1)*T*T]
			}
			g := dout[bb*T*C+h*hd:]
			kv, beta := h/G*hd, float32(min(h%G, 1)) // the group's first head overwrites
			b.sgemm(false, true, T, T, hd, 1, g, C, qkv[base+vofs+kv:], ld, 0, dp[h*T*T:(h+1)*T*T], T)
			b.sgemm(true, false, T, hd, T, 1, p, T, g, C, beta, dqkv[base+vofs+kv:], ld)
		}
		b.ParallelFor(NH*T, 16, func(lo, hi int) {
			for r := lo; r < hi; r++ {
				t := r % T
				row := att[(bb*NH*T+r)*T : (bb*NH*T+r)*T+t+1]
				g := dp[r*T : (r+1)*T]
				if d.On() {
					dropApply(d, g[:t+1], g[:t+1], d.AttIndex(off, bb, NH, r, T))
				}
				var dot float32
				if fromOut {
					h := r / T
					o, gr := out[(bb*T+t)*C+h*hd:][:hd], dout[(bb*T+t)*C+h*hd:][:hd]
					var sum float64
					for i, v := range o {
						sum += float64(gr[i]) * float64(v)
					}
					dot = float32(sum)
				} else {
					for i, p := range row {
						dot += p * g[i]
					}
				}
				for i, p := range row {
					g[i] = p * (g[i] - dot) * scale
				}
				clear(g[t+1:])
			}
		})
		for h := 0; h < NH; h++ {
			s := dp[h*T*T : (h+1)*T*T]
			kv, beta := h/G*hd, float32(min(h%G, 1))
			b.sgemm(false, false, T, hd, T, 1, s, T, qkv[base+kofs+kv:], ld, 0, dqkv[base+h*hd:], ld)
			b.sgemm(true, false, T, hd, T, 1, s, T, qkv[base+h*hd:], ld, beta, dqkv[base+kofs+kv:], ld)
		}
	}
}

// GQADecode is grouped-query attention for one new token per sequence
// against a key/value cache: the incremental form of GQAForward used to
// generate text, whose cost per token grows with the context, not with
// re-running it.
//
//	q      (B,NH·hd):         the new tokens' queries, at position pos
//	kc, vc (B,maxT,NKV·hd):   cached keys and values; rows 0…pos are filled
//	out    (B,NH·hd):         softmax(q·kᵀ/√hd over rows 0…pos) · v, query head h
//	                          reading key/value head h/(NH/NKV)
func (b *Backend) GQADecode(out, q, kc, vc []float32, B, pos, maxT, NH, NKV, hd int) {
	defer b.store(out)
	C, CKV, G := NH*hd, NKV*hd, NH/NKV
	scale := float32(1 / math.Sqrt(float64(hd)))
	b.ParallelFor(B*NH, 1, func(lo, hi int) {
		s := make([]float32, pos+1)
		for bh := lo; bh < hi; bh++ {
			bb, h := bh/NH, bh%NH
			kv := h / G * hd
			qh := q[bb*C+h*hd : bb*C+h*hd+hd]
			for t := 0; t <= pos; t++ {
				k := kc[(bb*maxT+t)*CKV+kv : (bb*maxT+t)*CKV+kv+hd]
				var dot float32
				for i, v := range qh {
					dot += v * k[i]
				}
				s[t] = dot * scale
			}
			inv := float32(1 / expShift(s, maxOf(s)))
			o := out[bb*C+h*hd : bb*C+h*hd+hd]
			clear(o)
			for t := 0; t <= pos; t++ {
				p := s[t] * inv
				v := vc[(bb*maxT+t)*CKV+kv : (bb*maxT+t)*CKV+kv+hd]
				for i := range o {
					o[i] += p * v[i]
				}
			}
		}
	})
}
