package cuda_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

func TestLayerNorm(t *testing.T) {
	for _, tc := range []struct{ N, C, off int }{
		{5, 32, 0},
		{7, 100, 0},
		{3, 771, 0},
		{40, 64, 0},
		{9, 48, 2},
		{70, 36, 0}, // more rows than one backward block's share
	} {
		t.Run(fmt.Sprintf("N%dC%doff%d", tc.N, tc.C, tc.off), func(t *testing.T) {
			r := rand.New(rand.NewPCG(2, uint64(tc.N*1000+tc.C)))
			m, k := machine(t)
			N, C, o := tc.N, tc.C, tc.off
			inp := randn(r, N*C, 2)
			for i := range inp {
				inp[i] += 3 // a mean well away from 0
			}
			w, b := randn(r, C, 1), randn(r, C, 1)
			dout := randn(r, N*C, 1)
			dinp0, dw0, db0 := randn(r, N*C, 1), randn(r, C, 1), randn(r, C, 1)

			out, mean, rstd := make([]float32, N*C), make([]float32, N), make([]float32, N)
			cpuBackend.LayerNormForward(out, mean, rstd, inp, w, b, N, C)
			dinp, dw, db := append([]float32(nil), dinp0...), append([]float32(nil), dw0...), append([]float32(nil), db0...)
			cpuBackend.LayerNormBackward(dinp, dw, db, dout, inp, w, mean, rstd, N, C)

			gout, gmean, grstd := place(m, make([]float32, N*C), o), m.Alloc(4*N), m.Alloc(4*N)
			gin, gw, gb := place(m, inp, o), place(m, w, o), place(m, b, o)
			must(t, k.LayerNormForward(0, gout, gmean, grstd, gin, gw, gb, N, C))
			run(t, m)
			checkClose(t, "out", m.ReadFloat32s(gout, N*C), out, 1e-5)
			checkClose(t, "mean", m.ReadFloat32s(gmean, N), mean, 1e-5)
			checkClose(t, "rstd", m.ReadFloat32s(grstd, N), rstd, 1e-5)

			// The backward pass from the CPU's mean and rstd, so that it is
			// judged alone.
			gdinp, gdw, gdb := place(m, dinp0, o), place(m, dw0, o), place(m, db0, o)
			gdout, cm, cr := place(m, dout, o), m.Float32s(mean), m.Float32s(rstd)
			must(t, k.LayerNormBackward(0, gdinp, gdw, gdb, gdout, gin, gw, cm, cr, N, C))
			run(t, m)
			checkClose(t, "dinp", m.ReadFloat32s(gdinp, N*C), dinp, 1e-5)
			checkClose(t, "dw", m.ReadFloat32s(gdw, C), dw, 1e-5)
			checkClose(t, "dbias", m.ReadFloat32s(gdb, C), db, 1e-5)
		})
	}
}

// TestLayerNormNoStats: mean and rstd may be 0 (inference keeps neither).
func TestLayerNormNoStats(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	m, k := machine(t)
	N, C := 3, 40
	inp, w, b := randn(r, N*C, 1), randn(r, C, 1), randn(r, C, 1)
	want := make([]float32, N*C)
	cpuBackend.LayerNormForward(want, make([]float32, N), make([]float32, N), inp, w, b, N, C)
	out := m.Alloc(4 * N * C)
	must(t, k.LayerNormForward(0, out, 0, 0, m.Float32s(inp), m.Float32s(w), m.Float32s(b), N, C))
	run(t, m)
	checkClose(t, "out", m.ReadFloat32s(out, N*C), want, 1e-5)
}
