package kernels

import (
	"math"
	"testing"

	"github.com/gptui/gptui/half"
)

// TestRoundBF16 checks RoundBF16 against half's rounding on a stride
// through every float32 bit pattern and on the edges: ties either way,
// denormals, the largest values, infinities and NaNs.
func TestRoundBF16(t *testing.T) {
	var bits []uint32
	for u := uint64(0); u < 1<<32; u += 65521 { // a prime stride: every low-bit pattern
		bits = append(bits, uint32(u))
	}
	for _, u := range []uint32{0, 0x8000, 0x7fff, 0x18000, 0x28000, 0x3f808000, 0x3f818000, 0x3f80ffff,
		0x00000001, 0x007fffff, 0x807fffff, 0x7f7f7fff, 0x7f7f8000, 0x7f7fffff, 0xff7fffff,
		0x7f800000, 0xff800000, 0x7f800001, 0x7fc00000, 0xffffffff, 0x7fbfffff} {
		bits = append(bits, u)
	}
	x := make([]float32, len(bits))
	for i, u := range bits {
		x[i] = math.Float32frombits(u)
	}
	RoundBF16(x)
	for i, u := range bits {
		want := half.BF16ToF32(half.F32ToBF16(math.Float32frombits(u)))
		got := x[i]
		if math.IsNaN(float64(want)) != math.IsNaN(float64(got)) || !math.IsNaN(float64(want)) && math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("RoundBF16(%#08x) = %#08x, want %#08x", u, math.Float32bits(got), math.Float32bits(want))
		}
		if math.Float32bits(got)&0xffff != 0 {
			t.Fatalf("RoundBF16(%#08x) = %#08x: low half not zero", u, math.Float32bits(got))
		}
	}
}
