// Package half converts between float32 and the two 16-bit floats, IEEE
// binary16 and bfloat16, rounding to nearest even.
//
// Both 16-bit formats are held as their bits in a uint16:
//
//	binary16 (F16)  sign 1, exponent 5 (bias 15),   fraction 10   largest 65504, least 2⁻²⁴
//	bfloat16 (BF16) sign 1, exponent 8 (bias 127),  fraction 7    float32's top half
//
// Widening ([F16ToF32], [BF16ToF32]) is exact: every 16-bit value is a
// float32, and a NaN keeps its sign and payload. Narrowing ([F32ToF16],
// [F32ToBF16]) rounds to the nearest 16-bit value, ties to the one with an
// even last bit, as the GPU's conversions do; a value beyond the largest
// finite one rounds to infinity, and a NaN stays a quiet NaN of the same
// sign (BF16 keeps the top of its payload, F16 does not).
package half

import "math"

// F16ToF32 returns the value of the IEEE binary16 bits h.
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h) & 0x3ff
	switch exp {
	case 0x1f: // infinity or NaN: the payload moves to float32's top bits
		return math.Float32frombits(sign | 0x7f800000 | frac<<13)
	case 0: // zero or subnormal: frac · 2⁻²⁴, exact in float32
		v := float32(frac) * (1.0 / (1 << 24))
		return math.Float32frombits(sign | math.Float32bits(v))
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | frac<<13)
}

// F32ToF16 rounds f to IEEE binary16, to nearest, ties to even.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23&0xff) - 127 + 15 // the binary16 biased exponent
	frac := b & 0x7fffff
	switch {
	case b&0x7fffffff > 0x7f800000: // NaN
		return sign | 0x7e00
	case exp >= 0x1f: // infinity, or beyond the largest binary16
		return sign | 0x7c00
	case exp <= 0: // below the least normal: a multiple of 2⁻²⁴, or 0
		if exp < -10 { // below half the least subnormal
			return sign
		}
		frac |= 0x800000 // the implicit bit
		shift := uint32(14 - exp)
		return sign | uint16(roundShift(frac, shift))
	}
	// Rounding may carry into the exponent, up to infinity: both right.
	return sign | uint16(roundShift(uint32(exp)<<23|frac, 13))
}

// roundShift returns x >> s rounded to nearest, ties to even (0 < s < 32).
func roundShift(x, s uint32) uint32 {
	r := x >> s
	rem, half := x&(1<<s-1), uint32(1)<<(s-1)
	if rem > half || rem == half && r&1 == 1 {
		r++
	}
	return r
}

// BF16ToF32 returns the value of the bfloat16 bits h.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 rounds f to bfloat16, to nearest, ties to even. A NaN keeps its
// sign and the top of its payload, made quiet.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN
		return uint16(b>>16) | 0x40
	}
	return uint16(roundShift(b, 16))
}
