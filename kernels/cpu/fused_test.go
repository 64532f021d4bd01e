package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// checkBits fails the test unless got and want are equal bit for bit.
func checkBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Errorf("%s[%d] = %v, want %v (bit for bit)", what, i, got[i], want[i])
			return
		}
	}
}

// fusedCases are the shapes of the fused tests: a row shorter than a
// vector, odd widths, GPT-2 small's C, and more rows than one thread's
// share.
var fusedCases = []struct{ N, C int }{
	{1, 1}, {3, 5}, {7, 100}, {4, 771}, {9, 768}, {300, 24},
}

// TestResidualLayerNormForward: the fused kernel is ResidualForward then
// LayerNormForward, bit for bit, at any number of threads and with res
// aliasing x (the engine's in-place form) or y.
func TestResidualLayerNormForward(t *testing.T) {
	for _, tc := range fusedCases {
		for _, threads := range []int{1, 3} {
			t.Run(fmt.Sprintf("N%dC%dthreads%d", tc.N, tc.C, threads), func(t *testing.T) {
				be := &Backend{threads: threads}
				r := rand.New(rand.NewPCG(41, uint64(tc.N*1000+tc.C)))
				N, C := tc.N, tc.C
				x, y := randn(r, N*C, 2), randn(r, N*C, 1)
				for i := range x {
					x[i] += 3 // a mean away from 0
				}
				w, b := randn(r, C, 1), randn(r, C, 1)

				res, out, mean, rstd := make([]float32, N*C), make([]float32, N*C), make([]float32, N), make([]float32, N)
				be.ResidualForward(res, x, y)
				be.LayerNormForward(out, mean, rstd, res, w, b, N, C)

				for _, alias := range []string{"none", "x", "y"} {
					xs, ys := append([]float32(nil), x...), append([]float32(nil), y...)
					gres := make([]float32, N*C)
					switch alias {
					case "x":
						gres = xs
					case "y":
						gres = ys
					}
					gout, gmean, grstd := make([]float32, N*C), make([]float32, N), make([]float32, N)
					be.ResidualLayerNormForward(gres, gout, gmean, grstd, xs, ys, w, b, N, C)
					checkBits(t, "res (alias "+alias+")", gres, res)
					checkBits(t, "out (alias "+alias+")", gout, out)
					checkBits(t, "mean (alias "+alias+")", gmean, mean)
					checkBits(t, "rstd (alias "+alias+")", grstd, rstd)
				}
			})
		}
	}
}

// TestResidualRMSNormForward: the fused kernel is ResidualForward then
// RMSNormForward, bit for bit, as TestResidualLayerNormForward.
func TestResidualRMSNormForward(t *testing.T) {
	for _, tc := range fusedCases {
		for _, threads := range []int{1, 3} {
			t.Run(fmt.Sprintf("N%dC%dthreads%d", tc.N, tc.C, threads), func(t *testing.T) {
				be := &Backend{threads: threads}
				r := rand.New(rand.NewPCG(43, uint64(tc.N*1000+tc.C)))
				N, C := tc.N, tc.C
				x, y, w := randn(r, N*C, 2), randn(r, N*C, 1), randn(r, C, 1)
				const eps = 1e-6

				res, out, rstd := make([]float32, N*C), make([]float32, N*C), make([]float32, N)
				be.ResidualForward(res, x, y)
				be.RMSNormForward(out, rstd, res, w, N, C, eps)

				for _, alias := range []string{"none", "x", "y"} {
					xs, ys := append([]float32(nil), x...), append([]float32(nil), y...)
					gres := make([]float32, N*C)
					switch alias {
					case "x":
						gres = xs
					case "y":
						gres = ys
					}
					gout, grstd := make([]float32, N*C), make([]float32, N)
					be.ResidualRMSNormForward(gres, gout, grstd, xs, ys, w, N, C, eps)
					checkBits(t, "res (alias "+alias+")", gres, res)
					checkBits(t, "out (alias "+alias+")", gout, out)
					checkBits(t, "rstd (alias "+alias+")", grstd, rstd)
				}
			})
		}
	}
}
