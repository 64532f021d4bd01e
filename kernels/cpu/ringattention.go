package cpu

import "math"

// Ring attention: the kernels of context parallelism. A rank r of a
// context-parallel group of cp ranks holds, of each of the B sequences,
// two chunks of c positions — chunk r and chunk 2·cp−1−r, which balances
// the causal mask's work — in 2·B·c rows laid out sequence-major (B,2c):
// row b·2c+half·c+t holds position ringChunk(r, half, cp)·c+t of sequence
// b, so each sequence's 2c rows are contiguous, its chunk r then its chunk
// 2·cp−1−r. A key/value block is laid out the same way.
// Its queries fold in one key/value block per step of the ring, every
// rank's in turn, by FlashAttention's online softmax.

// ringChunk is the chunk of its sequences that half (0 or 1) of rank r's
// rows holds.
func ringChunk(r, half, cp int) int {
	if half == 0 {
		return r
	}
	return 2*cp - 1 - r
}

// ringRow0 is the first of the c rows that hold half (0 or 1) of sequence
// b's positions: row b·2c + half·c.
func ringRow0(b, half, c int) int { return (2*b + half) * c }

// ringPair is a query half of one rank meeting a key half of another whose
// chunk is not wholly in the queries' future; diag marks the pair of one
// chunk, which the causal mask cuts on its diagonal.
type ringPair struct {
	qh, kh int
	diag   bool
}

// ringPairs lists the (query half, key half) pairs of rank qr's queries and
// rank kr's keys that attend: two for qr ≠ kr, three for qr = kr.
func ringPairs(cp, qr, kr int) []ringPair {
	var ps []ringPair
	for qh := 0; qh < 2; qh++ {
		for kh := 0; kh < 2; kh++ {
			qc, kc := ringChunk(qr, qh, cp), ringChunk(kr, kh, cp)
			if kc <= qc {
				ps = append(ps, ringPair{qh, kh, kc == qc})
			}
		}
	}
	return ps
}

// RingKV copies the key and value heads of each of rows rows of qkv
// (rows,(NH+2·NKV)·hd) into kv (rows,2·NKV·hd): the block that travels
// around the ring.
func (b *Backend) RingKV(kv, qkv []float32, rows, NH, NKV, hd int) {
	defer b.store(kv)
	ld, ckv := (NH+2*NKV)*hd, 2*NKV*hd
	b.ParallelFor(rows, 64, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			copy(kv[i*ckv:(i+1)*ckv], qkv[i*ld+NH*hd:(i+1)*ld])
		}
	})
}

// RingKVGrad writes the key and value parts of each row of dqkv
// (rows,(NH+2·NKV)·hd) from dkv (rows,2·NKV·hd), leaving the query part.
func (b *Backend) RingKVGrad(dqkv, dkv []float32, rows, NH, NKV, hd int) {
	defer b.store(dqkv)
	ld, ckv := (NH+2*NKV)*hd, 2*NKV*hd
	b.ParallelFor(rows, 64, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			copy(dqkv[i*ld+NH*hd:(i+1)*ld], dkv[i*ckv:(i+1)*ckv])
		}
	})
}

// RingAttentionForward folds the key/value block kv of rank kr into the
// attention of rank qr's queries, the query heads of qkv:
//
//	qkv   (rows,(NH+2·NKV)·hd), rows = 2·B·c, rank qr's layout; query head h reads key/value head h/G, G = NH/NKV
//	kv    (rows,2·NKV·hd): rank kr's key heads, then its value heads
//	out   (rows,NH·hd): Σ_j e^(s_j−m)·v_j over the keys folded so far, not yet divided by l
//	stats (rows,NH,2): m, the largest score s = q·k/√hd so far, and l = Σ_j e^(s_j−m)
//
// With first set it starts the fold: out = 0, m = −Inf, l = 0. For each
// query chunk and key chunk of one sequence that attend (the key chunk not
// after the query chunk; the mask cuts the chunk they share on its
// diagonal), the c×c scores of every head come from sgemm (q, k and v read
// in place with their row strides), each of the NH·c query rows is folded
// in parallel — m' = max(m, max_j s_j), out and l scaled by e^(m−m'),
// l += Σ_j e^(s_j−m') summed in float64 — and out += P·v through sgemm.
// A block wholly in the queries' future changes nothing.
func (b *Backend) RingAttentionForward(out, stats, qkv, kv []float32, B, c, NH, NKV, hd, cp, qr, kr int, first bool) {
	defer b.store(out, stats)
	rows, C := 2*B*c, NH*hd
	if first {
		clear(out[:rows*C])
		inf := float32(math.Inf(-1))
		for i := 0; i < rows*NH; i++ {
			stats[2*i], stats[2*i+1] = inf, 0
		}
	}
	pairs := ringPairs(cp, qr, kr)
	if len(pairs) == 0 {
		return
	}
	ld, ldkv, G := (NH+2*NKV)*hd, 2*NKV*hd, NH/NKV
	vofs := NKV * hd // the value heads in a kv row
	sc := float32(1 / math.Sqrt(float64(hd)))
	s, done := b.scratch(NH * c * c) // written whole by each pair's products
	defer done()
	for _, p := range pairs {
		for bb := 0; bb < B; bb++ {
			q0, k0 := ringRow0(bb, p.qh, c), ringRow0(bb, p.kh, c) // the chunks' first rows
			for h := 0; h < NH; h++ {
				b.sgemm(false, true, c, c, hd, sc, qkv[q0*ld+h*hd:], ld, kv[k0*ldkv+h/G*hd:], ldkv, 0, s[h*c*c:(h+1)*c*c], c)
			}
			b.ParallelFor(NH*c, 16, func(lo, hi int) {
				for r := lo; r < hi; r++ { // r = h·c + t
					h, t := r/c, r%c
					row := s[r*c : (r+1)*c]
					n := c
					if p.diag {
						n = t + 1
					}
					st := stats[((q0+t)*NH+h)*2 : ((q0+t)*NH+h)*2+2]
					m0 := st[0]
					m := max(m0, maxOf(row[:n]))
					sum := expShift(row[:n], m)
					clear(row[n:])
					alpha := exp32(m0 - m) // 0 while m0 is −Inf
					st[0], st[1] = m, float32(float64(st[1])*float64(alpha)+sum)
					if alpha != 1 {
						o := (q0+t)*C + h*hd
						scale(out[o:o+hd], alpha)
					}
				}
			})
			for h := 0; h < NH; h++ {
				b.sgemm(false, false, c, hd, c, 1, s[h*c*c:(h+1)*c*c], c, kv[k0*ldkv+vofs+h/G*hd:], ldkv, 1, out[q0*C+h*hd:], C)
			}
		}
	}
}

// RingAttentionFinish ends the fold: out (rows,NH·hd) /= l and
// lse (rows,NH) = m + ln l, from stats (rows,NH,2).
func (b *Backend) RingAttentionFinish(out, lse, stats []float32, rows, NH, hd int) {
	defer b.store(out, lse)
	b.ParallelFor(rows*NH, 64, func(lo, hi int) {
		for i := lo; i < hi; i++ { // i = row·NH + h: out's head i
			m, l := stats[2*i], stats[2*i+1]
			scale(out[i*hd:(i+1)*hd], float32(1/float64(l)))
			lse[i] = m + float32(math.Log(float64(l)))
		}
	})
}

// RingAttentionDelta writes delta (rows,NH) = Σ over each head's hd
// channels of dout·out, both (rows,NH·hd), summed in float64: the rowsum
// of P∘dP the softmax backward needs, without P.
func (b *Backend) RingAttentionDelta(delta, dout, out []float32, rows, NH, hd int) {
	defer b.store(delta)
	b.ParallelFor(rows*NH, 64, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			var sum float64
			o := out[i*hd : (i+1)*hd]
			for j, g := range dout[i*hd : (i+1)*hd] {
				sum += float64(g) * float64(o[j])
			}
			delta[i] = float32(sum)
		}
	})
}

// RingAttentionBackward accumulates the gradients of the fold of block kv
// (rank kr) into rank qr's attention, FlashAttention-2's backward with
// lse and delta (rows,NH) from RingAttentionFinish and RingAttentionDelta:
//
//	P = exp(S − lse), S = q·kᵀ/√hd with the causal mask;  dP = dout·vᵀ
//	dS = P∘(dP − delta)/√hd
//	dq += dS·k  (the query part of dqkv; its key/value parts are untouched)
//	dk += Σ_group dSᵀ·q;  dv += Σ_group Pᵀ·dout  (dkv, rows,2·NKV·hd)
//
// The pairs of chunks as RingAttentionForward's, in the same phases: S and
// dP of every head through sgemm, P and dS row by row in parallel, then the
// four products through sgemm, heads in order, so the sums do not depend
// on the number of threads.
func (b *Backend) RingAttentionBackward(dqkv, dkv, dout, qkv, kv, lse, delta []float32, B, c, NH, NKV, hd, cp, qr, kr int) {
	defer b.store(dqkv, dkv)
	pairs := ringPairs(cp, qr, kr)
	if len(pairs) == 0 {
		return
	}
	ld, ldkv, C, G := (NH+2*NKV)*hd, 2*NKV*hd, NH*hd, NH/NKV
	vofs := NKV * hd
	sc := float32(1 / math.Sqrt(float64(hd)))
	s, done := b.scratch(NH * c * c) // both written whole by each pair's products
	defer done()
	dp, done := b.scratch(NH * c * c)
	defer done()
	for _, p := range pairs {
		for bb := 0; bb < B; bb++ {
			q0, k0 := ringRow0(bb, p.qh, c), ringRow0(bb, p.kh, c)
			for h := 0; h < NH; h++ {
				kvh := h / G * hd
				b.sgemm(false, true, c, c, hd, sc, qkv[q0*ld+h*hd:], ld, kv[k0*ldkv+kvh:], ldkv, 0, s[h*c*c:(h+1)*c*c], c)
				b.sgemm(false, true, c, c, hd, 1, dout[q0*C+h*hd:], C, kv[k0*ldkv+vofs+kvh:], ldkv, 0, dp[h*c*c:(h+1)*c*c], c)
			}
			b.ParallelFor(NH*c, 16, func(lo, hi int) {
				for r := lo; r < hi; r++ { // r = h·c + t
					h, t := r/c, r%c
					n := c
					if p.diag {
						n = t + 1
					}
					row, g := s[r*c:(r+1)*c], dp[r*c:(r+1)*c]
					i := (q0+t)*NH + h
					expShift(row[:n], lse[i])
					clear(row[n:])
					d := delta[i]
					for j, pj := range row[:n] {
						g[j] = pj * (g[j] - d) * sc
					}
					clear(g[n:])
				}
			})
			for h := 0; h < NH; h++ {
				kvh := h / G * hd
				ph, dsh := s[h*c*c:(h+1)*c*c], dp[h*c*c:(h+1)*c*c]
				b.sgemm(true, false, c, hd, c, 1, ph, c, dout[q0*C+h*hd:], C, 1, dkv[k0*ldkv+vofs+kvh:], ldkv)
				b.sgemm(false, false, c, hd, c, 1, dsh, c, kv[k0*ldkv+kvh:], ldkv, 1, dqkv[q0*ld+h*hd:], ld)
				b.sgemm(true, false, c, hd, c, 1, dsh, c, qkv[q0*ld+h*hd:], ld, 1, dkv[k0*ldkv+kvh:], ldkv)
			}
		}
	}
}
