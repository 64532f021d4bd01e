package cpu

import (
	"math"

	"github.com/gptui/gptui/kernels"
)

// AttentionForward is causal multi-head self-attention on packed q, k, v.
//
//	qkv (B,T,3C): per row q (C), k (C), v (C); head h owns channels h·hs…(h+1)·hs, hs = C/NH
//	att (B,NH,T,T): softmax(q·kᵀ/√hs) with the causal mask, before dropout; kept for backward
//	out (B,T,C):    dropout(att) · v, heads side by side
//	off: index of att[0,0,0,0] in the dropout stream (global sample offset · NH·T·T);
//	     under tensor parallelism d.Heads and d.Head0 place this rank's heads
//
// For each batch row b the work runs in three phases: the score products
// S = q·kᵀ of every head through sgemm (q, k and v are read in place, with a
// row stride of 3C), the causal softmax of all NH·T rows in parallel, and the
// products out = P·v through sgemm. The full T×T products are computed and
// the upper triangle discarded: at CPU sizes the GEMM library's speed is
// worth more than the skipped half. A flash-style kernel that never stores
// att belongs to the GPU backend.
func (b *Backend) AttentionForward(out, att, qkv []float32, B, T, C, NH int, d kernels.Dropout, off uint64) {
	hs := C / NH
	scale := float32(1 / math.Sqrt(float64(hs)))
	var pd []float32 // dropout(att) of one batch row, when dropout is on
	if d.On() {
		pd = make([]float32, NH*T*T)
	}
	for bb := 0; bb < B; bb++ {
		base := bb * T * 3 * C
		for h := 0; h < NH; h++ {
			s := att[(bb*NH+h)*T*T : (bb*NH+h+1)*T*T]
			b.Sgemm(false, true, T, T, hs, scale, qkv[base+h*hs:], 3*C, qkv[base+C+h*hs:], 3*C, 0, s, T)
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
				if pd != nil {
					d.Apply(pd[r*T:(r+1)*T], row, d.AttIndex(off, bb, NH, r, T))
				}
			}
		})
		for h := 0; h < NH; h++ {
			p := att[(bb*NH+h)*T*T : (bb*NH+h+1)*T*T]
			if pd != nil {
				p = pd[h*T*T : (h+1)*T*T]
			}
			b.Sgemm(false, false, T, hs, T, 1, p, T, qkv[base+2*C+h*hs:], 3*C, 0, out[bb*T*C+h*hs:], C)
		}
	}
}

// AttentionBackward computes dqkv (overwritten) from dout, the packed qkv and
// the stored (or recomputed) probabilities att. out, the forward pass's
// output, is unused here: a flash-style backward that keeps only each row's
// log-sum-exp in att needs it for rowsum(dout ⊙ out).
//
//	P' = dropout(att);  dP' = dout · vᵀ;  dv = P'ᵀ · dout;  dP = dropout(dP')
//	dS = att ⊙ (dP − rowsum(att ⊙ dP)) / √hs      (softmax backward, causal rows)
//	dq = dS · k;  dk = dSᵀ · q
//
// In the same three phases per batch row as the forward pass.
func (b *Backend) AttentionBackward(dqkv, dout, out, qkv, att []float32, B, T, C, NH int, d kernels.Dropout, off uint64) {
	hs := C / NH
	scale := float32(1 / math.Sqrt(float64(hs)))
	dp := make([]float32, NH*T*T)
	var pd []float32
	if d.On() {
		pd = make([]float32, NH*T*T)
	}
	for bb := 0; bb < B; bb++ {
		base := bb * T * 3 * C
		if pd != nil {
			b.ParallelFor(NH*T, 16, func(lo, hi int) {
				for r := lo; r < hi; r++ {
					d.Apply(pd[r*T:(r+1)*T], att[(bb*NH*T+r)*T:(bb*NH*T+r+1)*T], d.AttIndex(off, bb, NH, r, T))
				}
			})
		}
		for h := 0; h < NH; h++ {
			p := att[(bb*NH+h)*T*T : (bb*NH+h+1)*T*T]
			if pd != nil {
				p = pd[h*T*T : (h+1)*T*T]
			}
			g := dout[bb*T*C+h*hs:]
			b.Sgemm(false, true, T, T, hs, 1, g, C, qkv[base+2*C+h*hs:], 3*C, 0, dp[h*T*T:(h+1)*T*T], T)
			b.Sgemm(true, false, T, hs, T, 1, p, T, g, C, 0, dqkv[base+2*C+h*hs:], 3*C)
		}
		b.ParallelFor(NH*T, 16, func(lo, hi int) {
			for r := lo; r < hi; r++ {
				t := r % T
				row := att[(bb*NH*T+r)*T : (bb*NH*T+r)*T+t+1]
				g := dp[r*T : (r+1)*T]
				if d.On() {
					d.Apply(g[:t+1], g[:t+1], d.AttIndex(off, bb, NH, r, T))
				}
				var dot float32
				for i, p := range row {
					dot += p * g[i]
				}
				for i, p := range row {
					g[i] = p * (g[i] - dot) * scale
				}
				clear(g[t+1:])
			}
		})
		for h := 0; h < NH; h++ {
			s := dp[h*T*T : (h+1)*T*T]
			b.Sgemm(false, false, T, hs, T, 1, s, T, qkv[base+C+h*hs:], 3*C, 0, dqkv[base+h*hs:], 3*C)
			b.Sgemm(true, false, T, hs, T, 1, s, T, qkv[base+h*hs:], 3*C, 0, dqkv[base+C+h*hs:], 3*C)
		}
	}
}

// AttentionDecode is attention for one new token per sequence against a
// key/value cache: the incremental form of AttentionForward used to generate
// text, whose cost per token grows with the context, not with re-running it.
//
//	q      (B,C):        the new tokens' queries, at position pos
//	kc, vc (B,maxT,C):   cached keys and values; rows 0…pos are filled
//	out    (B,C):        softmax(q·kᵀ/√hs over rows 0…pos) · v, heads side by side
func (b *Backend) AttentionDecode(out, q, kc, vc []float32, B, pos, maxT, C, NH int) {
	hs := C / NH
	scale := float32(1 / math.Sqrt(float64(hs)))
	b.ParallelFor(B*NH, 1, func(lo, hi int) {
		s := make([]float32, pos+1)
		for bh := lo; bh < hi; bh++ {
			bb, h := bh/NH, bh%NH
			qh := q[bb*C+h*hs : bb*C+h*hs+hs]
			for t := 0; t <= pos; t++ {
				k := kc[(bb*maxT+t)*C+h*hs : (bb*maxT+t)*C+h*hs+hs]
				var dot float32
				for i, v := range qh {
					dot += v * k[i]
				}
				s[t] = dot * scale
			}
			inv := float32(1 / expShift(s, maxOf(s)))
			o := out[bb*C+h*hs : bb*C+h*hs+hs]
			clear(o)
			for t := 0; t <= pos; t++ {
				p := s[t] * inv
				v := vc[(bb*maxT+t)*C+h*hs : (bb*maxT+t)*C+h*hs+hs]
				for i := range o {
					o[i] += p * v[i]
				}
			}
		}
	})
}
