package cpu

// ResidualForward adds two streams: out = a + c. out may alias a.
func (b *Backend) ResidualForward(out, a, c []float32) {
	b.ParallelFor(len(a), 8192, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			out[i] = a[i] + c[i]
		}
	})
}

// Zero sets every element of x to 0.
func (b *Backend) Zero(x []float32) {
	b.ParallelFor(len(x), 1<<16, func(lo, hi int) { clear(x[lo:hi]) })
}

// Scale multiplies every element of x by s.
func (b *Backend) Scale(x []float32, s float32) {
	b.ParallelFor(len(x), 1<<14, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x[i] *= s
		}
	})
}
