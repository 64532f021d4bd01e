package cpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestExp32(t *testing.T) {
	var worst float64
	for x := -87.0; x <= 88.7; x += 0.001 {
		got := float64(exp32(float32(x)))
		want := math.Exp(float64(float32(x)))
		if e := math.Abs(got-want) / want; e > worst {
			worst = e
		}
	}
	if worst > 3e-7 {
		t.Errorf("exp32 worst relative error %.3g, want ≤ 3e-7", worst)
	}
	if exp32(-100) != 0 || !math.IsInf(float64(exp32(100)), 1) || exp32(0) != 1 {
		t.Errorf("exp32 edge values: %v %v %v", exp32(-100), exp32(100), exp32(0))
	}
}

func TestExpShift(t *testing.T) {
	x := []float32{0, -1, -10, -100, 3}
	want := []float64{math.Exp(-3), math.Exp(-4), math.Exp(-13), 0, 1}
	sum := expShift(x, maxOf(x))
	var ws float64
	for i, w := range want {
		ws += w
		if math.Abs(float64(x[i])-w) > 3e-7*w {
			t.Errorf("x[%d] = %v, want %v", i, x[i], w)
		}
	}
	if math.Abs(sum-ws) > 1e-6 {
		t.Errorf("sum %v, want %v", sum, ws)
	}
}

// TestExpShiftVectorBits: the vector loop gives the scalar loop's bits for
// every element and for the sum, edge values included, at every length
// around a multiple of four.
func TestExpShiftVectorBits(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	edges := []float32{0, -87.29, -87.3, -87.31, -100, float32(math.Inf(-1)), float32(math.NaN()), -1e-30, -0.3466, 12}
	for _, n := range []int{0, 1, 3, 4, 5, 7, 8, 63, 64, 65, 1000, 50304} {
		x := make([]float32, n)
		for i := range x {
			if i%17 == 3 {
				x[i] = edges[(i/17)%len(edges)]
			} else {
				x[i] = float32(rng.NormFloat64() * 20)
			}
		}
		m := float32(12)
		want := slices.Clone(x)
		var s [4]float64
		expShiftFrom(want, m, &s, 0)
		wantSum := (s[0] + s[1]) + (s[2] + s[3])
		got := slices.Clone(x)
		gotSum := expShift(got, m)
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("n=%d: e^(%v−%v): vector %v (%#x), scalar %v (%#x)", n, x[i], m, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
			}
		}
		if math.Float64bits(gotSum) != math.Float64bits(wantSum) {
			t.Errorf("n=%d: sum %v, scalar %v", n, gotSum, wantSum)
		}
	}
}

// TestExpSumBits: expSum gives the bits of the scalar exp32 loop it
// replaces, NaN and infinite elements included, and leaves x alone.
func TestExpSumBits(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	edges := []float32{0, -87.29, -87.3, -87.31, -100, float32(math.Inf(-1)), -1e-30, -0.3466, float32(math.NaN()), float32(math.Inf(1))}
	for _, n := range []int{1, 3, 255, 256, 257, 1000, 50304} {
		for _, withEdges := range []int{0, 8, 9, 10} { // no edge, the finite ones, with NaN, with +Inf too
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(rng.NormFloat64() * 20)
				if withEdges > 0 && i%17 == 3 {
					x[i] = edges[(i/17)%withEdges]
				}
			}
			m := maxOf(x)
			var want float64
			for _, v := range x {
				want += float64(exp32(v - m))
			}
			orig := slices.Clone(x)
			got := expSum(x, m)
			if math.Float64bits(got) != math.Float64bits(want) && !(math.IsNaN(got) && math.IsNaN(want)) {
				t.Errorf("n=%d edges=%d: expSum %v, the exp32 loop %v", n, withEdges, got, want)
			}
			if !slices.EqualFunc(x, orig, func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
				t.Errorf("n=%d edges=%d: expSum wrote x", n, withEdges)
			}
		}
	}
}

// BenchmarkExpShift: one softmax row of GPT-2's vocabulary, the vector
// loop against the scalar one (a copy refills the row each time in both).
func BenchmarkExpShift(b *testing.B) {
	src := make([]float32, 50304)
	for i := range src {
		src[i] = float32(i%97) * -0.1
	}
	x := make([]float32, len(src))
	for _, bc := range []struct {
		name string
		f    func()
	}{
		{"vector", func() { expShift(x, 0) }},
		{"scalar", func() { var s [4]float64; expShiftFrom(x, 0, &s, 0) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(4 * len(x)))
			for b.Loop() {
				copy(x, src)
				bc.f()
			}
		})
	}
}

// TestMaxOfAndScaleVector: maxOf and scale with their vector loops give the
// scalar loops' results, NaNs and infinities anywhere included.
func TestMaxOfAndScaleVector(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	maxScalar := func(x []float32) float32 {
		m := x[0]
		for _, v := range x[1:] {
			if v > m {
				m = v
			}
		}
		return m
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 2, 3, 4, 5, 8, 9, 31, 64, 1001} {
		for trial := range 20 {
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(rng.NormFloat64() * 10)
			}
			// Put a special value at a trial-chosen place (position 0
			// included) in most trials.
			if trial > 0 {
				x[rng.IntN(n)] = []float32{nan, inf, -inf, 0, float32(math.Copysign(0, -1))}[trial%5]
			}
			got, want := maxOf(x), maxScalar(x)
			if math.Float32bits(got) != math.Float32bits(want) && !(got == 0 && want == 0) {
				t.Fatalf("n=%d trial %d: maxOf %v, scalar %v (x=%v)", n, trial, got, want, x)
			}
			y, z := slices.Clone(x), slices.Clone(x)
			s := float32(rng.NormFloat64())
			scale(y, s)
			for i := range z {
				z[i] *= s
			}
			for i := range y {
				if math.Float32bits(y[i]) != math.Float32bits(z[i]) {
					t.Fatalf("n=%d: scale: %v, scalar %v", n, y[i], z[i])
				}
			}
		}
	}
}
