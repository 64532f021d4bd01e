package cpu

import "math"

// expShiftSSE runs expShift's loop on n elements, n a multiple of 4
// (exp_amd64.s).
//
//go:noescape
func expShiftSSE(x *float32, n int, k *[12]float32, s *[4]float64)

// expShiftVec does expShift on the first len(x) &^ 3 elements with SSE,
// adding to the partial sums s, and returns how many it did.
func expShiftVec(x []float32, m float32, s *[4]float64) int {
	n := len(x) &^ 3
	if n == 0 {
		return 0
	}
	k := [12]float32{m, expLog2e, expMagic, expLn2hi, expLn2lo,
		1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 1.0 / 2, 1, expMin}
	expShiftSSE(&x[0], n, &k, s)
	return n
}

// maxSSE leaves in lanes[j] the largest of lanes[j] and x[4i+j], i < n/4,
// passing over NaNs (exp_amd64.s).
//
//go:noescape
func maxSSE(x *float32, n int, lanes *[4]float32)

// scaleSSE multiplies x[0:n] by s, n a multiple of 4 (exp_amd64.s).
//
//go:noescape
func scaleSSE(x *float32, n int, s float32)

// maxVec returns the largest non-NaN element of x[0:len(x)&^3] as four
// lane maxima reduced in lane order (−Inf where there is none), and how
// many elements it looked at.
func maxVec(x []float32) (float32, int) {
	n := len(x) &^ 3
	if n == 0 {
		return float32(math.Inf(-1)), 0
	}
	inf := float32(math.Inf(-1))
	l := [4]float32{inf, inf, inf, inf}
	maxSSE(&x[0], n, &l)
	m := l[0]
	for _, v := range l[1:] {
		if v > m {
			m = v
		}
	}
	return m, n
}

// scaleVec multiplies the first len(x) &^ 3 elements of x by s and returns
// how many it did.
func scaleVec(x []float32, s float32) int {
	n := len(x) &^ 3
	if n > 0 {
		scaleSSE(&x[0], n, s)
	}
	return n
}
