package cpu

// EncoderForward sums token and position embeddings.
//
//	out  (B,T,C) = wte[inp[b,t]] + wpe[t]
//	inp  (B,T)   token ids
//	wte  (Vp,C), wpe (maxT,C)
func (b *Backend) EncoderForward(out []float32, inp []int32, wte, wpe []float32, B, T, C int) {
	defer b.store(out)
	b.EncoderShardForward(out, inp, wte, 0, wpe, B, T, C)
}

// EncoderBackward accumulates the embedding gradients.
//
//	dwte[inp[b,t]] += dout[b,t];  dwpe[t] += dout[b,t]
func (b *Backend) EncoderBackward(dwte, dwpe, dout []float32, inp []int32, B, T, C int) {
	defer b.store(dwte, dwpe)
	b.EncoderShardBackward(dwte, 0, dwpe, dout, inp, B, T, C)
}

// EncoderShardForward is the vocabulary-parallel embedding: wte holds rows
// vlo … vlo+rows−1 of the token embedding, and a token outside them
// contributes zeros (another rank holds it; the ranks' outputs are summed).
// wpe may be nil: then no position embedding is added (only one rank of a
// tensor-parallel group adds it).
//
//	out (B,T,C) = [vlo ≤ inp[b,t] < vlo+rows] · wte[inp[b,t]−vlo] + wpe[t]
func (b *Backend) EncoderShardForward(out []float32, inp []int32, wte []float32, vlo int, wpe []float32, B, T, C int) {
	defer b.store(out)
	rows := len(wte) / C
	b.ParallelFor(B*T, 16, func(lo, hi int) {
		for bt := lo; bt < hi; bt++ {
			o := out[bt*C : (bt+1)*C]
			clear(o)
			if v := int(inp[bt]) - vlo; v >= 0 && v < rows {
				copy(o, wte[v*C:(v+1)*C])
			}
			if wpe != nil {
				t := bt % T
				for i, p := range wpe[t*C : (t+1)*C] {
					o[i] += p
				}
			}
		}
	})
}

// EncoderShardBackward accumulates the gradients of EncoderShardForward:
// dwte for the tokens in this rank's rows, and dwpe unless it is nil.
//
// Work is split over channels, so rows that share a token never race and the
// sum over rows runs in a fixed order.
func (b *Backend) EncoderShardBackward(dwte []float32, vlo int, dwpe, dout []float32, inp []int32, B, T, C int) {
	defer b.store(dwte, dwpe)
	rows := len(dwte) / C
	b.ParallelFor(C, 16, func(lo, hi int) {
		for bt := 0; bt < B*T; bt++ {
			d := dout[bt*C+lo : bt*C+hi]
			if v := int(inp[bt]) - vlo; v >= 0 && v < rows {
				dw := dwte[v*C+lo : v*C+hi]
				for i, g := range d {
					dw[i] += g
				}
			}
			if dwpe != nil {
				t := bt % T
				dp := dwpe[t*C+lo : t*C+hi]
				for i, g := range d {
					dp[i] += g
				}
			}
		}
	})
}
