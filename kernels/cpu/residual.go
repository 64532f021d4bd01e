package cpu

import "fmt"

// ResidualForward adds two streams: out = a + c. out may alias a.
func (b *Backend) ResidualForward(out, a, c []float32) {
	defer b.store(out)
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

// Copy sets dst to src (of one length).
func (b *Backend) Copy(dst, src []float32) {
	defer b.store(dst)
	if len(dst) != len(src) {
		panic(fmt.Sprintf("cpu: Copy of %d elements into %d", len(src), len(dst)))
	}
	b.ParallelFor(len(dst), 1<<16, func(lo, hi int) { copy(dst[lo:hi], src[lo:hi]) })
}

// Scale multiplies every element of x by s.
func (b *Backend) Scale(x []float32, s float32) {
	defer b.store(x)
	b.ParallelFor(len(x), 1<<14, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x[i] *= s
		}
	})
}
