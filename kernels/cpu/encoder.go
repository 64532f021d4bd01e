package cpu

// EncoderForward sums token and position embeddings.
//
//	out  (B,T,C) = wte[inp[b,t]] + wpe[t]
//	inp  (B,T)   token ids
//	wte  (Vp,C), wpe (maxT,C)
func (b *Backend) EncoderForward(out []float32, inp []int32, wte, wpe []float32, B, T, C int) {
	b.ParallelFor(B*T, 16, func(lo, hi int) {
		for bt := lo; bt < hi; bt++ {
			t := bt % T
			o := out[bt*C : (bt+1)*C]
			we := wte[int(inp[bt])*C : int(inp[bt])*C+C]
			pe := wpe[t*C : (t+1)*C]
			for i := range o {
				o[i] = we[i] + pe[i]
			}
		}
	})
}

// EncoderBackward accumulates the embedding gradients.
//
//	dwte[inp[b,t]] += dout[b,t];  dwpe[t] += dout[b,t]
//
// Work is split over channels, so rows that share a token never race and the
// sum over rows runs in a fixed order.
func (b *Backend) EncoderBackward(dwte, dwpe, dout []float32, inp []int32, B, T, C int) {
	b.ParallelFor(C, 16, func(lo, hi int) {
		for bt := 0; bt < B*T; bt++ {
			t := bt % T
			d := dout[bt*C+lo : bt*C+hi]
			dw := dwte[int(inp[bt])*C+lo : int(inp[bt])*C+hi]
			dp := dwpe[t*C+lo : t*C+hi]
			for i, g := range d {
				dw[i] += g
				dp[i] += g
			}
		}
	})
}
