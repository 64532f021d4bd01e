package cuda_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gptui/gptui/kernels/cuda"
)

func TestAdamW(t *testing.T) {
	for _, tc := range []struct {
		n, off, step int
		wd, gscale   float32
	}{
		{37, 0, 1, 0, 1}, {1027, 0, 5, 0.1, 0.5}, {256, 1, 100, 0.01, 1}, {3, 0, 2, 0.1, 2},
	} {
		t.Run(fmt.Sprintf("n%doff%dstep%d", tc.n, tc.off, tc.step), func(t *testing.T) {
			r := rand.New(rand.NewPCG(10, uint64(tc.n)))
			m, k := machine(t)
			n := tc.n
			p, g, mm, vv := randn(r, n, 1), randn(r, n, 0.1), randn(r, n, 0.01), randn(r, n, 0.01)
			for i := range vv {
				vv[i] *= vv[i]
			}
			const lr, b1, b2, eps = 3e-4, 0.9, 0.95, 1e-8
			gp, gg, gm, gv := place(m, p, tc.off), place(m, g, tc.off), place(m, mm, tc.off), place(m, vv, tc.off)
			wp, wm, wv := append([]float32(nil), p...), append([]float32(nil), mm...), append([]float32(nil), vv...)
			// Two steps in a row, as training runs them.
			for s := tc.step; s < tc.step+2; s++ {
				cpuBackend.AdamW(wp, g, wm, wv, lr, b1, b2, eps, tc.wd, tc.gscale, s)
				must(t, k.AdamW(0, gp, gg, gm, gv, n, lr, b1, b2, eps, tc.wd, tc.gscale, s))
			}
			run(t, m)
			checkClose(t, "params", m.ReadFloat32s(gp, n), wp, 1e-6)
			checkClose(t, "m", m.ReadFloat32s(gm, n), wm, 1e-6)
			checkClose(t, "v", m.ReadFloat32s(gv, n), wv, 1e-6)
			checkExact(t, "params", m.ReadFloat32s(gp, n), wp)
		})
	}
	_, k := machine(t)
	if err := k.AdamW(0, 0, 0, 0, 0, 1, 1e-3, 0.9, 0.999, 1e-8, 0, 1, 0); err == nil {
		t.Error("AdamW step 0 accepted")
	}
}

// TestSum: Sum adds w·Σx and w·Σx² to a double, as kernels/cpu within
// 1e-12, the same bits on every run, accumulating across calls.
func TestSum(t *testing.T) {
	for _, n := range []int{0, 1, 37, 4099, 30011} {
		for _, square := range []bool{false, true} {
			t.Run(fmt.Sprintf("%d/square=%v", n, square), func(t *testing.T) {
				r := rand.New(rand.NewPCG(11, uint64(n)))
				m, k := machine(t)
				x := randn(r, n, 2)
				want := []float64{0}
				if square {
					cpuBackend.SumSquares(want, x, 0.5)
				} else {
					cpuBackend.Sum(want, x, 0.5)
				}
				gx, out, scratch := m.Float32s(x), m.Float64s([]float64{0}), m.Alloc(cuda.SumScratch)
				must(t, k.Sum(0, out, gx, n, scratch, 0.5, square))
				run(t, m)
				got := m.ReadFloat64s(out, 1)[0]
				t.Logf("½Σ = %v, kernels/cpu %v", got, want[0])
				if math.Abs(got-want[0]) > 1e-12*max(math.Abs(want[0]), 1e-300) || (n == 0 && got != 0) {
					t.Errorf("½Σ = %v, want %v", got, want[0])
				}
				// Two more calls with w = 1 add 2·Σ: 5× the first, and the
				// same bits every run.
				must(t, k.Sum(0, out, gx, n, scratch, 1, square))
				must(t, k.Sum(0, out, gx, n, scratch, 1, square))
				run(t, m)
				again := m.ReadFloat64s(out, 1)[0]
				if math.Abs(again-5*got) > 1e-12*max(math.Abs(5*got), 1e-300) {
					t.Errorf("accumulated = %v, want %v", again, 5*got)
				}
				out2 := m.Float64s([]float64{0})
				must(t, k.Sum(0, out2, gx, n, scratch, 0.5, square))
				run(t, m)
				if again := m.ReadFloat64s(out2, 1)[0]; again != got {
					t.Errorf("second run: %v, first %v: the sum's order is not fixed", again, got)
				}
			})
		}
	}
}

func TestNonFinite(t *testing.T) {
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	for _, tc := range []struct {
		name string
		n    int
		bad  map[int]float32
		want int32
	}{
		{"finite", 1027, nil, 0},
		{"max", 100, map[int]float32{50: math.MaxFloat32, 51: -math.MaxFloat32}, 0},
		{"inf last", 1027, map[int]float32{1026: inf}, 1},
		{"-inf first", 5, map[int]float32{0: -inf}, 1},
		{"nan", 300, map[int]float32{123: nan}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(12, uint64(tc.n)))
			m, k := machine(t)
			x := randn(r, tc.n, 1e3)
			for i, v := range tc.bad {
				x[i] = v
			}
			flag := m.Int32s([]int32{0})
			must(t, k.NonFinite(0, flag, m.Float32s(x), tc.n))
			run(t, m)
			if got := m.ReadInt32s(flag, 1)[0]; got != tc.want {
				t.Errorf("flag = %d, want %d", got, tc.want)
			}
		})
	}
	// The flag is never cleared.
	m, k := machine(t)
	flag := m.Int32s([]int32{1})
	must(t, k.NonFinite(0, flag, m.Float32s([]float32{1, 2}), 2))
	run(t, m)
	if got := m.ReadInt32s(flag, 1)[0]; got != 1 {
		t.Errorf("flag cleared to %d", got)
	}
}
