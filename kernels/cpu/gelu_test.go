package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestGeluTanhVector: geluTanh's vector loop writes the scalar loop's bits
// (the scalar loop alone does slices under 16 elements): normal values,
// values past the ±9 clamp, random bit patterns (NaNs, infinities,
// subnormals, zeros of either sign), over lengths with and without a tail.
func TestGeluTanhVector(t *testing.T) {
	if geluTanhVec(make([]float32, 16), make([]float32, 16)) == 0 {
		t.Log("no vector loop on this CPU: geluTanh is the scalar loop")
	}
	r := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, 1<<16+13)
	for i := range x {
		switch i % 4 {
		case 0:
			x[i] = float32(r.NormFloat64())
		case 1:
			x[i] = float32(r.NormFloat64() * 10)
		case 2:
			x[i] = math.Float32frombits(r.Uint32())
		default:
			x[i] = float32(r.NormFloat64() * 1e-3)
		}
	}
	copy(x, []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1e-45, -9, 9, 88, -88})
	for _, n := range []int{16, 17, 31, 1000, len(x)} {
		got := make([]float32, n)
		geluTanh(got, x[:n])
		var one [1]float32
		for i, v := range x[:n] {
			geluTanh(one[:], x[i:i+1])
			if math.Float32bits(got[i]) != math.Float32bits(one[0]) && !(got[i] != got[i] && one[0] != one[0]) {
				t.Fatalf("n %d: x[%d] = %v: vector %v, scalar %v", n, i, v, got[i], one[0])
			}
		}
	}
}

// BenchmarkGeluTanh: one thread over 64 Ki elements, the vector loop
// with its scalar tail (geluTanh) and the scalar loop alone.
func BenchmarkGeluTanh(b *testing.B) {
	x, th := make([]float32, 1<<16), make([]float32, 1<<16)
	for i := range x {
		x[i] = float32(i%200-100) / 25
	}
	b.Run("vector", func(b *testing.B) {
		b.SetBytes(4 << 16)
		for b.Loop() {
			geluTanh(th, x)
		}
	})
	b.Run("scalar", func(b *testing.B) {
		b.SetBytes(4 << 16)
		for b.Loop() {
			for i := 0; i < len(x); i += 15 {
				geluTanh(th[i:min(i+15, len(x))], x[i:min(i+15, len(x))])
			}
		}
	})
}
