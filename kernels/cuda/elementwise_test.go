package cuda_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cuda"
)

// sizes are element counts around the float4 and block boundaries.
var sizes = []int{1, 3, 37, 256, 1027}

func TestBias(t *testing.T) {
	for _, tc := range []struct{ N, OC, off int }{
		{5, 12, 0}, {300, 37, 0}, {513, 64, 0}, {7, 16, 1}, {1, 1, 0},
	} {
		t.Run(fmt.Sprintf("N%dOC%doff%d", tc.N, tc.OC, tc.off), func(t *testing.T) {
			r := rand.New(rand.NewPCG(4, uint64(tc.N*100+tc.OC)))
			m, k := machine(t)
			N, OC := tc.N, tc.OC
			out0, bias, dout, db0 := randn(r, N*OC, 1), randn(r, OC, 1), randn(r, N*OC, 1), randn(r, OC, 1)
			// kernels/cpu adds the bias inside MatmulForward and sums it in
			// MatmulBackward: the reference is its loops, written out.
			want := append([]float32(nil), out0...)
			for i := range want {
				want[i] += bias[i%OC]
			}
			db := append([]float32(nil), db0...)
			for i, g := range dout {
				db[i%OC] += g
			}
			out, gdb := place(m, out0, tc.off), place(m, db0, tc.off)
			must(t, k.BiasAdd(0, out, place(m, bias, tc.off), N, OC))
			must(t, k.BiasBackward(0, gdb, place(m, dout, tc.off), N, OC))
			run(t, m)
			checkExact(t, "out", m.ReadFloat32s(out, N*OC), want)
			checkClose(t, "dbias", m.ReadFloat32s(gdb, OC), db, 1e-5)
		})
	}
}

func TestGelu(t *testing.T) {
	for _, n := range sizes {
		for _, off := range []int{0, 1} {
			t.Run(fmt.Sprintf("n%doff%d", n, off), func(t *testing.T) {
				r := rand.New(rand.NewPCG(5, uint64(n)))
				m, k := machine(t)
				inp, dout := randn(r, n, 3), randn(r, n, 1)
				for i, v := range []float32{0, 1e-7, -3e-7, 25, -25, 9.5, -4} {
					if i < n {
						inp[i] = v
					}
				}
				out, dinp := make([]float32, n), make([]float32, n)
				cpuBackend.GeluForward(out, inp)
				cpuBackend.GeluBackward(dinp, inp, out, dout)
				gin, gout := place(m, inp, off), place(m, make([]float32, n), off)
				gdout, gdinp := place(m, dout, off), place(m, make([]float32, n), off)
				// Without out, the derivative of inp alone, tanh u computed
				// (MatmulBackwardGelu's): the CPU's, through a 1×1 identity GEMM.
				dx := make([]float32, n)
				cpuBackend.MatmulBackwardGelu(dx, make([]float32, 1), nil, dout, make([]float32, n), inp, []float32{1}, n, 1, 1)
				gdx := place(m, make([]float32, n), off)
				must(t, k.GeluForward(0, gout, gin, n))
				must(t, k.GeluBackward(0, gdinp, gin, gout, gdout, n))
				must(t, k.GeluBackward(0, gdx, gin, nil, gdout, n))
				run(t, m)
				checkClose(t, "out", m.ReadFloat32s(gout, n), out, 1e-5)
				checkClose(t, "dinp", m.ReadFloat32s(gdinp, n), dinp, 1e-5)
				checkExact(t, "out", m.ReadFloat32s(gout, n), out)
				checkExact(t, "dinp", m.ReadFloat32s(gdinp, n), dinp)
				checkExact(t, "dinp of inp alone", m.ReadFloat32s(gdx, n), dx)
			})
		}
	}
}

func TestResidualScale(t *testing.T) {
	for _, n := range sizes {
		for _, off := range []int{0, 3} {
			t.Run(fmt.Sprintf("n%doff%d", n, off), func(t *testing.T) {
				r := rand.New(rand.NewPCG(6, uint64(n)))
				m, k := machine(t)
				a, c := randn(r, n, 1), randn(r, n, 1)
				want := make([]float32, n)
				cpuBackend.ResidualForward(want, a, c)
				scaled := append([]float32(nil), want...)
				cpuBackend.Scale(scaled, 0.37)
				ga, gc := place(m, a, off), place(m, c, off)
				must(t, k.ResidualForward(0, ga, ga, gc, n)) // out aliases a
				run(t, m)
				checkExact(t, "residual", m.ReadFloat32s(ga, n), want)
				must(t, k.Scale(0, ga, n, 0.37))
				run(t, m)
				checkExact(t, "scale", m.ReadFloat32s(ga, n), scaled)
			})
		}
	}
}

func TestDropout(t *testing.T) {
	for _, tc := range []struct {
		n, off  int
		p       float32
		stream  uint64
		inPlace bool
	}{
		{37, 0, 0.1, 0, false},
		{1027, 0, 0.5, 12345, true},
		{256, 1, 0.25, 1 << 40, false},
		{5, 0, 0, 7, false},
		{9, 0, 0, 7, true},
	} {
		t.Run(fmt.Sprintf("n%d_p%v_off%d_inplace%v", tc.n, tc.p, tc.off, tc.inPlace), func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, uint64(tc.n)))
			m, k := machine(t)
			d := kernels.Dropout{P: tc.p, Key: kernels.SiteKey(42, 3, 1, 5, 2)}
			in, dout := randn(r, tc.n, 1), randn(r, tc.n, 1)
			want, dwant := make([]float32, tc.n), make([]float32, tc.n)
			cpuBackend.DropoutForward(want, in, d, tc.stream)
			cpuBackend.DropoutBackward(dwant, dout, d, tc.stream)
			gin, gdout := place(m, in, tc.off), place(m, dout, tc.off)
			gout, gdinp := gin, gdout
			if !tc.inPlace {
				gout, gdinp = place(m, make([]float32, tc.n), tc.off), place(m, make([]float32, tc.n), tc.off)
			}
			must(t, k.DropoutForward(0, gout, gin, tc.n, d.P, d.Key, tc.stream))
			must(t, k.DropoutBackward(0, gdinp, gdout, tc.n, d.P, d.Key, tc.stream))
			run(t, m)
			got := m.ReadFloat32s(gout, tc.n)
			checkExact(t, "out", got, want)
			checkExact(t, "dinp", m.ReadFloat32s(gdinp, tc.n), dwant)
			if tc.p > 0 {
				zeros := 0
				for _, v := range got {
					if v == 0 {
						zeros++
					}
				}
				t.Logf("%d of %d dropped", zeros, tc.n)
				if tc.n > 100 && zeros == 0 {
					t.Error("nothing dropped")
				}
			}
		})
	}
	_, k := machine(t)
	if err := k.DropoutForward(0, cuda.Ptr(0), cuda.Ptr(0), 1, 1, 0, 0); err == nil {
		t.Error("dropout with p = 1 accepted")
	}
}
