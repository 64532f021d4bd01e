package cuda_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gptui/gptui/kernels/cuda"
)

// ptr turns a stored address back into a Ptr.
func ptr(p uintptr) cuda.Ptr { return cuda.Ptr(p) }

// padCols lays out logits (N,V) with row stride ld, the padding columns
// filled with values that would dominate any maximum or sum they entered
// (and a NaN): the kernels must read none of them.
func padCols(x []float32, N, V, ld int) []float32 {
	p := make([]float32, N*ld)
	for r := 0; r < N; r++ {
		copy(p[r*ld:r*ld+V], x[r*V:(r+1)*V])
		for j := V; j < ld; j++ {
			p[r*ld+j] = 1e4 + float32(j)
		}
		if ld > V {
			p[r*ld+ld-1] = float32(math.NaN())
		}
	}
	return p
}

// realCols returns the first V columns of logits (N,ld), packed (N,V).
func realCols(p []float32, N, V, ld int) []float32 {
	x := make([]float32, 0, N*V)
	for r := 0; r < N; r++ {
		x = append(x, p[r*ld:r*ld+V]...)
	}
	return x
}

// checkPadding checks the padding columns of got (N,ld) bit for bit: 0
// when was is nil (a gradient), else was's (untouched).
func checkPadding(t *testing.T, name string, got, was []float32, N, V, ld int) {
	t.Helper()
	for r := 0; r < N; r++ {
		for j := V; j < ld; j++ {
			want := float32(0)
			if was != nil {
				want = was[r*ld+j]
			}
			if g := got[r*ld+j]; math.Float32bits(g) != math.Float32bits(want) {
				t.Fatalf("%s[%d,%d] (padding) = %v, want %v", name, r, j, g, want)
			}
		}
	}
}

func TestCrossEntropy(t *testing.T) {
	for _, tc := range []struct {
		N, V, ld int
		grad     bool
	}{
		{3, 37, 37, true}, {4, 1000, 1000, true}, {2, 1000, 1000, false}, {5, 1, 1, true}, {1, 513, 513, true},
		// A padded vocabulary: row stride ld, the padding masked.
		{5, 97, 128, true}, {5, 97, 128, false}, {3, 1000, 1024, true}, {2, 1, 4, true}, {1, 513, 640, true},
	} {
		t.Run(fmt.Sprintf("N%dV%dld%dgrad%v", tc.N, tc.V, tc.ld, tc.grad), func(t *testing.T) {
			r := rand.New(rand.NewPCG(8, uint64(tc.N*10000+tc.V)))
			m, k := machine(t)
			N, V, ld := tc.N, tc.V, tc.ld
			logits := randn(r, N*V, 4)
			if V > 10 {
				logits[3] = 150 // far above the rest: exps underflow to 0
			}
			targets := make([]int32, N)
			for i := range targets {
				targets[i] = int32(r.IntN(V))
			}
			targets[0] = int32(V - 1) // the last real column
			dscale := 1 / float32(N)
			// The unpadded CPU kernel is the reference.
			want, losses := append([]float32(nil), logits...), make([]float32, N)
			cpuBackend.CrossEntropy(losses, want, targets, N, V, V, dscale, tc.grad)
			padded := padCols(logits, N, V, ld)
			gl, gx := m.Alloc(4*N), m.Float32s(padded)
			must(t, k.CrossEntropy(0, gl, gx, m.Int32s(targets), N, V, ld, dscale, tc.grad))
			run(t, m)
			got := m.ReadFloat32s(gx, N*ld)
			checkClose(t, "losses", m.ReadFloat32s(gl, N), losses, 1e-5)
			checkClose(t, "logits", realCols(got, N, V, ld), want, 1e-5)
			was := padded
			if tc.grad {
				was = nil
			}
			checkPadding(t, "logits", got, was, N, V, ld)
		})
	}
	t.Run("ld<V", func(t *testing.T) {
		m, k := machine(t)
		if err := k.CrossEntropy(0, m.Alloc(8), m.Alloc(80), m.Alloc(8), 2, 10, 9, 1, true); err == nil {
			t.Error("row stride 9 below 10 columns: no error")
		}
	})
}

// TestClassifierShards runs the vocabulary-parallel classifier over two to
// four ranks' column slices (one of them empty, or only padding) of row
// stride ld (each rank's own columns when 0) and checks losses and
// gradients against kernels/cpu's three-step run and its fused unpadded
// one, the padding's gradient 0 and, evaluating, the padding untouched.
func TestClassifierShards(t *testing.T) {
	for _, tc := range []struct {
		N     int
		split []int // real columns per rank
		ld    int   // row stride of every rank's logits; 0: its real columns
		grad  bool
	}{
		{3, []int{20, 17}, 0, true},
		{4, []int{300, 0, 213}, 0, true},
		{2, []int{5, 40}, 0, false},
		// V 97 padded to 128 over 4 ranks, and V 50 (two ranks of only padding).
		{4, []int{32, 32, 32, 1}, 32, true},
		{3, []int{32, 18, 0, 0}, 32, true},
		{2, []int{32, 18, 0, 0}, 32, false},
		{3, []int{300, 213}, 320, true},
	} {
		t.Run(fmt.Sprintf("N%d%vld%d%v", tc.N, tc.split, tc.ld, tc.grad), func(t *testing.T) {
			r := rand.New(rand.NewPCG(9, uint64(tc.N)))
			m, k := machine(t)
			N, V := tc.N, 0
			for _, v := range tc.split {
				V += v
			}
			full := randn(r, N*V, 3)
			targets := make([]int32, N)
			for i := range targets {
				targets[i] = int32(r.IntN(V))
			}
			targets[0] = int32(V - 1)
			dscale := float32(0.5)
			fused, fusedLoss := append([]float32(nil), full...), make([]float32, N)
			cpuBackend.CrossEntropy(fusedLoss, fused, targets, N, V, V, dscale, tc.grad)

			stride := func(vr int) int {
				if tc.ld == 0 {
					return vr
				}
				return tc.ld
			}
			// Each rank's slice, as its own (N,ld) tensor, the padding after
			// its real columns.
			slice := func(vlo, vr int) []float32 {
				x := make([]float32, N*vr)
				for i := 0; i < N; i++ {
					copy(x[i*vr:(i+1)*vr], full[i*V+vlo:i*V+vlo+vr])
				}
				return padCols(x, N, vr, stride(vr))
			}
			gt := m.Int32s(targets)
			// Step 1 on the CPU and the emulator: per-rank maxes, reduced.
			maxes := make([]float32, N)
			for i := range maxes {
				maxes[i] = float32(math.Inf(-1))
			}
			vlo := 0
			var gmax []uintptr
			for _, vr := range tc.split {
				x := slice(vlo, vr)
				mx := make([]float32, N)
				cpuBackend.ClassifierMax(mx, x, N, vr, stride(vr))
				p := m.Alloc(4 * N)
				must(t, k.ClassifierMax(0, p, m.Float32s(x), N, vr, stride(vr)))
				gmax = append(gmax, uintptr(p))
				for i := range maxes {
					maxes[i] = max(maxes[i], mx[i])
				}
				vlo += vr
			}
			run(t, m)
			gotMax := make([]float32, N)
			for i := range gotMax {
				gotMax[i] = float32(math.Inf(-1))
			}
			for j, p := range gmax {
				for i, v := range m.ReadFloat32s(ptr(p), N) {
					if tc.split[j] == 0 && !math.IsInf(float64(v), -1) {
						t.Errorf("rank %d of no real columns: max %v, want -Inf", j, v)
					}
					gotMax[i] = max(gotMax[i], v)
				}
			}
			checkExact(t, "maxes", gotMax, maxes)

			// Steps 2 and 3.
			stats := make([]float64, 2*N)
			vlo = 0
			var xs, was [][]float32
			var gxs, gss []uintptr
			gm := m.Float32s(maxes)
			for _, vr := range tc.split {
				x := slice(vlo, vr)
				st := make([]float64, 2*N)
				gx, gs := m.Float32s(x), m.Alloc(16*N)
				was = append(was, append([]float32(nil), x...))
				cpuBackend.ClassifierExp(st, x, targets, maxes, N, vr, stride(vr), vlo)
				must(t, k.ClassifierExp(0, gs, gx, gt, gm, N, vr, stride(vr), vlo))
				for i := range stats {
					stats[i] += st[i]
				}
				xs, gxs, gss = append(xs, x), append(gxs, uintptr(gx)), append(gss, uintptr(gs))
				vlo += vr
			}
			run(t, m)
			gotStats := make([]float64, 2*N)
			for _, p := range gss {
				for i, v := range m.ReadFloat64s(ptr(p), 2*N) {
					gotStats[i] += v
				}
			}
			for i := range stats {
				if d := math.Abs(gotStats[i]-stats[i]) / max(math.Abs(stats[i]), 1e-300); d > 1e-12 {
					t.Errorf("stats[%d] = %v, want %v", i, gotStats[i], stats[i])
				}
			}
			gst := m.Float64s(stats)
			vlo = 0
			var gls []uintptr
			losses := make([]float32, N)
			for j, vr := range tc.split {
				cpuBackend.ClassifierFinish(losses, xs[j], targets, maxes, stats, N, vr, stride(vr), vlo, dscale, tc.grad)
				gl := m.Alloc(4 * N)
				must(t, k.ClassifierFinish(0, gl, ptr(gxs[j]), gt, gm, gst, N, vr, stride(vr), vlo, dscale, tc.grad))
				gls = append(gls, uintptr(gl))
				vlo += vr
			}
			run(t, m)
			vlo = 0
			for j, vr := range tc.split {
				ld := stride(vr)
				got := m.ReadFloat32s(ptr(gxs[j]), N*ld)
				checkClose(t, fmt.Sprintf("rank %d losses", j), m.ReadFloat32s(ptr(gls[j]), N), losses, 1e-5)
				checkClose(t, fmt.Sprintf("rank %d logits", j), realCols(got, N, vr, ld), realCols(xs[j], N, vr, ld), 1e-5)
				if tc.grad {
					checkPadding(t, fmt.Sprintf("rank %d logits", j), got, nil, N, vr, ld)
					// The unpadded fused gradient of the rank's columns.
					want := make([]float32, 0, N*vr)
					for i := 0; i < N; i++ {
						want = append(want, fused[i*V+vlo:i*V+vlo+vr]...)
					}
					checkClose(t, fmt.Sprintf("rank %d logits vs fused", j), realCols(got, N, vr, ld), want, 1e-5)
				} else {
					checkPadding(t, fmt.Sprintf("rank %d logits", j), got, was[j], N, vr, ld)
				}
				vlo += vr
			}
			checkClose(t, "losses vs fused", losses, fusedLoss, 1e-5)
		})
	}
}

// TestClassifierGlobalMax: the largest of the ranks' row maxima, -Inf
// (a rank of no columns) and ties included, as kernels/cpu, exactly.
func TestClassifierGlobalMax(t *testing.T) {
	for _, tc := range []struct{ N, MP int }{{1, 1}, {5, 2}, {300, 3}, {4099, 8}} {
		t.Run(fmt.Sprintf("N%dMP%d", tc.N, tc.MP), func(t *testing.T) {
			r := rand.New(rand.NewPCG(13, uint64(tc.N)))
			m, k := machine(t)
			N, MP := tc.N, tc.MP
			gmax := randn(r, MP*N, 3)
			for i := range gmax {
				switch r.IntN(7) {
				case 0:
					gmax[i] = float32(math.Inf(-1))
				case 1:
					gmax[i] = gmax[i%N] // a tie with rank 0
				}
			}
			want := make([]float32, N)
			cpuBackend.ClassifierGlobalMax(want, gmax, N, MP)
			out := m.Alloc(4 * N)
			must(t, k.ClassifierGlobalMax(0, out, m.Float32s(gmax), N, MP))
			run(t, m)
			checkExact(t, "maxes", m.ReadFloat32s(out, N), want)
		})
	}
}

// TestCrossEntropyTargetOutOfRange: a target outside [0, V) reads no
// logit (a target of -1 on the first row would read before the buffer,
// which GPTUI_EMU_SANITIZE=1 reports; with a padded row stride, targets 37
// and 40 name padding columns, not real ones) and counts as kernels/cpu's
// vocabulary-parallel classifier counts a target no rank holds: a target
// logit of 0 and no one-hot in the gradient. The rows with targets in
// range are the fused classifier's as ever.
func TestCrossEntropyTargetOutOfRange(t *testing.T) {
	for _, ld := range []int{37, 48} {
		for _, grad := range []bool{true, false} {
			t.Run(fmt.Sprintf("ld%dgrad%v", ld, grad), func(t *testing.T) {
				r := rand.New(rand.NewPCG(10, 1))
				m, k := machine(t)
				targets := []int32{-1, 37, 5, 1 << 30, -1 << 31, 36, 40}
				N, V := len(targets), 37
				logits := padCols(randn(r, N*V, 4), N, V, ld)
				dscale := float32(0.25)
				// The CPU's three steps over one rank of all V columns.
				maxes, stats := make([]float32, N), make([]float64, 2*N)
				want, losses := append([]float32(nil), logits...), make([]float32, N)
				cpuBackend.ClassifierMax(maxes, want, N, V, ld)
				cpuBackend.ClassifierExp(stats, want, targets, maxes, N, V, ld, 0)
				cpuBackend.ClassifierFinish(losses, want, targets, maxes, stats, N, V, ld, 0, dscale, grad)
				if !grad {
					want = logits
				}
				gl, gx := m.Alloc(4*N), m.Float32s(logits)
				must(t, k.CrossEntropy(0, gl, gx, m.Int32s(targets), N, V, ld, dscale, grad))
				run(t, m)
				got := m.ReadFloat32s(gx, N*ld)
				checkClose(t, "losses", m.ReadFloat32s(gl, N), losses, 1e-5)
				checkClose(t, "logits", realCols(got, N, V, ld), realCols(want, N, V, ld), 1e-5)
				checkPadding(t, "logits", got, want, N, V, ld)
			})
		}
	}
}
