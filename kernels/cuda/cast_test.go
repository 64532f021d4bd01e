package cuda_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gptui/gptui/half"
	"github.com/gptui/gptui/kernels/cuda"
)

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

// TestCasts narrows and widens under the emulator; the bits expected are
// package half's, whose tests check it against math/big and a float64
// reference of rounding to nearest even.
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
				if w := half.F32ToBF16(v); gb[i] != w {
					t.Errorf("bf16(%g = %#08x) = %#04x, want %#04x", v, math.Float32bits(v), gb[i], w)
				}
				if w := half.F32ToF16(v); gh[i] != w {
					t.Errorf("f16(%g = %#08x) = %#04x, want %#04x", v, math.Float32bits(v), gh[i], w)
				}
				wb[i] = math.Float32frombits(uint32(gb[i]) << 16)
				wh[i] = half.F16ToF32(gh[i])
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
		if w := half.F16ToF32(h); math.Float32bits(gh[i]) != math.Float32bits(w) {
			t.Fatalf("f16 %#04x → %v (%#08x), want %v (%#08x)", h, gh[i], math.Float32bits(gh[i]), w, math.Float32bits(w))
		}
		// Narrowing the widened value gives the bits back (NaNs: quiet).
		if h&0x7c00 != 0x7c00 || h&0x3ff == 0 {
			if r := half.F32ToF16(gh[i]); r != h {
				t.Fatalf("f16 %#04x: widened and narrowed %#04x", h, r)
			}
		}
	}
}
