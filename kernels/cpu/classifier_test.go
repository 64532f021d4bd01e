package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// padLogits lays the (N,V) logits out with row stride ld, the padding
// columns filled with values that would dominate any maximum or sum they
// entered (and a NaN).
func padLogits(x []float32, N, V, ld int) []float32 {
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

// checkPadded checks that the padded logits' real columns equal want
// (N,V) exactly, and, when zero, that every padding column is exactly 0.
func checkPadded(t *testing.T, what string, got, want []float32, N, V, ld int, zero bool) {
	t.Helper()
	for r := 0; r < N; r++ {
		for j := 0; j < ld; j++ {
			g := got[r*ld+j]
			switch {
			case j < V && math.Float32bits(g) != math.Float32bits(want[r*V+j]):
				t.Fatalf("%s[%d,%d] = %v, unpadded %v", what, r, j, g, want[r*V+j])
			case j >= V && zero && math.Float32bits(g) != 0:
				t.Fatalf("%s[%d,%d] (padding) = %v, want 0", what, r, j, g)
			}
		}
	}
}

// TestCrossEntropyPadded: logits with row stride ld > V give the unpadded
// kernel's losses and real-column gradient bit for bit, the padding's
// gradient exactly 0 (training) or the padding untouched (evaluation).
func TestCrossEntropyPadded(t *testing.T) {
	be := New()
	for _, tc := range []struct {
		N, V, ld int
		grad     bool
	}{{5, 97, 128, true}, {5, 97, 128, false}, {3, 128, 128, true}, {4, 1, 7, true}} {
		t.Run(fmt.Sprintf("N%dV%dld%dgrad%v", tc.N, tc.V, tc.ld, tc.grad), func(t *testing.T) {
			N, V, ld := tc.N, tc.V, tc.ld
			r := rand.New(rand.NewPCG(21, uint64(V*1000+ld)))
			x := randn(r, N*V, 3)
			targets := make([]int32, N)
			for i := range targets {
				targets[i] = int32(r.IntN(V))
			}
			targets[0] = int32(V - 1) // the last real column
			const dscale = 0.2
			want, wantL := append([]float32(nil), x...), make([]float32, N)
			be.CrossEntropy(wantL, want, targets, N, V, V, dscale, tc.grad)
			p, losses := padLogits(x, N, V, ld), make([]float32, N)
			orig := append([]float32(nil), p...)
			be.CrossEntropy(losses, p, targets, N, V, ld, dscale, tc.grad)
			for i := range losses {
				if math.Float32bits(losses[i]) != math.Float32bits(wantL[i]) {
					t.Fatalf("loss[%d] = %v, unpadded %v", i, losses[i], wantL[i])
				}
			}
			checkPadded(t, "logits", p, want, N, V, ld, tc.grad)
			if !tc.grad {
				for i := range p {
					if math.Float32bits(p[i]) != math.Float32bits(orig[i]) {
						t.Fatalf("evaluation changed logits[%d]: %v, was %v", i, p[i], orig[i])
					}
				}
			}
		})
	}
}

// TestClassifierShardsPadded: the vocabulary-parallel classifier over the
// MP ranks' Vp/MP columns each, the real ones first (a rank may hold only
// padding, as sliceDims lays them out), gives the unpadded fused kernel's
// losses and gradients and 0 in every padding column.
func TestClassifierShardsPadded(t *testing.T) {
	be := New()
	for _, tc := range []struct{ N, V, Vp, MP int }{{4, 97, 128, 1}, {4, 97, 128, 4}, {3, 50, 128, 4}, {2, 128, 128, 2}} {
		t.Run(fmt.Sprintf("N%dV%dVp%dMP%d", tc.N, tc.V, tc.Vp, tc.MP), func(t *testing.T) {
			N, V, ld := tc.N, tc.V, tc.Vp/tc.MP
			r := rand.New(rand.NewPCG(22, uint64(V*1000+tc.MP)))
			x := randn(r, N*V, 3)
			targets := make([]int32, N)
			for i := range targets {
				targets[i] = int32(r.IntN(V))
			}
			targets[0] = int32(V - 1)
			const dscale = 0.5
			want, wantL := append([]float32(nil), x...), make([]float32, N)
			be.CrossEntropy(wantL, want, targets, N, V, V, dscale, true)

			// Rank k: global columns k·ld … (k+1)·ld−1, the real among them first.
			full := padLogits(x, N, V, tc.Vp)
			pieces, vls := make([][]float32, tc.MP), make([]int, tc.MP)
			maxes := make([]float32, N)
			for i := range maxes {
				maxes[i] = float32(math.Inf(-1))
			}
			for k := range pieces {
				vls[k] = min(max(V-k*ld, 0), ld)
				pieces[k] = make([]float32, N*ld)
				for rr := 0; rr < N; rr++ {
					copy(pieces[k][rr*ld:(rr+1)*ld], full[rr*tc.Vp+k*ld:rr*tc.Vp+(k+1)*ld])
				}
				m := make([]float32, N)
				be.ClassifierMax(m, pieces[k], N, vls[k], ld)
				for i := range m {
					if vls[k] == 0 && !math.IsInf(float64(m[i]), -1) {
						t.Fatalf("rank %d of only padding: max %v, want -Inf", k, m[i])
					}
					maxes[i] = max(maxes[i], m[i])
				}
			}
			stats := make([]float64, 2*N)
			for k := range pieces {
				st := make([]float64, 2*N)
				be.ClassifierExp(st, pieces[k], targets, maxes, N, vls[k], ld, k*ld)
				for i := range st {
					stats[i] += st[i]
				}
			}
			for k := range pieces {
				losses := make([]float32, N)
				be.ClassifierFinish(losses, pieces[k], targets, maxes, stats, N, vls[k], ld, k*ld, dscale, true)
				for i := range losses {
					if d := math.Abs(float64(losses[i] - wantL[i])); d > 1e-5*math.Abs(float64(wantL[i]))+1e-6 {
						t.Errorf("rank %d row %d: loss %v, unpadded %v", k, i, losses[i], wantL[i])
					}
				}
				for rr := 0; rr < N; rr++ {
					for j := 0; j < ld; j++ {
						g := pieces[k][rr*ld+j]
						if j >= vls[k] {
							if math.Float32bits(g) != 0 {
								t.Fatalf("rank %d grad[%d,%d] (padding) = %v, want 0", k, rr, k*ld+j, g)
							}
							continue
						}
						if w := want[rr*V+k*ld+j]; math.Abs(float64(g-w)) > 1e-6 {
							t.Fatalf("rank %d grad[%d,%d] = %v, unpadded %v", k, rr, k*ld+j, g, w)
						}
					}
				}
			}
		})
	}
}

// TestClassifierStrideChecked: a row stride below V, logits shorter than
// N·ld, or a target in the padding panics rather than reading out of
// place.
func TestClassifierStrideChecked(t *testing.T) {
	be := New()
	for name, f := range map[string]func(){
		"ld<V":           func() { be.CrossEntropy(make([]float32, 2), make([]float32, 20), []int32{0, 0}, 2, 10, 9, 1, true) },
		"short":          func() { be.ClassifierMax(make([]float32, 2), make([]float32, 23), 2, 10, 12) },
		"target padding": func() { be.CrossEntropy(make([]float32, 1), make([]float32, 16), []int32{12}, 1, 10, 16, 1, true) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			f()
		})
	}
}
