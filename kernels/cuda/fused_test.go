package cuda_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gptui/gptui/kernels/cuda"
	"github.com/gptui/gptui/kernels/cuda/emu"
)

// The residual add fused with its norm (fused.cu) under the emulator:
// res exactly kernels/cpu's ResidualForward (one float addition per
// element), out and the statistics within the norm kernels' tolerances of
// kernels/cpu's fused kernel, which is ResidualForward then the norm bit
// for bit, and of this package's two kernels, residual_forward then the
// norm's.

// fusedCase is a shape of the fused tests; off moves every buffer by that
// many floats (unaligned: the scalar path); alias stores res over x.
type fusedCase struct {
	N, C, off int
	alias     bool
	eps       float32 // RMSNorm's
}

func (tc fusedCase) String() string {
	return fmt.Sprintf("N%dC%doff%dalias%v", tc.N, tc.C, tc.off, tc.alias)
}

var fusedCases = []fusedCase{
	{5, 32, 0, false, 1e-5},
	{7, 100, 0, false, 1e-6},
	{3, 771, 0, false, 1e-5}, // C % 4 ≠ 0: the scalar path
	{9, 48, 2, false, 1e-5},  // unaligned: the scalar path
	{40, 64, 0, true, 1e-5},  // res over x, as ResidualForward's out over a
	{13, 36, 1, true, 0.5},   // both
	{70, 768, 0, false, 1e-5},
}

// fusedInputs returns x (N,C) with a mean well away from 0, y (N,C), w and
// bias (C).
func fusedInputs(seed uint64, tc fusedCase) (x, y, w, b []float32) {
	r := rand.New(rand.NewPCG(seed, uint64(tc.N*1000+tc.C)))
	x, y = randn(r, tc.N*tc.C, 2), randn(r, tc.N*tc.C, 1)
	for i := range x {
		x[i] += 3
	}
	return x, y, randn(r, tc.C, 1), randn(r, tc.C, 1)
}

// fusedRes returns the device buffer for res: x's when the case aliases
// them, else a fresh one at the case's offset.
func fusedRes(m *emu.Machine, tc fusedCase, gx cuda.Ptr) cuda.Ptr {
	if tc.alias {
		return gx
	}
	return place(m, make([]float32, tc.N*tc.C), tc.off)
}

func TestResidualLayerNormForward(t *testing.T) {
	m, k := machine(t)
	var checks []func()
	for _, tc := range fusedCases {
		name, N, C, o := tc.String(), tc.N, tc.C, tc.off
		x, y, w, b := fusedInputs(6, tc)
		res, out, mean, rstd := make([]float32, N*C), make([]float32, N*C), make([]float32, N), make([]float32, N)
		cpuBackend.ResidualLayerNormForward(res, out, mean, rstd, x, y, w, b, N, C)

		gx, gy, gw, gb := place(m, x, o), place(m, y, o), place(m, w, o), place(m, b, o)
		gres, gout, gmean, grstd := fusedRes(m, tc, gx), place(m, make([]float32, N*C), o), m.Alloc(4*N), m.Alloc(4*N)
		must(t, k.ResidualLayerNormForward(0, gres, gout, gmean, grstd, gx, gy, gw, gb, N, C))

		// The two kernels it fuses, on copies of the inputs.
		tres, tout, tmean, trstd := place(m, make([]float32, N*C), o), place(m, make([]float32, N*C), o), m.Alloc(4*N), m.Alloc(4*N)
		must(t, k.ResidualForward(0, tres, place(m, x, o), place(m, y, o), N*C))
		must(t, k.LayerNormForward(0, tout, tmean, trstd, tres, gw, gb, N, C))

		checks = append(checks, func() {
			checkExact(t, name+" res", m.ReadFloat32s(gres, N*C), res)
			gotOut, gotMean, gotRstd := m.ReadFloat32s(gout, N*C), m.ReadFloat32s(gmean, N), m.ReadFloat32s(grstd, N)
			checkClose(t, name+" out", gotOut, out, 1e-5)
			checkClose(t, name+" mean", gotMean, mean, 1e-5)
			checkClose(t, name+" rstd", gotRstd, rstd, 1e-5)
			checkClose(t, name+" out vs the two kernels", gotOut, m.ReadFloat32s(tout, N*C), 1e-5)
			checkClose(t, name+" mean vs the two kernels", gotMean, m.ReadFloat32s(tmean, N), 1e-5)
			checkClose(t, name+" rstd vs the two kernels", gotRstd, m.ReadFloat32s(trstd, N), 1e-5)
		})
	}
	// mean and rstd may be 0 (not kept), as LayerNormForward's.
	tc := fusedCase{N: 3, C: 40}
	x, y, w, b := fusedInputs(7, tc)
	res, out := make([]float32, 3*40), make([]float32, 3*40)
	cpuBackend.ResidualLayerNormForward(res, out, make([]float32, 3), make([]float32, 3), x, y, w, b, 3, 40)
	gres, gout := m.Alloc(4*3*40), m.Alloc(4*3*40)
	must(t, k.ResidualLayerNormForward(0, gres, gout, 0, 0, m.Float32s(x), m.Float32s(y), m.Float32s(w), m.Float32s(b), 3, 40))
	checks = append(checks, func() {
		checkExact(t, "no stats: res", m.ReadFloat32s(gres, 3*40), res)
		checkClose(t, "no stats: out", m.ReadFloat32s(gout, 3*40), out, 1e-5)
	})
	run(t, m)
	for _, c := range checks {
		c()
	}
}

func TestResidualRMSNormForward(t *testing.T) {
	m, k := machine(t)
	var checks []func()
	for _, tc := range fusedCases {
		name, N, C, o := tc.String(), tc.N, tc.C, tc.off
		x, y, w, _ := fusedInputs(8, tc)
		res, out, rstd := make([]float32, N*C), make([]float32, N*C), make([]float32, N)
		cpuBackend.ResidualRMSNormForward(res, out, rstd, x, y, w, N, C, tc.eps)

		gx, gy, gw := place(m, x, o), place(m, y, o), place(m, w, o)
		gres, gout, grstd := fusedRes(m, tc, gx), place(m, make([]float32, N*C), o), m.Alloc(4*N)
		must(t, k.ResidualRMSNormForward(0, gres, gout, grstd, gx, gy, gw, N, C, tc.eps))

		tres, tout, trstd := place(m, make([]float32, N*C), o), place(m, make([]float32, N*C), o), m.Alloc(4*N)
		must(t, k.ResidualForward(0, tres, place(m, x, o), place(m, y, o), N*C))
		must(t, k.RMSNormForward(0, tout, trstd, tres, gw, N, C, tc.eps))

		checks = append(checks, func() {
			checkExact(t, name+" res", m.ReadFloat32s(gres, N*C), res)
			gotOut, gotRstd := m.ReadFloat32s(gout, N*C), m.ReadFloat32s(grstd, N)
			checkClose(t, name+" out", gotOut, out, 1e-5)
			checkClose(t, name+" rstd", gotRstd, rstd, 1e-6)
			checkClose(t, name+" out vs the two kernels", gotOut, m.ReadFloat32s(tout, N*C), 1e-5)
			checkClose(t, name+" rstd vs the two kernels", gotRstd, m.ReadFloat32s(trstd, N), 1e-6)
		})
	}
	run(t, m)
	for _, c := range checks {
		c()
	}
}

// TestResidualRMSNormEps: a bad eps is refused before anything is queued.
func TestResidualRMSNormEps(t *testing.T) {
	_, k := machine(t)
	for _, eps := range []float32{-1, float32(math.Inf(1)), float32(math.NaN())} {
		var p cuda.Ptr
		if err := k.ResidualRMSNormForward(0, p, p, p, p, p, p, 1, 4, eps); err == nil {
			t.Errorf("eps %v: no error", eps)
		}
	}
}
