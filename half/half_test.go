package half

import (
	"math"
	"math/big"
	"testing"
)

// exact is the value sign·mant·2^exp computed with math/big, independent of
// the conversions' bit manipulation.
func exact(neg bool, mant uint64, exp int) *big.Float {
	v := new(big.Float).SetMantExp(new(big.Float).SetUint64(mant), exp)
	if neg {
		v.Neg(v)
	}
	return v
}

// checkWiden checks got against the format's fields: sign, biased exponent
// e of ebits bits, fraction m of mbits bits, exponent bias bias.
func checkWiden(t *testing.T, name string, h uint16, got float32, ebits, mbits, bias int) {
	t.Helper()
	neg := h&0x8000 != 0
	e := int(h>>mbits) & (1<<ebits - 1)
	m := uint64(h) & (1<<mbits - 1)
	if math.Signbit(float64(got)) != neg {
		t.Fatalf("%s(%#04x) = %g: wrong sign", name, h, got)
	}
	switch {
	case e == 1<<ebits-1 && m == 0:
		if !math.IsInf(float64(got), 0) {
			t.Fatalf("%s(%#04x) = %g, want infinity", name, h, got)
		}
		return
	case e == 1<<ebits-1: // NaN: the payload moves to float32's top bits
		want := uint32(h&0x8000)<<16 | 0x7f800000 | uint32(m)<<(23-mbits)
		if !math.IsNaN(float64(got)) || math.Float32bits(got) != want {
			t.Fatalf("%s(%#04x) = %#08x, want NaN %#08x", name, h, math.Float32bits(got), want)
		}
		return
	}
	var want *big.Float
	if e == 0 { // zero or subnormal: m·2^(1−bias−mbits)
		want = exact(neg, m, 1-bias-mbits)
	} else {
		want = exact(neg, m|1<<mbits, e-bias-mbits)
	}
	if new(big.Float).SetFloat64(float64(got)).Cmp(want) != 0 {
		t.Fatalf("%s(%#04x) = %g, want %s", name, h, got, want.Text('g', 20))
	}
}

// TestF16ToF32All widens every one of the 65536 binary16 values and
// compares it with its value computed from the fields by math/big.
func TestF16ToF32All(t *testing.T) {
	for h := range 1 << 16 {
		checkWiden(t, "F16ToF32", uint16(h), F16ToF32(uint16(h)), 5, 10, 15)
	}
}

// TestBF16ToF32All does the same for every bfloat16 value.
func TestBF16ToF32All(t *testing.T) {
	for h := range 1 << 16 {
		checkWiden(t, "BF16ToF32", uint16(h), BF16ToF32(uint16(h)), 8, 7, 127)
	}
}

// TestF16ToF32Cases pins values worked by hand.
func TestF16ToF32Cases(t *testing.T) {
	for _, tt := range []struct {
		h    uint16
		want float32
	}{
		{0x0000, 0},
		{0x3c00, 1},
		{0xc000, -2},
		{0x3555, 0.333251953125},
		{0x7bff, 65504},                 // largest finite
		{0x0400, 1.0 / (1 << 14)},       // smallest normal
		{0x0001, 1.0 / (1 << 24)},       // smallest subnormal
		{0x83ff, -1023.0 / (1 << 24)},   // largest subnormal, negative
		{0x7c00, float32(math.Inf(1))},  // +Inf
		{0xfc00, float32(math.Inf(-1))}, // -Inf
	} {
		if got := F16ToF32(tt.h); got != tt.want {
			t.Errorf("F16ToF32(%#04x) = %g, want %g", tt.h, got, tt.want)
		}
	}
	if got := F16ToF32(0x8000); got != 0 || !math.Signbit(float64(got)) {
		t.Errorf("F16ToF32(0x8000) = %g, want -0", got)
	}
	if got := F16ToF32(0x7e00); !math.IsNaN(float64(got)) {
		t.Errorf("F16ToF32(0x7e00) = %g, want NaN", got)
	}
	// Monotonic over the positive finite halves: no value is misplaced.
	for h := uint16(1); h < 0x7c00; h++ {
		if F16ToF32(h) <= F16ToF32(h-1) {
			t.Fatalf("F16ToF32(%#04x) = %g ≤ F16ToF32(%#04x) = %g", h, F16ToF32(h), h-1, F16ToF32(h-1))
		}
	}
}

// roundSig rounds |x| (finite) to a binary format with sig significant
// bits and least normal exponent emin (values below 2^emin are subnormals
// of quantum 2^(emin−sig+1)), to nearest, ties to even, by float64
// arithmetic: x/q and q are exact, and RoundToEven rounds the quotient.
func roundSig(x float64, sig, emin int) float64 {
	if x == 0 {
		return 0
	}
	_, e := math.Frexp(x) // x = f·2^e, 0.5 ≤ f < 1
	e--                   // x = g·2^e, 1 ≤ g < 2
	e = max(e, emin)
	q := math.Ldexp(1, e-sig+1) // the quantum at this exponent
	return math.RoundToEven(x/q) * q
}

// refBF16 is float32 → bfloat16 bits by roundSig; a NaN keeps its sign and
// the top of its payload, made quiet.
func refBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if f != f {
		return uint16(b>>16) | 0x40
	}
	v := roundSig(math.Abs(float64(f)), 8, -126)
	r := math.Float32bits(float32(v)) >> 16 // exact, or +Inf beyond the range
	if v > math.MaxFloat32 {
		r = 0x7f80
	}
	return uint16(r) | uint16(b>>16)&0x8000
}

// refF16 is float32 → binary16 bits by roundSig; a NaN becomes a quiet NaN
// of the same sign.
func refF16(f float32) uint16 {
	sign := uint16(math.Float32bits(f)>>16) & 0x8000
	if f != f {
		return sign | 0x7e00
	}
	v := roundSig(math.Abs(float64(f)), 11, -14)
	switch {
	case v >= 65536 || math.IsInf(v, 0):
		return sign | 0x7c00
	case v < math.Ldexp(1, -14): // subnormal or zero: a multiple of 2⁻²⁴
		return sign | uint16(v*(1<<24))
	}
	_, e := math.Frexp(v)
	e--
	mant := uint16(v/math.Ldexp(1, e-10)) & 0x3ff
	return sign | uint16(e+15)<<10 | mant
}

// TestReference pins the float64 references to cases worked by hand, so
// that a reference agreeing with a wrong conversion would fail here.
func TestReference(t *testing.T) {
	for _, tc := range []struct {
		x        float32
		bf, half uint16
	}{
		{1, 0x3f80, 0x3c00},
		{math.Float32frombits(0x3f808000), 0x3f80, 0x3c04}, // bf16 tie, even below
		{math.Float32frombits(0x3f818000), 0x3f82, 0x3c0c}, // bf16 tie, even above
		{math.Float32frombits(0x3f801000), 0x3f80, 0x3c00}, // half tie (1+2⁻¹¹), even below
		{math.Float32frombits(0x3f803000), 0x3f80, 0x3c02}, // half tie (1+3·2⁻¹¹), even above
		{65504, 0x4780, 0x7bff},                            // 0x477fe000: bf16 rounds up
		{65520, 0x4780, 0x7c00},                            // half tie to even: infinity
		{float32(math.Ldexp(1, -24)), 0x3380, 0x0001},
		{float32(math.Ldexp(1, -25)), 0x3300, 0x0000}, // tie to even: 0
		{float32(math.Ldexp(3, -26)), 0x3340, 0x0001}, // 0.75 of the least subnormal
		{float32(math.Ldexp(3, -25)), 0x33c0, 0x0002}, // 1.5 quanta, tie to even: 2
		{math.Float32frombits(0x7f7fffff), 0x7f80, 0x7c00},
		{-2, 0xc000, 0xc000},
	} {
		if got := refBF16(tc.x); got != tc.bf {
			t.Errorf("refBF16(%g) = %#04x, want %#04x", tc.x, got, tc.bf)
		}
		if got := refF16(tc.x); got != tc.half {
			t.Errorf("refF16(%g) = %#04x, want %#04x", tc.x, got, tc.half)
		}
		if got := F32ToBF16(tc.x); got != tc.bf {
			t.Errorf("F32ToBF16(%g) = %#04x, want %#04x", tc.x, got, tc.bf)
		}
		if got := F32ToF16(tc.x); got != tc.half {
			t.Errorf("F32ToF16(%g) = %#04x, want %#04x", tc.x, got, tc.half)
		}
	}
}

func TestF32ToBF16Cases(t *testing.T) {
	for _, tc := range []struct {
		f    float32
		want uint16
	}{
		{1, 0x3f80},
		{-2, 0xc000},
		{math.Float32frombits(0x3f808000), 0x3f80}, // halfway, to even (down)
		{math.Float32frombits(0x3f818000), 0x3f82}, // halfway, to even (up)
		{math.Float32frombits(0x3f808001), 0x3f81}, // above halfway
		{float32(math.Inf(1)), 0x7f80},
		{math.MaxFloat32, 0x7f80},                  // rounds up to infinity
		{math.Float32frombits(0x00008000), 0x0000}, // subnormal tie to even: 0
		{math.Float32frombits(0x00018000), 0x0002}, // subnormal tie to even: up
		{math.Float32frombits(0xffc00001), 0xffc0}, // NaN: sign and top payload
		{math.Float32frombits(0x7f800001), 0x7fc0}, // signalling NaN made quiet
	} {
		if got := F32ToBF16(tc.f); got != tc.want {
			t.Errorf("F32ToBF16(%g) = %#04x, want %#04x", tc.f, got, tc.want)
		}
	}
	if !math.IsNaN(float64(BF16ToF32(F32ToBF16(float32(math.NaN()))))) {
		t.Error("NaN did not stay NaN")
	}
	for h := 0; h < 1<<16; h++ {
		f := BF16ToF32(uint16(h))
		want := uint16(h)
		if f != f {
			want |= 0x40 // quiet
		}
		if got := F32ToBF16(f); got != want {
			t.Fatalf("bf16 %#04x → %g → %#04x, want %#04x", h, f, got, want)
		}
	}
}

func TestF32ToF16Cases(t *testing.T) {
	for _, tc := range []struct {
		f    float32
		want uint16
	}{
		{1, 0x3c00},
		{-2, 0xc000},
		{0.1, 0x2e66},
		{65504, 0x7bff},
		{65519.996, 0x7bff},     // just below the halfway point to infinity
		{65520, 0x7c00},         // halfway to the next power: rounds to infinity
		{6.1035156e-05, 0x0400}, // the smallest normal
		{float32(math.Ldexp(1023.75, -24)), 0x0400}, // past the largest subnormal: up into the normals
		{5.9604645e-08, 0x0001},                     // the smallest subnormal
		{2.9802322e-08, 0x0000},                     // half of it: ties to even, zero
		{4.4703484e-08, 0x0001},                     // three quarters of it: up
		{float32(math.Inf(-1)), 0xfc00},
		{-1e6, 0xfc00},
		{1e-10, 0},
		{float32(math.Copysign(1e-30, -1)), 0x8000},
		{math.SmallestNonzeroFloat32, 0},
		{math.Float32frombits(0xffc00001), 0xfe00}, // NaN: sign kept, payload not
		{math.Float32frombits(0x7f800001), 0x7e00},
	} {
		if got := F32ToF16(tc.f); got != tc.want {
			t.Errorf("F32ToF16(%g) = %#04x, want %#04x", tc.f, got, tc.want)
		}
	}
	for h := 0; h < 1<<16; h++ {
		f := F16ToF32(uint16(h))
		want := uint16(h)
		if f != f {
			want = uint16(h)&0x8000 | 0x7e00
		}
		if got := F32ToF16(f); got != want {
			t.Fatalf("f16 %#04x → %g → %#04x, want %#04x", h, f, got, want)
		}
	}
	// Ties between neighbours round to the even one.
	for h := uint16(0x3c00); h < 0x3c10; h++ {
		mid := (F16ToF32(h) + F16ToF32(h+1)) / 2
		want := h
		if h&1 == 1 {
			want = h + 1
		}
		if got := F32ToF16(mid); got != want {
			t.Errorf("F32ToF16(midpoint of %#04x and %#04x) = %#04x, want %#04x", h, h+1, got, want)
		}
	}
}

// TestNarrowBoundaries checks both narrowings against the references at
// every place where rounding changes its answer: for every pair of
// neighbouring 16-bit values (and the largest finite one and the infinity
// past it), the midpoint and the float32 values either side of it, and each
// value itself and its float32 neighbours; negated too.
func TestNarrowBoundaries(t *testing.T) {
	for _, f := range []struct {
		name   string
		widen  func(uint16) float32
		narrow func(float32) uint16
		ref    func(float32) uint16
		inf    uint16
		next   float64 // the value after the largest finite one
	}{
		{"F32ToF16", F16ToF32, F32ToF16, refF16, 0x7c00, 65536},
		{"F32ToBF16", BF16ToF32, F32ToBF16, refBF16, 0x7f80, math.Ldexp(1, 128)},
	} {
		n := 0
		check := func(x float32) {
			for _, v := range []float32{x, -x} {
				n++
				if got, want := f.narrow(v), f.ref(v); got != want {
					t.Fatalf("%s(%g = %#08x) = %#04x, want %#04x", f.name, v, math.Float32bits(v), got, want)
				}
			}
		}
		for h := uint16(0); h < f.inf; h++ {
			lo := float64(f.widen(h))
			hi := f.next
			if h+1 < f.inf {
				hi = float64(f.widen(h + 1))
			}
			mid := float32((lo + hi) / 2) // exact: one bit more than the format
			inf := float32(math.Inf(1))
			for _, x := range []float32{f.widen(h), mid} {
				check(x)
				check(math.Nextafter32(x, inf))
				check(math.Nextafter32(x, 0))
			}
		}
		check(float32(math.Inf(1)))
		check(float32(math.NaN()))
		t.Logf("%s: %d values", f.name, n)
	}
}

// TestNarrowSampled checks both narrowings against the references on every
// 509th float32 bit pattern (8.4 million of them), NaNs included.
func TestNarrowSampled(t *testing.T) {
	for b := uint64(0); b < 1<<32; b += 509 {
		x := math.Float32frombits(uint32(b))
		if got, want := F32ToBF16(x), refBF16(x); got != want {
			t.Fatalf("F32ToBF16(%#08x) = %#04x, want %#04x", b, got, want)
		}
		if got, want := F32ToF16(x), refF16(x); got != want {
			t.Fatalf("F32ToF16(%#08x) = %#04x, want %#04x", b, got, want)
		}
	}
}
