package cpu

import "unsafe"

// RoPEForward applies rotary position embeddings (Hugging Face's
// rotate_half layout) to the first heads·hd channels of each row.
//
//	inp, out (B,T,C): row (b,t) at position p = pos0+t; out may alias inp
//	table (maxT,hd):  row p = cos(p·θ_i), i < hd/2, then sin(p·θ_i) (kernels.RoPE.Table)
//	each head x (hd) of channels 0 … heads·hd−1, for i < hd/2, h = hd/2:
//	  out[i]   = x[i]·cos_i − x[h+i]·sin_i
//	  out[h+i] = x[h+i]·cos_i + x[i]·sin_i
//	channels heads·hd … C−1 are copied
func (b *Backend) RoPEForward(out, inp, table []float32, B, T, C, heads, hd, pos0 int) {
	defer b.store(out)
	b.rope(out, inp, table, B, T, C, heads, hd, pos0, 1)
}

// RoPEBackward is RoPEForward's transpose, the rotation by the opposite
// angle, on the gradient (dinp overwritten; it may alias dout):
//
//	dinp[i]   = dout[i]·cos_i + dout[h+i]·sin_i
//	dinp[h+i] = dout[h+i]·cos_i − dout[i]·sin_i
func (b *Backend) RoPEBackward(dinp, dout, table []float32, B, T, C, heads, hd, pos0 int) {
	defer b.store(dinp)
	b.rope(dinp, dout, table, B, T, C, heads, hd, pos0, -1)
}

// rope rotates by the table's angles times sign (1 or −1).
func (b *Backend) rope(out, inp, table []float32, B, T, C, heads, hd, pos0 int, sign float32) {
	h := hd / 2
	alias := len(out) > 0 && len(inp) > 0 && unsafe.SliceData(out) == unsafe.SliceData(inp)
	b.ParallelFor(B*T, max(1, 4096/max(C, 1)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			p := pos0 + r%T
			cos, sin := table[p*hd:p*hd+h], table[p*hd+h:(p+1)*hd]
			x, o := inp[r*C:(r+1)*C], out[r*C:(r+1)*C]
			for k := 0; k < heads; k++ {
				x1, x2 := x[k*hd:k*hd+h], x[k*hd+h:(k+1)*hd]
				o1, o2 := o[k*hd:k*hd+h], o[k*hd+h:(k+1)*hd]
				for i, c := range cos {
					s := sign * sin[i]
					a, bb := x1[i], x2[i]
					o1[i] = a*c - bb*s
					o2[i] = bb*c + a*s
				}
			}
			if !alias {
				copy(o[heads*hd:], x[heads*hd:])
			}
		}
	})
}
