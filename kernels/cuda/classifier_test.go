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

func TestCrossEntropy(t *testing.T) {
	for _, tc := range []struct {
		N, V int
		grad bool
	}{
		{3, 37, true}, {4, 1000, true}, {2, 1000, false}, {5, 1, true}, {1, 513, true},
	} {
		t.Run(fmt.Sprintf("N%dV%dgrad%v", tc.N, tc.V, tc.grad), func(t *testing.T) {
			r := rand.New(rand.NewPCG(8, uint64(tc.N*10000+tc.V)))
			m, k := machine(t)
			N, V := tc.N, tc.V
			logits := randn(r, N*V, 4)
			if V > 10 {
				logits[3] = 150 // far above the rest: exps underflow to 0
			}
			targets := make([]int32, N)
			for i := range targets {
				targets[i] = int32(r.IntN(V))
			}
			dscale := 1 / float32(N)
			want, losses := append([]float32(nil), logits...), make([]float32, N)
			cpuBackend.CrossEntropy(losses, want, targets, N, V, dscale, tc.grad)
			gl, gx := m.Alloc(4*N), m.Float32s(logits)
			must(t, k.CrossEntropy(0, gl, gx, m.Int32s(targets), N, V, dscale, tc.grad))
			run(t, m)
			checkClose(t, "losses", m.ReadFloat32s(gl, N), losses, 1e-5)
			checkClose(t, "logits", m.ReadFloat32s(gx, N*V), want, 1e-5)
		})
	}
}

// TestClassifierShards runs the vocabulary-parallel classifier over two or
// three ranks' column slices (one of them empty) and checks losses and
// gradients against kernels/cpu's three-step run and its fused one.
func TestClassifierShards(t *testing.T) {
	for _, tc := range []struct {
		N     int
		split []int // columns per rank
		grad  bool
	}{
		{3, []int{20, 17}, true},
		{4, []int{300, 0, 213}, true},
		{2, []int{5, 40}, false},
	} {
		t.Run(fmt.Sprintf("N%d%v%v", tc.N, tc.split, tc.grad), func(t *testing.T) {
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
			dscale := float32(0.5)
			fused, fusedLoss := append([]float32(nil), full...), make([]float32, N)
			cpuBackend.CrossEntropy(fusedLoss, fused, targets, N, V, dscale, tc.grad)

			// Each rank's slice, as its own (N,Vr) tensor.
			slice := func(vlo, vr int) []float32 {
				x := make([]float32, N*vr)
				for i := 0; i < N; i++ {
					copy(x[i*vr:(i+1)*vr], full[i*V+vlo:i*V+vlo+vr])
				}
				return x
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
				cpuBackend.ClassifierMax(mx, x, N, vr)
				p := m.Alloc(4 * N)
				must(t, k.ClassifierMax(0, p, m.Float32s(x), N, vr))
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
						t.Errorf("rank %d of no columns: max %v, want -Inf", j, v)
					}
					gotMax[i] = max(gotMax[i], v)
				}
			}
			checkExact(t, "maxes", gotMax, maxes)

			// Steps 2 and 3.
			stats := make([]float64, 2*N)
			vlo = 0
			var xs [][]float32
			var gxs, gss []uintptr
			gm := m.Float32s(maxes)
			for _, vr := range tc.split {
				x := slice(vlo, vr)
				st := make([]float64, 2*N)
				gx, gs := m.Float32s(x), m.Alloc(16*N)
				cpuBackend.ClassifierExp(st, x, targets, maxes, N, vr, vlo)
				must(t, k.ClassifierExp(0, gs, gx, gt, gm, N, vr, vlo))
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
				cpuBackend.ClassifierFinish(losses, xs[j], targets, maxes, stats, N, vr, vlo, dscale, tc.grad)
				gl := m.Alloc(4 * N)
				must(t, k.ClassifierFinish(0, gl, ptr(gxs[j]), gt, gm, gst, N, vr, vlo, dscale, tc.grad))
				gls = append(gls, uintptr(gl))
				vlo += vr
			}
			run(t, m)
			for j, vr := range tc.split {
				checkClose(t, fmt.Sprintf("rank %d losses", j), m.ReadFloat32s(ptr(gls[j]), N), losses, 1e-5)
				checkClose(t, fmt.Sprintf("rank %d logits", j), m.ReadFloat32s(ptr(gxs[j]), N*vr), xs[j], 1e-5)
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
// which GPTUI_EMU_SANITIZE=1 reports) and counts as kernels/cpu's
// vocabulary-parallel classifier counts a target no rank holds: a target
// logit of 0 and no one-hot in the gradient. The rows with targets in
// range are the fused classifier's as ever.
func TestCrossEntropyTargetOutOfRange(t *testing.T) {
	for _, grad := range []bool{true, false} {
		t.Run(fmt.Sprintf("grad%v", grad), func(t *testing.T) {
			r := rand.New(rand.NewPCG(10, 1))
			m, k := machine(t)
			targets := []int32{-1, 37, 5, 1 << 30, -1 << 31, 36}
			N, V := len(targets), 37
			logits := randn(r, N*V, 4)
			dscale := float32(0.25)
			// The CPU's three steps over one rank of all V columns.
			maxes, stats := make([]float32, N), make([]float64, 2*N)
			want, losses := append([]float32(nil), logits...), make([]float32, N)
			cpuBackend.ClassifierMax(maxes, want, N, V)
			cpuBackend.ClassifierExp(stats, want, targets, maxes, N, V, 0)
			cpuBackend.ClassifierFinish(losses, want, targets, maxes, stats, N, V, 0, dscale, grad)
			if !grad {
				want = logits
			}
			gl, gx := m.Alloc(4*N), m.Float32s(logits)
			must(t, k.CrossEntropy(0, gl, gx, m.Int32s(targets), N, V, dscale, grad))
			run(t, m)
			checkClose(t, "losses", m.ReadFloat32s(gl, N), losses, 1e-5)
			checkClose(t, "logits", m.ReadFloat32s(gx, N*V), want, 1e-5)
		})
	}
}
