package cpu

import (
	"math"

	"github.com/gptui/gptui/kernels"
)

// DropoutForward: out[i] = inp[i]·mask[i]/(1-P), for i in [0, n), element
// indices offset by off. With P = 0 it copies. out may alias inp.
func (b *Backend) DropoutForward(out, inp []float32, d kernels.Dropout, off uint64) {
	defer b.store(out)
	n := len(inp)
	if !d.On() {
		copy(out[:n], inp)
		return
	}
	b.ParallelFor(n, 4096, func(lo, hi int) { dropApply(d, out[lo:hi], inp[lo:hi], off+uint64(lo)) })
}

// DropoutBackward: dinp[i] = dout[i]·mask[i]/(1-P). dinp may alias dout.
func (b *Backend) DropoutBackward(dinp, dout []float32, d kernels.Dropout, off uint64) {
	defer b.store(dinp)
	b.DropoutForward(dinp, dout, d, off)
}

// dropApply is d.Apply(out, in, first), a vector kernel doing what it can
// (dropVec): the same mask, so the same bits.
func dropApply(d kernels.Dropout, out, in []float32, first uint64) {
	out = out[:len(in)] // the vector kernel's bounds: a short out panics, as in Apply
	n := dropVec(d, out, in, first)
	d.Apply(out[n:], in[n:], first+uint64(n))
}

// keepThreshold restates Dropout.Keep's test for 0 < p < 1 on the hash's
// top 24 bits h: Keep compares u = h·2⁻²⁴ with p, both exact in float32,
// so u ≥ p exactly when h ≥ p·2²⁴, that is h ≥ ⌈p·2²⁴⌉.
func keepThreshold(p float32) uint64 {
	return uint64(math.Ceil(float64(p) * (1 << 24)))
}
