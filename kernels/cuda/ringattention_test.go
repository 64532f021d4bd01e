package cuda_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cuda"
)

// The ring-attention kernels under the emulator against causal grouped-
// query attention of the whole sequence in float64: every rank's rows are
// the whole sequence's, permuted into its sequence-major (B,2c) layout,
// and the ring is simulated over all ranks on one Machine (each step's
// launches in the order the engine queues them; a Machine runs its
// launches one after another).

// ringRef is causal GQA over qkv (B,T,(NH+2·NKV)·hd) in float64: out
// (B,T,NH·hd), lse (B,T,NH) and, from dout (B,T,NH·hd), dqkv.
func ringRef(qkv, dout []float32, B, T, NH, NKV, hd int) (out, lse, dqkv []float64) {
	ld, C, G := (NH+2*NKV)*hd, NH*hd, NH/NKV
	scale := 1 / math.Sqrt(float64(hd))
	out, lse, dqkv = make([]float64, B*T*C), make([]float64, B*T*NH), make([]float64, B*T*ld)
	p, dp := make([]float64, T), make([]float64, T)
	at := func(b, t, ofs, d int) float64 { return float64(qkv[(b*T+t)*ld+ofs+d]) }
	for b := 0; b < B; b++ {
		for h := 0; h < NH; h++ {
			qo, ko, vo := h*hd, NH*hd+(h/G)*hd, (NH+NKV)*hd+(h/G)*hd
			for t := 0; t < T; t++ {
				mx := math.Inf(-1)
				for j := 0; j <= t; j++ {
					var s float64
					for d := 0; d < hd; d++ {
						s += at(b, t, qo, d) * at(b, j, ko, d)
					}
					p[j] = s * scale
					mx = max(mx, p[j])
				}
				var sum float64
				for j := 0; j <= t; j++ {
					p[j] = math.Exp(p[j] - mx)
					sum += p[j]
				}
				lse[(b*T+t)*NH+h] = mx + math.Log(sum)
				o := out[(b*T+t)*C+h*hd:][:hd]
				g := dout[(b*T+t)*C+h*hd:][:hd]
				var D float64
				for j := 0; j <= t; j++ {
					p[j] /= sum
					var x float64
					for d := 0; d < hd; d++ {
						o[d] += p[j] * at(b, j, vo, d)
						x += float64(g[d]) * at(b, j, vo, d)
					}
					dp[j] = x
					D += p[j] * x
				}
				for j := 0; j <= t; j++ {
					ds := p[j] * (dp[j] - D) * scale
					for d := 0; d < hd; d++ {
						dqkv[(b*T+t)*ld+qo+d] += ds * at(b, j, ko, d)
						dqkv[(b*T+j)*ld+ko+d] += ds * at(b, t, qo, d)
						dqkv[(b*T+j)*ld+vo+d] += p[j] * float64(g[d])
					}
				}
			}
		}
	}
	return out, lse, dqkv
}

// ringRow is the whole sequence's row (b·T + position) of row i =
// b·2c + half·c + t of rank r (B sequences).
func ringRow(i, r, B, c, cp int) int {
	b, half, t := i/(2*c), (i/c)%2, i%c
	chunk := r
	if half == 1 {
		chunk = 2*cp - 1 - r
	}
	return b*2*cp*c + chunk*c + t
}

// ringGather returns rank r's rows of x (B·T rows of w).
func ringGather[E float32 | float64](x []E, w, r, B, c, cp int) []float32 {
	rows := 2 * B * c
	y := make([]float32, rows*w)
	for i := 0; i < rows; i++ {
		src := ringRow(i, r, B, c, cp) * w
		for j := 0; j < w; j++ {
			y[i*w+j] = float32(x[src+j])
		}
	}
	return y
}

// ringMaxAbs is the largest |got − want|.
func ringMaxAbs(got, want []float32) float64 {
	var e float64
	for i := range want {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if math.IsNaN(d) {
			return math.Inf(1)
		}
		e = max(e, d)
	}
	return e
}

// TestRingAttention runs a whole ring, forward and backward, for cp 1, 2
// and 4, and checks every rank's out, lse and dqkv against the whole
// sequence's attention. The forward pass also runs with the blocks in
// another order, whose first block is not the diagonal one for cp > 1: its
// rows of chunk qr meet no key there (m stays −∞), which the later blocks
// must fold from.
func TestRingAttention(t *testing.T) {
	type shape struct{ NH, NKV, hd int }
	type tcase struct {
		cp, T int
		shape
		bf16 bool // qkv and dout bfloat16 activations (cuda.BF16Ptr)
	}
	var cases []tcase
	for _, cp := range []int{1, 2, 4} {
		for _, s := range []shape{{4, 4, 8}, {4, 2, 16}} {
			cases = append(cases, tcase{cp, 8 * 3, s, false}) // c = 12, 6, 3
		}
	}
	// Chunks of more than 32 rows (the kernels walk 32 at a time) and a
	// head of two columns a lane.
	cases = append(cases, tcase{1, 80, shape{4, 2, 16}, false}, tcase{2, 80, shape{2, 1, 40}, false})
	// bfloat16 qkv and dout: the kernels read them widened, as float32 of
	// the same (rounded) values.
	cases = append(cases, tcase{2, 24, shape{4, 2, 16}, true}, tcase{4, 80, shape{2, 1, 40}, true})

	var worst [4]float64 // out, lse, dqkv, rotated out
	for _, tc := range cases {
		cp, T, NH, NKV, hd := tc.cp, tc.T, tc.NH, tc.NKV, tc.hd
		t.Run(fmt.Sprintf("cp%d_T%d_NH%d_NKV%d_hd%d_bf16-%v", cp, T, NH, NKV, hd, tc.bf16), func(t *testing.T) {
			const B = 2
			c := T / (2 * cp)
			rows := 2 * B * c
			ld, ldkv, C := (NH+2*NKV)*hd, 2*NKV*hd, NH*hd
			r := rand.New(rand.NewPCG(uint64(cp), uint64(T*NH*NKV*hd)))
			qkv, dout := attRandom(r, B*T*ld), attRandom(r, B*T*C)
			if tc.bf16 {
				kernels.RoundBF16(qkv)
				kernels.RoundBF16(dout)
			}
			rout, rlse, rdqkv := ringRef(qkv, dout, B, T, NH, NKV, hd)

			m, k := machine(t)
			act := func(x []float32) cuda.Buf {
				if tc.bf16 {
					return cuda.BF16Ptr(m.Uint16s(toBF16(x)))
				}
				return m.Float32s(x)
			}
			var gqkv, gdout []cuda.Buf
			var gkv, gout, gstats, glse, gdelta, gdqkv, gdkv, gout2, gstats2, glse2 []cuda.Ptr
			for rk := 0; rk < cp; rk++ {
				gqkv = append(gqkv, act(ringGather(qkv, ld, rk, B, c, cp)))
				gdout = append(gdout, act(ringGather(dout, C, rk, B, c, cp)))
				gkv = append(gkv, m.Float32s(attRandom(r, rows*ldkv))) // overwritten by RingKV
				// out and stats hold garbage: first must not read them.
				gout = append(gout, m.Float32s(attRandom(r, rows*C)))
				gstats = append(gstats, m.Float32s(attRandom(r, rows*NH*2)))
				gout2 = append(gout2, m.Float32s(attRandom(r, rows*C)))
				gstats2 = append(gstats2, m.Float32s(attRandom(r, rows*NH*2)))
				glse, glse2 = append(glse, m.Alloc(4*rows*NH)), append(glse2, m.Alloc(4*rows*NH))
				gdelta = append(gdelta, m.Alloc(4*rows*NH))
				// dqkv: the query part zero (the engine's Zero), the key
				// and value parts garbage that RingKVGrad overwrites.
				d := attRandom(r, rows*ld)
				for i := 0; i < rows; i++ {
					clear(d[i*ld : i*ld+C])
				}
				gdqkv = append(gdqkv, m.Float32s(d))
				gdkv = append(gdkv, m.Alloc(4*rows*ldkv)) // block rk's gradient, zero at home
			}
			for rk := 0; rk < cp; rk++ {
				must(t, k.RingKV(0, gkv[rk], gqkv[rk], rows, NH, NKV, hd))
			}
			// Forward: step s folds block (qr − s) mod cp; the rotated
			// run folds (qr + 1 + s) mod cp.
			for s := 0; s < cp; s++ {
				for qr := 0; qr < cp; qr++ {
					must(t, k.RingAttentionForward(0, gout[qr], gstats[qr], gqkv[qr], gkv[(qr-s+cp)%cp], B, c, NH, NKV, hd, cp, qr, (qr-s+cp)%cp, s == 0))
					kr := (qr + 1 + s) % cp
					must(t, k.RingAttentionForward(0, gout2[qr], gstats2[qr], gqkv[qr], gkv[kr], B, c, NH, NKV, hd, cp, qr, kr, s == 0))
				}
			}
			for qr := 0; qr < cp; qr++ {
				must(t, k.RingAttentionFinish(0, gout[qr], glse[qr], gstats[qr], rows, NH, hd))
				must(t, k.RingAttentionFinish(0, gout2[qr], glse2[qr], gstats2[qr], rows, NH, hd))
				must(t, k.RingAttentionDelta(0, gdelta[qr], gdout[qr], gout[qr], rows, NH, hd))
			}
			// Backward: at step s rank qr holds block (qr − s) mod cp and
			// its travelling dkv; after cp steps each dkv is home.
			for s := 0; s < cp; s++ {
				for qr := 0; qr < cp; qr++ {
					kr := (qr - s + cp) % cp
					must(t, k.RingAttentionBackward(0, gdqkv[qr], gdkv[kr], gdout[qr], gqkv[qr], gkv[kr], glse[qr], gdelta[qr], B, c, NH, NKV, hd, cp, qr, kr))
				}
			}
			for rk := 0; rk < cp; rk++ {
				must(t, k.RingKVGrad(0, gdqkv[rk], gdkv[rk], rows, NH, NKV, hd))
			}
			run(t, m)

			var e [4]float64
			for rk := 0; rk < cp; rk++ {
				wout, wlse, wdqkv := ringGather(rout, C, rk, B, c, cp), ringGather(rlse, NH, rk, B, c, cp), ringGather(rdqkv, ld, rk, B, c, cp)
				name := fmt.Sprintf("rank %d", rk)
				out, lse, dqkv := m.ReadFloat32s(gout[rk], rows*C), m.ReadFloat32s(glse[rk], rows*NH), m.ReadFloat32s(gdqkv[rk], rows*ld)
				out2, lse2 := m.ReadFloat32s(gout2[rk], rows*C), m.ReadFloat32s(glse2[rk], rows*NH)
				attCheckClose(t, name+" out", out, wout)
				attCheckClose(t, name+" lse", lse, wlse)
				attCheckClose(t, name+" dqkv", dqkv, wdqkv)
				attCheckClose(t, name+" out (rotated)", out2, wout)
				attCheckClose(t, name+" lse (rotated)", lse2, wlse)
				e[0] = max(e[0], ringMaxAbs(out, wout))
				e[1] = max(e[1], ringMaxAbs(lse, wlse), ringMaxAbs(lse2, wlse))
				e[2] = max(e[2], ringMaxAbs(dqkv, wdqkv))
				e[3] = max(e[3], ringMaxAbs(out2, wout))
			}
			t.Logf("max abs diff: out %.3g, lse %.3g, dqkv %.3g, out (rotated) %.3g", e[0], e[1], e[2], e[3])
			for i := range e {
				worst[i] = max(worst[i], e[i])
			}
		})
	}
	t.Logf("all cases, max abs diff: out %.3g, lse %.3g, dqkv %.3g, out (rotated) %.3g", worst[0], worst[1], worst[2], worst[3])
}

// TestRingAttentionNames checks that every ring kernel is in the source
// (they are looked up at first launch, not by NewKernels).
func TestRingAttentionNames(t *testing.T) {
	names := emuProgram(t).Names()
	for _, n := range cuda.RingKernelNames() {
		if !slices.Contains(names, n) {
			t.Errorf("ring kernel %s is not in Source", n)
		}
	}
}

// TestRingAttentionArgs checks that the wrappers refuse what the kernels
// cannot do and launch nothing.
func TestRingAttentionArgs(t *testing.T) {
	m, k := machine(t)
	p := m.Alloc(4096)
	cases := []struct {
		name, want string
		call       func() error
	}{
		{"NH not a multiple of NKV", "multiple", func() error {
			return k.RingAttentionForward(0, p, p, p, p, 1, 2, 3, 2, 8, 1, 0, 0, true)
		}},
		{"head size above 256", "head size", func() error {
			return k.RingAttentionBackward(0, p, p, p, p, p, p, p, 1, 2, 1, 1, 512, 1, 0, 0)
		}},
		{"rank out of range", "ranks", func() error {
			return k.RingAttentionForward(0, p, p, p, p, 1, 2, 2, 2, 8, 2, 0, 2, false)
		}},
		{"no heads", "at least 1", func() error {
			return k.RingKV(0, p, p, 4, 0, 1, 8)
		}},
	}
	for _, c := range cases {
		err := c.call()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one saying %q", c.name, err, c.want)
		}
	}
	if n := m.Pending(); n != 0 {
		t.Errorf("%d launches recorded from refused calls", n)
	}
}
