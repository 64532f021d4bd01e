package cuda_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gptui/gptui/kernels/cuda"
)

// roundSig rounds |x| (finite, float64) to a binary format with sig
// significant bits and least exponent emin (values below 2^emin are
// denormals of quantum 2^(emin−sig+1)), to nearest, ties to even, by
// float64 arithmetic: independent of the kernels' bit manipulation.
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

// refBF16 is float32 → bfloat16 bits, round to nearest even; NaN keeps its
// sign and the top of its payload, made quiet.
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

// refF16 is float32 → IEEE half bits, round to nearest even; NaN becomes a
// quiet NaN of the same sign.
func refF16(f float32) uint16 {
	sign := uint16(math.Float32bits(f)>>16) & 0x8000
	if f != f {
		return sign | 0x7e00
	}
	v := roundSig(math.Abs(float64(f)), 11, -14)
	switch {
	case v >= 65536 || math.IsInf(v, 0):
		return sign | 0x7c00
	case v < math.Ldexp(1, -14): // denormal or zero: a multiple of 2⁻²⁴
		return sign | uint16(v*(1<<24))
	}
	_, e := math.Frexp(v)
	e--
	mant := uint16(v/math.Ldexp(1, e-10)) & 0x3ff
	return sign | uint16(e+15)<<10 | mant
}

// refF16ToF32 is the value of half bits h.
func refF16ToF32(h uint16) float32 {
	sign := float64(1)
	if h&0x8000 != 0 {
		sign = -1
	}
	e, m := int(h>>10)&0x1f, int(h&0x3ff)
	switch {
	case e == 0x1f && m == 0:
		return float32(sign * math.Inf(1))
	case e == 0x1f:
		return math.Float32frombits(uint32(h&0x8000)<<16 | 0x7f800000 | uint32(m)<<13)
	case e == 0:
		return float32(sign * float64(m) * math.Ldexp(1, -24))
	}
	return float32(sign * (1 + float64(m)/1024) * math.Ldexp(1, e-15))
}

// castInputs are the values whose rounding is easy to get wrong, then
// random bit patterns.
func castInputs(n int) []float32 {
	x := []float32{
		0, float32(math.Copysign(0, -1)), 1, -1, 1.5, 65504, 65519.99, 65520, 65536, -70000, 1e-8,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), math.Float32frombits(0xffc00001),
		math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, 1e-40, -1e-39,
		float32(math.Ldexp(1, -14)), float32(math.Ldexp(1, -24)), float32(math.Ldexp(1, -25)),
		float32(math.Ldexp(1.5, -25)), float32(math.Ldexp(3, -26)), float32(math.Ldexp(1023, -24)),
		float32(math.Ldexp(2047, -25)), float32(math.Ldexp(1, -15) * 3),
		math.Float32frombits(0x3f808000), math.Float32frombits(0x3f818000), math.Float32frombits(0x3f808001),
		math.Float32frombits(0x7f7f8000), math.Float32frombits(0x7f7fffff), math.Float32frombits(0x00008000),
		math.Float32frombits(0x00018000), math.Float32frombits(0x3f801000), math.Float32frombits(0x3f803000),
		math.Float32frombits(0x3f802000),
	}
	r := rand.New(rand.NewPCG(13, 13))
	for len(x) < n {
		if len(x)%2 == 0 {
			x = append(x, math.Float32frombits(r.Uint32()))
		} else {
			x = append(x, float32(r.NormFloat64()*math.Pow(2, float64(r.IntN(60)-40))))
		}
	}
	return x[:n]
}

// ptrOff is a count of 16-bit elements as a pointer offset.
func ptrOff(n int) cuda.Ptr { return cuda.Ptr(n) }

func TestCasts(t *testing.T) {
	for _, tc := range []struct{ n, off int }{{4099, 0}, {1001, 1}, {3, 0}} {
		t.Run(fmt.Sprintf("n%doff%d", tc.n, tc.off), func(t *testing.T) {
			m, k := machine(t)
			n := tc.n
			x := castInputs(n)
			in := place(m, x, tc.off)
			bf, hf := m.Alloc(2*n+2*tc.off)+2*ptrOff(tc.off), m.Alloc(2*n+2*tc.off)+2*ptrOff(tc.off)
			must(t, k.CastF32ToBF16(0, bf, in, n))
			must(t, k.CastF32ToF16(0, hf, in, n))
			back, hback := place(m, make([]float32, n), tc.off), place(m, make([]float32, n), tc.off)
			must(t, k.CastBF16ToF32(0, back, bf, n))
			must(t, k.CastF16ToF32(0, hback, hf, n))
			run(t, m)
			gb, gh := m.ReadUint16s(bf, n), m.ReadUint16s(hf, n)
			wb, wh := make([]float32, n), make([]float32, n)
			for i, v := range x {
				if w := refBF16(v); gb[i] != w {
					t.Errorf("bf16(%g = %#08x) = %#04x, want %#04x", v, math.Float32bits(v), gb[i], w)
				}
				if w := refF16(v); gh[i] != w {
					t.Errorf("f16(%g = %#08x) = %#04x, want %#04x", v, math.Float32bits(v), gh[i], w)
				}
				wb[i] = math.Float32frombits(uint32(gb[i]) << 16)
				wh[i] = refF16ToF32(gh[i])
			}
			checkExact(t, "bf16→f32", m.ReadFloat32s(back, n), wb)
			checkExact(t, "f16→f32", m.ReadFloat32s(hback, n), wh)
		})
	}
}

// TestWidenAll widens every 16-bit pattern.
func TestWidenAll(t *testing.T) {
	m, k := machine(t)
	bits := make([]uint16, 1<<16)
	for i := range bits {
		bits[i] = uint16(i)
	}
	in, bo, ho := m.Uint16s(bits), m.Alloc(4<<16), m.Alloc(4<<16)
	must(t, k.CastBF16ToF32(0, bo, in, len(bits)))
	must(t, k.CastF16ToF32(0, ho, in, len(bits)))
	run(t, m)
	gb, gh := m.ReadFloat32s(bo, len(bits)), m.ReadFloat32s(ho, len(bits))
	for i, h := range bits {
		if w := math.Float32frombits(uint32(h) << 16); math.Float32bits(gb[i]) != math.Float32bits(w) {
			t.Fatalf("bf16 %#04x → %v, want %v", h, gb[i], w)
		}
		if w := refF16ToF32(h); math.Float32bits(gh[i]) != math.Float32bits(w) {
			t.Fatalf("f16 %#04x → %v (%#08x), want %v (%#08x)", h, gh[i], math.Float32bits(gh[i]), w, math.Float32bits(w))
		}
		// Narrowing the widened value gives the bits back (NaNs: quiet).
		if h&0x7c00 != 0x7c00 || h&0x3ff == 0 {
			if r := refF16(gh[i]); r != h {
				t.Fatalf("f16 %#04x: widened and narrowed %#04x", h, r)
			}
		}
	}
}

// TestCastReference pins the Go references to hand-worked cases, so a
// reference that agreed with a wrong kernel would fail here.
func TestCastReference(t *testing.T) {
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
		{float32(math.Ldexp(3, -26)), 0x3340, 0x0001}, // 0.75 of the least denormal
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
	}
}
