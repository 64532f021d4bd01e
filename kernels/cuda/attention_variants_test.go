package cuda_test

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cuda"
	"github.com/gptui/gptui/kernels/cuda/emu"
)

// sharedLimits are the opt-in shared memory per block of the GPUs the
// kernels are sized for: V100 (96 KiB), L40S, L4, A10 and RTX 4090 (99),
// A100 (163), H100 and H200 (227).
var sharedLimits = []struct {
	name  string
	attrs cuda.DeviceAttrs
}{
	{"96KiB_V100", attrsV100},
	{"99KiB_L40S", attrsL40S},
	{"163KiB_A100", attrsA100},
	{"227KiB_H100", attrsH100},
}

// variantMachine returns a Machine allowing the dynamic shared memory of
// a device with attributes a, and Kernels launching the variants chosen
// for it.
func variantMachine(t *testing.T, a cuda.DeviceAttrs) (*emu.Machine, *cuda.Kernels, *cuda.Variants) {
	t.Helper()
	v, err := cuda.SelectVariants(a)
	if err != nil {
		t.Fatal(err)
	}
	m := emuProgram(t).NewMachine()
	m.SharedLimit = v.SharedLimit()
	k, err := cuda.NewKernelsFor(m, m.Lookup, v)
	if err != nil {
		t.Fatal(err)
	}
	return m, k, v
}

// gqaRef64 is causal grouped-query attention with dropout in float64: the
// forward pass's out and lse and the backward pass's dqkv from dout, with
// the mask every backend draws (kernels.Dropout).
func gqaRef64(qkv, dout []float32, B, T, NH, NKV, hs int, d kernels.Dropout, off uint64) (out, lse, dqkv []float32) {
	ld, C := (NH+2*NKV)*hs, NH*hs
	scale := 1 / math.Sqrt(float64(hs))
	ds := float64(d.Scale())
	out, lse = make([]float32, B*T*C), make([]float32, B*NH*T)
	dq := make([]float64, B*T*ld)
	p, pd := make([]float64, T), make([]float64, T)
	o := make([]float64, hs)
	for b := 0; b < B; b++ {
		for h := 0; h < NH; h++ {
			kofs := (NH + h/(NH/NKV)) * hs
			vofs := kofs + NKV*hs
			for t := 0; t < T; t++ {
				q := qkv[(b*T+t)*ld+h*hs:]
				mx := math.Inf(-1)
				for j := 0; j <= t; j++ {
					k := qkv[(b*T+j)*ld+kofs:]
					var s float64
					for i := 0; i < hs; i++ {
						s += float64(q[i]) * float64(k[i])
					}
					p[j] = s * scale
					mx = max(mx, p[j])
				}
				var sum float64
				for j := 0; j <= t; j++ {
					p[j] = math.Exp(p[j] - mx)
					sum += p[j]
				}
				lse[(b*NH+h)*T+t] = float32(mx + math.Log(sum))
				first := d.AttIndex(off, b, NH, h*T+t, T)
				clear(o)
				for j := 0; j <= t; j++ {
					p[j] /= sum
					pd[j] = p[j]
					if d.On() {
						pd[j] = 0
						if d.Keep(first + uint64(j)) {
							pd[j] = p[j] * ds
						}
					}
					v := qkv[(b*T+j)*ld+vofs:]
					for i := range o {
						o[i] += pd[j] * float64(v[i])
					}
				}
				for i, x := range o {
					out[(b*T+t)*C+h*hs+i] = float32(x)
				}
				// Backward: D = dout·out = Σ_j p_j dp_j.
				g := dout[(b*T+t)*C+h*hs:]
				var D float64
				for i, x := range o {
					D += float64(g[i]) * x
				}
				for j := 0; j <= t; j++ {
					v := qkv[(b*T+j)*ld+vofs:]
					k := qkv[(b*T+j)*ld+kofs:]
					var dpd float64
					for i := 0; i < hs; i++ {
						dpd += float64(g[i]) * float64(v[i])
					}
					dp := dpd
					if d.On() {
						dp = 0
						if d.Keep(first + uint64(j)) {
							dp = dpd * ds
						}
					}
					dsj := p[j] * (dp - D) * scale
					dqr, dkr, dvr := dq[(b*T+t)*ld+h*hs:], dq[(b*T+j)*ld+kofs:], dq[(b*T+j)*ld+vofs:]
					for i := 0; i < hs; i++ {
						dqr[i] += dsj * float64(k[i])
						dkr[i] += dsj * float64(q[i])
						dvr[i] += pd[j] * float64(g[i])
					}
				}
			}
		}
	}
	dqkv = make([]float32, len(dq))
	for i, x := range dq {
		dqkv[i] = float32(x)
	}
	return out, lse, dqkv
}

// TestAttentionVariants runs, under each device's shared-memory limit
// (the emulator refusing a launch above it, as the GPU would), the
// forward and backward kernels of every head size (32, 64, 80, 128 and the
// generic kernel at hs 20 and 127) on the variants chosen for that device,
// against gqaRef64 with the attention tolerance: T across the 32- and
// 64-row tiles, grouped heads with dropout and tensor-parallel placement,
// and multi-head attention without dropout. Across the limits every
// variant of KernelNames runs.
func TestAttentionVariants(t *testing.T) {
	type tc struct {
		B, T, NH, NKV, hs int
		p                 float32
		heads, head0      int
	}
	var cases []tc
	for _, hs := range []int{32, 64, 80, 128, 20, 127} {
		cases = append(cases,
			tc{B: 2, T: 97, NH: 4, NKV: 2, hs: hs, p: 0.1, heads: 8, head0: 4},
			tc{B: 1, T: 40, NH: 2, NKV: 2, hs: hs})
	}
	ran := map[string]bool{}
	for _, lim := range sharedLimits {
		t.Run(lim.name, func(t *testing.T) {
			m, k, v := variantMachine(t, lim.attrs)
			for _, kv := range v.All() {
				ran[kv.Function] = true
			}
			var checks []func()
			for _, c := range cases {
				name := fmt.Sprintf("B%d_T%d_NH%d_NKV%d_hs%d_p%g", c.B, c.T, c.NH, c.NKV, c.hs, c.p)
				B, T, NH, NKV, hs := c.B, c.T, c.NH, c.NKV, c.hs
				ld, C := (NH+2*NKV)*hs, NH*hs
				r := rand.New(rand.NewPCG(uint64(B*T), uint64(NH*NKV*hs)))
				qkv, dout := attRandom(r, B*T*ld), attRandom(r, B*T*C)
				d := kernels.Dropout{P: c.p, Key: kernels.SiteKey(9, uint64(T)), Heads: c.heads, Head0: c.head0}
				const off = 4242
				gqkv, gdout := m.Float32s(qkv), m.Float32s(dout)
				gout, glse := m.Alloc(4*B*T*C), m.Alloc(4*B*NH*T)
				gdqkv := m.Float32s(attRandom(r, B*T*ld)) // overwritten, not added to
				must(t, k.GQAForward(0, gout, glse, gqkv, B, T, NH, NKV, hs, d.P, d.Key, d.Heads, d.Head0, off))
				must(t, k.GQABackward(0, gdqkv, gdout, gout, gqkv, glse, 0, B, T, NH, NKV, hs, d.P, d.Key, d.Heads, d.Head0, off))
				checks = append(checks, func() {
					out, lse, dqkv := gqaRef64(qkv, dout, B, T, NH, NKV, hs, d, off)
					attCheckClose(t, name+" out", m.ReadFloat32s(gout, B*T*C), out)
					attCheckClose(t, name+" lse", m.ReadFloat32s(glse, B*NH*T), lse)
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
						attCheckClose(t, name+" "+part.name, g, w)
					}
				})
			}
			if err := m.Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			for _, c := range checks {
				c()
			}
		})
	}
	for _, n := range cuda.KernelNames() {
		if (strings.HasPrefix(n, "attention_forward_") || strings.HasPrefix(n, "attention_backward_")) && !ran[n] {
			t.Errorf("%s ran under none of the limits", n)
		}
	}
}

// TestAttentionVariantsAgree checks that a smaller tile computes what the
// 64×64 one does: the forward outputs of 64×32 against 64×64 and the
// backward outputs of 32×64 and 32×32 against 64×64, on the same inputs,
// agree to the attention tolerance (the sums over key tiles are split
// differently, nothing else).
func TestAttentionVariantsAgree(t *testing.T) {
	const B, T, NH, NKV, hs = 1, 150, 2, 1, 128
	ld, C := (NH+2*NKV)*hs, NH*hs
	r := rand.New(rand.NewPCG(5, 5))
	qkv, dout := attRandom(r, B*T*ld), attRandom(r, B*T*C)
	results := map[string][]float32{}
	for _, lim := range []cuda.DeviceAttrs{attrsH100, attrsA100, attrsV100} {
		m, k, v := variantMachine(t, lim)
		gqkv := m.Float32s(qkv)
		gout, glse, gdqkv := m.Alloc(4*B*T*C), m.Alloc(4*B*NH*T), m.Alloc(4*B*T*ld)
		must(t, k.GQAForward(0, gout, glse, gqkv, B, T, NH, NKV, hs, 0.2, 11, 0, 0, 0))
		must(t, k.GQABackward(0, gdqkv, m.Float32s(dout), gout, gqkv, glse, 0, B, T, NH, NKV, hs, 0.2, 11, 0, 0, 0))
		run(t, m)
		f, _ := v.Kernel("attention_forward_hs128")
		bw, _ := v.Kernel("attention_backward_hs128")
		results[f.Function+" out"] = m.ReadFloat32s(gout, B*T*C)
		results[bw.Function+" dqkv"] = m.ReadFloat32s(gdqkv, B*T*ld)
	}
	keys := slices.Sorted(maps.Keys(results))
	if len(keys) != 5 { // forward: 64×64, 64×32; backward: 64×64, 32×64, 32×32
		t.Fatalf("ran %v, want two forward and three backward variants", keys)
	}
	for _, k := range keys {
		base := "attention_forward_hs128 out"
		if strings.HasSuffix(k, "dqkv") {
			base = "attention_backward_hs128 dqkv"
		}
		if k != base {
			attCheckClose(t, k+" vs "+base, results[k], results[base])
		}
	}
}

// TestNormVariants runs layernorm_backward and rmsnorm_backward at the
// most channels each device's shared memory takes (NormMaxChannels)
// against kernels/cpu, and checks that one channel more is refused, as the
// GPU would refuse it.
func TestNormVariants(t *testing.T) {
	const N = 3
	for _, lim := range sharedLimits {
		t.Run(lim.name, func(t *testing.T) {
			m, k, v := variantMachine(t, lim.attrs)
			lnC, rmsC := v.NormMaxChannels()
			if cuda.LayerNormBackwardShared(lnC) > v.SharedLimit() || cuda.LayerNormBackwardShared(lnC+1) <= v.SharedLimit() ||
				cuda.RMSNormBackwardShared(rmsC) > v.SharedLimit() || cuda.RMSNormBackwardShared(rmsC+1) <= v.SharedLimit() {
				t.Fatalf("NormMaxChannels %d, %d are not the most that fit %d bytes", lnC, rmsC, v.SharedLimit())
			}
			r := rand.New(rand.NewPCG(6, uint64(lnC)))

			// LayerNorm at C = lnC.
			C := lnC
			inp, w, b := randn(r, N*C, 2), randn(r, C, 1), randn(r, C, 1)
			dout := randn(r, N*C, 1)
			out, mean, rstd := make([]float32, N*C), make([]float32, N), make([]float32, N)
			cpuBackend.LayerNormForward(out, mean, rstd, inp, w, b, N, C)
			dinp0, dw0, db0 := randn(r, N*C, 1), randn(r, C, 1), randn(r, C, 1)
			dinp, dw, db := slices.Clone(dinp0), slices.Clone(dw0), slices.Clone(db0)
			cpuBackend.LayerNormBackward(dinp, dw, db, dout, inp, w, mean, rstd, N, C)
			gdinp, gdw, gdb := m.Float32s(dinp0), m.Float32s(dw0), m.Float32s(db0)
			must(t, k.LayerNormBackward(0, gdinp, gdw, gdb, m.Float32s(dout), m.Float32s(inp), m.Float32s(w), m.Float32s(mean), m.Float32s(rstd), N, C))

			// RMSNorm at C = rmsC.
			RC := rmsC
			rin, rw, rdout := randn(r, N*RC, 2), randn(r, RC, 1), randn(r, N*RC, 1)
			rout, rrstd := make([]float32, N*RC), make([]float32, N)
			cpuBackend.RMSNormForward(rout, rrstd, rin, rw, N, RC, 1e-5)
			rdinp0, rdw0 := randn(r, N*RC, 1), randn(r, RC, 1)
			rdinp, rdw := slices.Clone(rdinp0), slices.Clone(rdw0)
			cpuBackend.RMSNormBackward(rdinp, rdw, rdout, rin, rw, rrstd, N, RC)
			grdinp, grdw := m.Float32s(rdinp0), m.Float32s(rdw0)
			must(t, k.RMSNormBackward(0, grdinp, grdw, m.Float32s(rdout), m.Float32s(rin), m.Float32s(rw), m.Float32s(rrstd), N, RC))
			run(t, m)
			checkClose(t, fmt.Sprintf("layernorm C=%d dinp", C), m.ReadFloat32s(gdinp, N*C), dinp, 1e-5)
			checkClose(t, fmt.Sprintf("layernorm C=%d dw", C), m.ReadFloat32s(gdw, C), dw, 1e-5)
			checkClose(t, fmt.Sprintf("layernorm C=%d dbias", C), m.ReadFloat32s(gdb, C), db, 1e-5)
			checkClose(t, fmt.Sprintf("rmsnorm C=%d dinp", RC), m.ReadFloat32s(grdinp, N*RC), rdinp, 1e-5)
			checkClose(t, fmt.Sprintf("rmsnorm C=%d dw", RC), m.ReadFloat32s(grdw, RC), rdw, 1e-5)

			// One channel more does not fit.
			big := m.Alloc(4 * N * (rmsC + 1))
			if err := k.LayerNormBackward(0, big, big, big, big, big, big, big, big, N, lnC+1); err == nil {
				t.Errorf("layernorm_backward of C=%d launched under %d bytes", lnC+1, v.SharedLimit())
			}
			if err := k.RMSNormBackward(0, big, big, big, big, big, big, N, rmsC+1); err == nil {
				t.Errorf("rmsnorm_backward of C=%d launched under %d bytes", rmsC+1, v.SharedLimit())
			}
		})
	}
}
