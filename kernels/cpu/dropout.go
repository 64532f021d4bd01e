package cpu

import "github.com/gptui/gptui/kernels"

// DropoutForward: out[i] = inp[i]·mask[i]/(1-P), for i in [0, n), element
// indices offset by off. With P = 0 it copies. out may alias inp.
func (b *Backend) DropoutForward(out, inp []float32, d kernels.Dropout, off uint64) {
	defer b.store(out)
	n := len(inp)
	if !d.On() {
		copy(out[:n], inp)
		return
	}
	b.ParallelFor(n, 4096, func(lo, hi int) { d.Apply(out[lo:hi], inp[lo:hi], off+uint64(lo)) })
}

// DropoutBackward: dinp[i] = dout[i]·mask[i]/(1-P). dinp may alias dout.
func (b *Backend) DropoutBackward(dinp, dout []float32, d kernels.Dropout, off uint64) {
	defer b.store(dinp)
	b.DropoutForward(dinp, dout, d, off)
}
