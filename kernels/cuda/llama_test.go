package cuda_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
)

// The Llama family's kernels under the emulator against kernels/cpu, with
// the tolerances of the GPT-2 kernels' tests: 1e-5 relative for fp32 work
// (the kernels are fp32 whatever the GEMM precision, as LayerNorm and
// attention are), attention's L2 and largest-error bound for attention.

// Each test records every case's launches on one Machine and runs them
// once: a run starts a process, which costs more than these kernels.

func TestRMSNorm(t *testing.T) {
	m, k := machine(t)
	var checks []func()
	for _, tc := range []struct {
		N, C, off int
		eps       float32
	}{
		{5, 32, 0, 1e-5},
		{7, 100, 0, 1e-6},
		{9, 48, 2, 1e-5}, // unaligned: the scalar path
		{70, 36, 0, 0.5}, // more rows than one backward block's share
	} {
		name := fmt.Sprintf("N%dC%doff%d", tc.N, tc.C, tc.off)
		r := rand.New(rand.NewPCG(4, uint64(tc.N*1000+tc.C)))
		N, C, o := tc.N, tc.C, tc.off
		inp, w, dout := randn(r, N*C, 2), randn(r, C, 1), randn(r, N*C, 1)
		dinp0, dw0 := randn(r, N*C, 1), randn(r, C, 1)

		out, rstd := make([]float32, N*C), make([]float32, N)
		cpuBackend.RMSNormForward(out, rstd, inp, w, N, C, tc.eps)
		dinp, dw := slices.Clone(dinp0), slices.Clone(dw0)
		cpuBackend.RMSNormBackward(dinp, dw, dout, inp, w, rstd, N, C)

		gout, grstd := place(m, make([]float32, N*C), o), m.Alloc(4*N)
		gin, gw := place(m, inp, o), place(m, w, o)
		must(t, k.RMSNormForward(0, gout, grstd, gin, gw, N, C, tc.eps))
		gdinp, gdw, gdout := place(m, dinp0, o), place(m, dw0, o), place(m, dout, o)
		// The backward pass from the CPU's rstd, so that it is judged alone.
		must(t, k.RMSNormBackward(0, gdinp, gdw, gdout, gin, gw, m.Float32s(rstd), N, C))
		checks = append(checks, func() {
			checkClose(t, name+" out", m.ReadFloat32s(gout, N*C), out, 1e-5)
			checkClose(t, name+" rstd", m.ReadFloat32s(grstd, N), rstd, 1e-6)
			checkClose(t, name+" dinp", m.ReadFloat32s(gdinp, N*C), dinp, 1e-5)
			checkClose(t, name+" dw", m.ReadFloat32s(gdw, C), dw, 1e-5)
		})
	}
	run(t, m)
	for _, c := range checks {
		c()
	}
}

func TestRoPE(t *testing.T) {
	rope := kernels.RoPE{Theta: 500000, Scaling: &kernels.RoPEScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 64}}
	m, k := machine(t)
	var checks []func()
	for _, tc := range []struct{ B, T, C, heads, hd, pos0 int }{
		{2, 5, 3 * 4, 2, 4, 0},    // a qkv row of hd 4, NH = NKV = 1: v copied
		{1, 3, 6 * 64, 5, 64, 7},  // hd 64, NH 4, NKV 1, later positions
		{2, 3, 2 * 8, 2, 8, 100},  // every channel rotated
		{1, 1, 10, 1, 2, 4093},    // one decoding row
		{3, 7, 5 * 6, 3, 6, 0},    // odd T, hd 6
		{1, 2, 4 * 32, 2, 32, 40}, // the other channels copied
	} {
		name := fmt.Sprintf("B%dT%dC%dheads%dhd%dpos%d", tc.B, tc.T, tc.C, tc.heads, tc.hd, tc.pos0)
		r := rand.New(rand.NewPCG(5, uint64(tc.C+tc.pos0)))
		B, T, C, heads, hd, pos0 := tc.B, tc.T, tc.C, tc.heads, tc.hd, tc.pos0
		n := B * T * C
		table := make([]float32, (pos0+T)*hd)
		rope.Table(table, pos0+T, hd)
		inp, dout := randn(r, n, 1), randn(r, n, 1)
		out, dinp := make([]float32, n), make([]float32, n)
		cpuBackend.RoPEForward(out, inp, table, B, T, C, heads, hd, pos0)
		cpuBackend.RoPEBackward(dinp, dout, table, B, T, C, heads, hd, pos0)

		gt, gin := m.Float32s(table), m.Float32s(inp)
		gout, ginpl := m.Float32s(randn(r, n, 1)), m.Float32s(inp)
		gdout := m.Float32s(dout)
		must(t, k.RoPEForward(0, gout, gin, gt, B, T, C, heads, hd, pos0))
		must(t, k.RoPEForward(0, ginpl, ginpl, gt, B, T, C, heads, hd, pos0))
		must(t, k.RoPEBackward(0, gdout, gdout, gt, B, T, C, heads, hd, pos0))
		checks = append(checks, func() {
			checkClose(t, name+" out", m.ReadFloat32s(gout, n), out, 1e-6)
			checkClose(t, name+" out in place", m.ReadFloat32s(ginpl, n), out, 1e-6)
			checkClose(t, name+" dinp in place", m.ReadFloat32s(gdout, n), dinp, 1e-6)
		})
	}
	run(t, m)
	for _, c := range checks {
		c()
	}
}

func TestSwiGLU(t *testing.T) {
	m, k := machine(t)
	var checks []func()
	for _, tc := range []struct{ N, F, off int }{
		{7, 33, 0}, // odd F: the scalar path
		{5, 64, 0}, // float4s
		{3, 16, 1}, // unaligned
		{1, 1, 0},
	} {
		name := fmt.Sprintf("N%dF%doff%d", tc.N, tc.F, tc.off)
		r := rand.New(rand.NewPCG(6, uint64(tc.N*100+tc.F)))
		N, F, o := tc.N, tc.F, tc.off
		inp, dout := randn(r, N*2*F, 3), randn(r, N*F, 1)
		for i, v := range []float32{0, -20, 20, -90, 90, 1e-7} {
			if i < F {
				inp[i] = v // the sigmoid's tails, in row 0's gate
			}
		}
		out, dinp := make([]float32, N*F), make([]float32, N*2*F)
		cpuBackend.SwiGLUForward(out, inp, N, F)
		cpuBackend.SwiGLUBackward(dinp, inp, dout, N, F)

		gin := place(m, inp, o)
		gout, gdinp := place(m, make([]float32, N*F), o), place(m, randn(r, N*2*F, 1), o)
		must(t, k.SwiGLUForward(0, gout, gin, N, F))
		must(t, k.SwiGLUBackward(0, gdinp, gin, place(m, dout, o), N, F))
		checks = append(checks, func() {
			checkClose(t, name+" out", m.ReadFloat32s(gout, N*F), out, 1e-5)
			checkClose(t, name+" dinp", m.ReadFloat32s(gdinp, N*2*F), dinp, 1e-5)
		})
	}
	run(t, m)
	for _, c := range checks {
		c()
	}
}

// TestGQA runs the grouped-query forward and backward kernels under the
// emulator against kernels/cpu's: one key/value head for all query heads,
// groups of 2 and 4, the generic kernel, T across the 64-row tile, dropout
// with tensor-parallel head placement.
func TestGQA(t *testing.T) {
	cases := []struct {
		B, T, NH, NKV, hs int
		p                 float32
		heads, head0      int
	}{
		{B: 1, T: 17, NH: 4, NKV: 1, hs: 32},                             // NKV = 1
		{B: 2, T: 33, NH: 4, NKV: 2, hs: 20, p: 0.1, heads: 8, head0: 4}, // the generic kernel, a rank's heads
		{B: 1, T: 67, NH: 8, NKV: 2, hs: 64, p: 0.1},                     // groups of 4, two tiles
	}
	for _, c := range cases {
		name := fmt.Sprintf("B%d_T%d_NH%d_NKV%d_hs%d_p%g", c.B, c.T, c.NH, c.NKV, c.hs, c.p)
		t.Run(name, func(t *testing.T) {
			B, T, NH, NKV, hs := c.B, c.T, c.NH, c.NKV, c.hs
			ld, C := (NH+2*NKV)*hs, NH*hs
			r := rand.New(rand.NewPCG(uint64(B*T), uint64(NH*NKV*hs)))
			qkv, dout := attRandom(r, B*T*ld), attRandom(r, B*T*C)
			d := kernels.Dropout{P: c.p, Key: kernels.SiteKey(8, uint64(T)), Heads: c.heads, Head0: c.head0}
			const off = 777

			be := cpu.New()
			out, att := make([]float32, B*T*C), make([]float32, B*NH*T*T)
			be.GQAForward(out, att, qkv, B, T, NH, NKV, hs, d, off)
			dqkv := make([]float32, B*T*ld)
			be.GQABackward(dqkv, dout, out, qkv, att, B, T, NH, NKV, hs, d, off)

			m, k := attMachine(t)
			gqkv, gdout := m.Float32s(qkv), m.Float32s(dout)
			gout, glse := m.Alloc(4*B*T*C), m.Alloc(4*B*NH*T)
			gdqkv := m.Float32s(attRandom(r, B*T*ld)) // overwritten, not added to
			must(t, k.GQAForward(0, gout, glse, gqkv, B, T, NH, NKV, hs, d.P, d.Key, d.Heads, d.Head0, off))
			must(t, k.GQABackward(0, gdqkv, gdout, gout, gqkv, glse, 0, B, T, NH, NKV, hs, d.P, d.Key, d.Heads, d.Head0, off))
			if err := m.Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			attCheckClose(t, "out", m.ReadFloat32s(gout, B*T*C), out)
			_, lse, _ := gqaRef64(qkv, dout, B, T, NH, NKV, hs, d, off)
			attCheckClose(t, "lse", m.ReadFloat32s(glse, B*NH*T), lse)
			got := m.ReadFloat32s(gdqkv, B*T*ld)
			for _, part := range []struct {
				name   string
				lo, hi int
			}{{"dq", 0, C}, {"dk", C, C + NKV*hs}, {"dv", C + NKV*hs, ld}} {
				var g, w []float32
				for n := 0; n < B*T; n++ {
					g = append(g, got[n*ld+part.lo:n*ld+part.hi]...)
					w = append(w, dqkv[n*ld+part.lo:n*ld+part.hi]...)
				}
				attCheckClose(t, part.name, g, w)
			}
		})
	}
}

// TestGQADecode runs the decode kernel on a grouped cache against
// kernels/cpu's GQADecode.
func TestGQADecode(t *testing.T) {
	for _, c := range []struct{ B, pos, maxT, NH, NKV, hs int }{
		{B: 2, pos: 0, maxT: 5, NH: 4, NKV: 1, hs: 32},
		{B: 1, pos: 37, maxT: 40, NH: 8, NKV: 2, hs: 64},
		{B: 3, pos: 9, maxT: 16, NH: 3, NKV: 3, hs: 20},
	} {
		t.Run(fmt.Sprintf("B%d_pos%d_NH%d_NKV%d_hs%d", c.B, c.pos, c.NH, c.NKV, c.hs), func(t *testing.T) {
			B, C, CKV := c.B, c.NH*c.hs, c.NKV*c.hs
			r := rand.New(rand.NewPCG(uint64(c.pos), uint64(C)))
			q, kc, vc := attRandom(r, B*C), attRandom(r, B*c.maxT*CKV), attRandom(r, B*c.maxT*CKV)
			want := make([]float32, B*C)
			cpu.New().GQADecode(want, q, kc, vc, B, c.pos, c.maxT, c.NH, c.NKV, c.hs)

			m, k := attMachine(t)
			out := m.Alloc(4 * B * C)
			must(t, k.GQADecode(0, out, m.Float32s(q), m.Float32s(kc), m.Float32s(vc), B, c.pos, c.maxT, c.NH, c.NKV, c.hs))
			if err := m.Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			attCheckClose(t, "out", m.ReadFloat32s(out, B*C), want)
		})
	}
}

// TestLlamaArgs: the wrappers refuse what the kernels cannot do, with an
// error saying what, and launch nothing.
func TestLlamaArgs(t *testing.T) {
	m, k := attMachine(t)
	p := m.Alloc(4096)
	for _, c := range []struct {
		name, want string
		call       func() error
	}{
		{"NH not a multiple of NKV", "multiple", func() error {
			return k.GQAForward(0, p, p, p, 1, 4, 6, 4, 32, 0, 0, 0, 0, 0)
		}},
		{"no key/value heads", "at least 1", func() error {
			return k.GQABackward(0, p, p, p, p, p, 0, 1, 4, 4, 0, 32, 0, 0, 0, 0, 0)
		}},
		{"GQA head size above 128", "head size", func() error {
			return k.GQABackward(0, p, p, p, p, p, 0, 1, 4, 4, 2, 256, 0, 0, 0, 0, 0)
		}},
		{"decode NH not a multiple of NKV", "multiple", func() error {
			return k.GQADecode(0, p, p, p, p, 1, 0, 8, 3, 2, 32)
		}},
		{"odd head size", "even head size", func() error {
			return k.RoPEForward(0, p, p, p, 1, 4, 12, 2, 5, 0)
		}},
		{"heads past the row", "heads·hd ≤ C", func() error {
			return k.RoPEBackward(0, p, p, p, 1, 4, 12, 4, 4, 0)
		}},
		{"negative position", "out of range", func() error {
			return k.RoPEForward(0, p, p, p, 1, 4, 12, 2, 4, -9)
		}},
		{"RMSNorm eps NaN", "eps", func() error {
			return k.RMSNormForward(0, p, p, p, p, 4, 8, float32(math.NaN()))
		}},
	} {
		err := c.call()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one saying %q", c.name, err, c.want)
		}
	}
	if n := m.Pending(); n != 0 {
		t.Errorf("%d launches recorded from refused calls", n)
	}
}
