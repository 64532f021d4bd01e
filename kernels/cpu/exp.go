package cpu

import "math"

// exp32 is eˣ in float32 precision (relative error under 3e-7, about two
// float32 ulps, wherever the result is a normal float32), several times
// faster than math.Exp: x = k·ln2 + r with |r| ≤ ln2/2, eʳ by a degree-6
// polynomial, 2ᵏ by building the exponent bits. k is rounded by adding
// 1.5·2²³, which leaves round(x·log2e) in the low mantissa bits. Softmax and
// GELU spend their time here.
func exp32(x float32) float32 {
	if x < -87.3 || x > 88 {
		return expSlow(x)
	}
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693359375
		ln2lo = -2.12194440e-4
		magic = 12582912 // 1.5·2²³
	)
	t := x*log2e + magic
	k := int32(math.Float32bits(t)) - int32(math.Float32bits(magic))
	kf := t - magic
	r := x - kf*ln2hi - kf*ln2lo
	// Taylor coefficients of eʳ to r⁶; |r| ≤ 0.347 keeps the tail under 1e-8.
	p := 1 + r*(1+r*(1.0/2+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720))))))
	return p * math.Float32frombits(uint32(k+127)<<23)
}

// expSlow covers the ends of the range: 0 below float32's normals, and
// math.Exp where 2ᵏ alone would overflow.
func expSlow(x float32) float32 {
	if x < -87.3 {
		return 0
	}
	return float32(math.Exp(float64(x)))
}

// expShift replaces each x[i] by e^(x[i]−m) and returns their sum in float64.
// It is exp32 written out in a loop for softmax rows, where m is the row's
// maximum, so every argument is ≤ 0.
func expShift(x []float32, m float32) float64 {
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693359375
		ln2lo = -2.12194440e-4
		magic = 12582912 // 1.5·2²³
	)
	magicBits := int32(math.Float32bits(magic))
	// Four partial sums break the chain of dependent float64 additions.
	var s [4]float64
	for i, v := range x {
		v -= m
		e := float32(0)
		if v >= -87.3 {
			t := v*log2e + magic
			k := int32(math.Float32bits(t)) - magicBits
			kf := t - magic
			r := v - kf*ln2hi - kf*ln2lo
			p := 1 + r*(1+r*(1.0/2+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720))))))
			e = p * math.Float32frombits(uint32(k+127)<<23)
		}
		x[i] = e
		s[i&3] += float64(e)
	}
	return (s[0] + s[1]) + (s[2] + s[3])
}

// maxOf returns the largest element of a non-empty x.
func maxOf(x []float32) float32 {
	m := x[0]
	for _, v := range x[1:] {
		if v > m {
			m = v
		}
	}
	return m
}
