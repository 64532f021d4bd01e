package cpu

import (
	"math"
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
