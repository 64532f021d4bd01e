package cpu

import "math"

// exp32 is eˣ in float32 precision (relative error under 3e-7, about two
// float32 ulps, wherever the result is a normal float32), several times
// faster than math.Exp: x = k·ln2 + r with |r| ≤ ln2/2, eʳ by a degree-6
// polynomial, 2ᵏ by building the exponent bits. k is rounded by adding
// 1.5·2²³, which leaves round(x·log2e) in the low mantissa bits. Softmax and
// GELU spend their time here.
func exp32(x float32) float32 {
	if x < expMin || x > 88 {
		return expSlow(x)
	}
	t := x*expLog2e + expMagic
	k := int32(math.Float32bits(t)) - int32(math.Float32bits(expMagic))
	kf := t - expMagic
	r := x - kf*expLn2hi - kf*expLn2lo
	// Taylor coefficients of eʳ to r⁶; |r| ≤ 0.347 keeps the tail under 1e-8.
	p := 1 + r*(1+r*(1.0/2+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720))))))
	return p * math.Float32frombits(uint32(k+127)<<23)
}

// expSlow covers the ends of the range: 0 below float32's normals, and
// math.Exp where 2ᵏ alone would overflow.
func expSlow(x float32) float32 {
	if x < expMin {
		return 0
	}
	return float32(math.Exp(float64(x)))
}

// The constants of exp32 and expShift, shared with the vector loop.
const (
	expLog2e = 1.44269504088896341
	expLn2hi = 0.693359375
	expLn2lo = -2.12194440e-4
	expMagic = 12582912 // 1.5·2²³
	expMin   = -87.3    // below it eˣ is not a normal float32: 0
)

// expShift replaces each x[i] by e^(x[i]−m) and returns their sum in float64.
// It is exp32 written out in a loop for softmax rows, where m is the row's
// maximum, so every argument is ≤ 0. On amd64 the bulk runs four lanes at a
// time (exp_amd64.s) with the same bits; the sum is accumulated in four
// partial sums, element i into s[i&3], either way.
func expShift(x []float32, m float32) float64 {
	// Four partial sums break the chain of dependent float64 additions.
	var s [4]float64
	expShiftFrom(x, m, &s, expShiftVec(x, m, &s))
	return (s[0] + s[1]) + (s[2] + s[3])
}

// expSum returns Σ e^(x[i]−m) in float64, added in order: the bits of
// the loop `for _, v := range x { s += float64(exp32(v − m)) }` where m is
// x's maximum (a NaN difference included), without writing x. The
// exponentials are taken a block at a time on the stack by expShift's
// vector loop, several times faster than exp32 element by element.
func expSum(x []float32, m float32) float64 {
	var buf [256]float32
	var sum float64
	for len(x) > 0 {
		b := buf[:copy(buf[:], x)]
		expShift(b, m)
		for i, e := range b {
			if v := x[i] - m; v != v {
				sum += float64(v) // exp32 of a NaN is NaN; expShift gives 0
			} else {
				sum += float64(e)
			}
		}
		x = x[len(b):]
	}
	return sum
}

// expShiftFrom is expShift's scalar loop over x[from:], adding e^(x[i]−m)
// to s[i&3].
func expShiftFrom(x []float32, m float32, s *[4]float64, from int) {
	magicBits := int32(math.Float32bits(expMagic))
	for i := from; i < len(x); i++ {
		v := x[i] - m
		e := float32(0)
		if v >= expMin {
			t := v*expLog2e + expMagic
			k := int32(math.Float32bits(t)) - magicBits
			kf := t - expMagic
			r := v - kf*expLn2hi - kf*expLn2lo
			p := 1 + r*(1+r*(1.0/2+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720))))))
			e = p * math.Float32frombits(uint32(k+127)<<23)
		}
		x[i] = e
		s[i&3] += float64(e)
	}
}

// maxOf returns the largest element of a non-empty x: x[0], replaced by
// each later element greater than the maximum so far, so a NaN counts only
// as x[0]. On amd64 the bulk is taken four lanes at a time, which gives the
// same value.
func maxOf(x []float32) float32 {
	m := x[0]
	if m != m {
		return m // NaN: no element is greater
	}
	vm, n := maxVec(x)
	if vm > m {
		m = vm
	}
	for _, v := range x[n:] {
		if v > m {
			m = v
		}
	}
	return m
}

// scale multiplies every element of x by s.
func scale(x []float32, s float32) {
	for i := scaleVec(x, s); i < len(x); i++ {
		x[i] *= s
	}
}
