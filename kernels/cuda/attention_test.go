package cuda_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/kernels/cuda"
	"github.com/gptui/gptui/kernels/cuda/emu"
)

// h100Shared is the dynamic shared memory an H100 (or H200) block may opt
// into: 227 KiB.
const h100Shared = 227 << 10

// attTolerance is the attention kernels' tolerance against kernels/cpu: L2
// error relative to the reference's L2 norm, and the largest absolute error
// relative to the reference's largest magnitude.
const attTolerance = 1e-5

// attMachine returns a Machine over the emulated kernels, with Kernels
// launching on it, allowing the shared memory an H100 allows.
func attMachine(t *testing.T) (*emu.Machine, *cuda.Kernels) {
	t.Helper()
	prog := emuProgram(t)
	m := prog.NewMachine()
	m.SharedLimit = h100Shared
	k, err := cuda.NewKernels(m, m.Lookup)
	if err != nil {
		t.Fatal(err)
	}
	return m, k
}

// attErr returns the L2 relative error of got against want and the largest
// absolute error relative to want's largest magnitude.
func attErr(got, want []float32) (l2, maxAbs float64) {
	var e, n, mx, ref float64
	for i, w := range want {
		d := float64(got[i]) - float64(w)
		if math.IsNaN(d) {
			return math.Inf(1), math.Inf(1)
		}
		e += d * d
		n += float64(w) * float64(w)
		mx = max(mx, math.Abs(d))
		ref = max(ref, math.Abs(float64(w)))
	}
	if n == 0 {
		return math.Sqrt(e), mx
	}
	return math.Sqrt(e / n), mx / ref
}

func attCheckClose(t *testing.T, name string, got, want []float32) {
	t.Helper()
	l2, mx := attErr(got, want)
	t.Logf("%s: L2 relative %.3g, max abs / max |ref| %.3g", name, l2, mx)
	if !(l2 <= attTolerance && mx <= attTolerance) {
		t.Errorf("%s: L2 relative error %.3g, max abs error %.3g of the largest value (tolerance %g)", name, l2, mx, attTolerance)
	}
}

func attRandom(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// attLSE is each row's log Σ exp of the scaled causal scores of qkv, in
// float64: what the forward kernel's lse must hold.
func attLSE(qkv []float32, B, T, C, NH int) []float32 {
	hs := C / NH
	scale := 1 / math.Sqrt(float64(hs))
	lse := make([]float32, B*NH*T)
	s := make([]float64, T)
	for b := 0; b < B; b++ {
		for h := 0; h < NH; h++ {
			for t := 0; t < T; t++ {
				q := qkv[(b*T+t)*3*C+h*hs:]
				mx := math.Inf(-1)
				for j := 0; j <= t; j++ {
					k := qkv[(b*T+j)*3*C+C+h*hs:]
					var d float64
					for i := 0; i < hs; i++ {
						d += float64(q[i]) * float64(k[i])
					}
					s[j] = d * scale
					mx = max(mx, s[j])
				}
				var sum float64
				for j := 0; j <= t; j++ {
					sum += math.Exp(s[j] - mx)
				}
				lse[(b*NH+h)*T+t] = float32(mx + math.Log(sum))
			}
		}
	}
	return lse
}

// TestAttention runs the forward and backward kernels under the emulator
// against kernels/cpu's attention on the same inputs: every head-size
// kernel (32, 64, 80, 128 and the generic one), T below, at and across the
// 64-row tile, dropout off and on, and tensor-parallel head placement.
func TestAttention(t *testing.T) {
	cases := []struct {
		B, T, C, NH  int
		p            float32
		heads, head0 int
	}{
		{B: 2, T: 17, C: 64, NH: 2},                              // hs 32, one partial tile
		{B: 2, T: 17, C: 64, NH: 2, p: 0.1},                      // the same with dropout
		{B: 1, T: 64, C: 128, NH: 2, p: 0.1, heads: 4, head0: 2}, // hs 64, one whole tile, ranks' heads 2…3 of 4
		{B: 2, T: 33, C: 96, NH: 3, p: 0.1, heads: 6, head0: 3},  // hs 32, 3 heads of 6
		{B: 1, T: 130, C: 128, NH: 1, p: 0.1},                    // hs 128, three tiles, the last of 2 rows
		{B: 1, T: 65, C: 160, NH: 2, p: 0.2, heads: 8, head0: 6}, // hs 80, two tiles
		{B: 2, T: 67, C: 60, NH: 3, p: 0.1},                      // hs 20: the generic kernel
		{B: 1, T: 1, C: 64, NH: 1},                               // one position
	}
	for _, c := range cases {
		name := fmt.Sprintf("B%d_T%d_C%d_NH%d_p%g_heads%d_%d", c.B, c.T, c.C, c.NH, c.p, c.heads, c.head0)
		t.Run(name, func(t *testing.T) {
			B, T, C, NH := c.B, c.T, c.C, c.NH
			r := rand.New(rand.NewPCG(uint64(B*T), uint64(C*NH)))
			qkv := attRandom(r, B*T*3*C)
			dout := attRandom(r, B*T*C)
			d := kernels.Dropout{P: c.p, Key: kernels.SiteKey(7, uint64(T)), Heads: c.heads, Head0: c.head0}
			off := uint64(12345)

			be := cpu.New()
			out := make([]float32, B*T*C)
			att := make([]float32, B*NH*T*T)
			be.AttentionForward(out, att, qkv, B, T, C, NH, d, off)
			dqkv := make([]float32, B*T*3*C)
			be.AttentionBackward(dqkv, dout, out, qkv, att, B, T, C, NH, d, off)

			m, k := attMachine(t)
			gqkv, gdout := m.Float32s(qkv), m.Float32s(dout)
			gout, glse := m.Alloc(4*B*T*C), m.Alloc(4*B*NH*T)
			garbage := make([]float32, B*T*3*C) // dqkv is overwritten, not added to
			for i := range garbage {
				garbage[i] = float32(i%7) - 3
			}
			gdqkv := m.Float32s(garbage)
			ctx := context.Background()
			if err := k.AttentionForward(0, gout, glse, gqkv, B, T, C, NH, d.P, d.Key, d.Heads, d.Head0, off); err != nil {
				t.Fatal(err)
			}
			// The backward pass reads the kernel's own out and lse.
			if err := k.AttentionBackward(0, gdqkv, gdout, gout, gqkv, glse, 0, B, T, C, NH, d.P, d.Key, d.Heads, d.Head0, off); err != nil {
				t.Fatal(err)
			}
			if err := m.Run(ctx); err != nil {
				t.Fatal(err)
			}
			attCheckClose(t, "out", m.ReadFloat32s(gout, B*T*C), out)
			attCheckClose(t, "lse", m.ReadFloat32s(glse, B*NH*T), attLSE(qkv, B, T, C, NH))
			got := m.ReadFloat32s(gdqkv, B*T*3*C)
			for i, part := range []string{"dq", "dk", "dv"} {
				var g, w []float32
				for n := 0; n < B*T; n++ {
					g = append(g, got[n*3*C+i*C:n*3*C+(i+1)*C]...)
					w = append(w, dqkv[n*3*C+i*C:n*3*C+(i+1)*C]...)
				}
				attCheckClose(t, part, g, w)
			}
		})
	}
}

// TestAttentionDropoutPlacement checks that the mask follows the head
// placement: rank 1's two heads of four (head0 2) must match the heads 2…3
// of a single process running all four, and differ from head0 0.
func TestAttentionDropoutPlacement(t *testing.T) {
	const B, T, hs = 1, 20, 32
	r := rand.New(rand.NewPCG(1, 1))
	full := attRandom(r, B*T*3*4*hs) // 4 heads: C = 128
	// The rank's qkv: heads 2…3 of each of q, k and v.
	local := make([]float32, B*T*3*2*hs)
	for n := 0; n < B*T; n++ {
		for part := 0; part < 3; part++ {
			copy(local[n*6*hs+part*2*hs:n*6*hs+(part+1)*2*hs], full[n*12*hs+part*4*hs+2*hs:n*12*hs+(part+1)*4*hs])
		}
	}
	const p, key, off = 0.3, 99, 1000
	m, k := attMachine(t)
	gfull, glocal := m.Float32s(full), m.Float32s(local)
	outFull, outRank, outWrong := m.Alloc(4*B*T*4*hs), m.Alloc(4*B*T*2*hs), m.Alloc(4*B*T*2*hs)
	lseFull, lse := m.Alloc(4*B*4*T), m.Alloc(4*B*2*T)
	for _, err := range []error{
		k.AttentionForward(0, outFull, lseFull, gfull, B, T, 4*hs, 4, p, key, 0, 0, off),
		k.AttentionForward(0, outRank, lse, glocal, B, T, 2*hs, 2, p, key, 4, 2, off),
		k.AttentionForward(0, outWrong, lse, glocal, B, T, 2*hs, 2, p, key, 4, 0, off),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	of, or, ow := m.ReadFloat32s(outFull, B*T*4*hs), m.ReadFloat32s(outRank, B*T*2*hs), m.ReadFloat32s(outWrong, B*T*2*hs)
	var want []float32
	for n := 0; n < B*T; n++ {
		want = append(want, of[n*4*hs+2*hs:(n+1)*4*hs]...)
	}
	for i := range want {
		if or[i] != want[i] {
			t.Fatalf("rank's head output %d = %v, the single process's %v", i, or[i], want[i])
		}
	}
	if l2, _ := attErr(ow, want); l2 < 1e-3 {
		t.Errorf("head0 0 draws the same mask as head0 2 (L2 difference %.3g)", l2)
	}
}

// TestAttentionDecode runs the decode kernel against kernels/cpu's
// AttentionDecode: head sizes 32, 80, 20 and 256, from the first position
// to a full cache.
func TestAttentionDecode(t *testing.T) {
	cases := []struct{ B, pos, maxT, C, NH int }{
		{B: 2, pos: 0, maxT: 5, C: 64, NH: 2},
		{B: 2, pos: 37, maxT: 40, C: 96, NH: 3},
		{B: 1, pos: 99, maxT: 100, C: 160, NH: 2},
		{B: 3, pos: 9, maxT: 16, C: 20, NH: 1},
		{B: 1, pos: 12, maxT: 13, C: 512, NH: 2},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("B%d_pos%d_maxT%d_C%d_NH%d", c.B, c.pos, c.maxT, c.C, c.NH), func(t *testing.T) {
			B, C := c.B, c.C
			r := rand.New(rand.NewPCG(uint64(c.pos), uint64(C)))
			q := attRandom(r, B*C)
			kc := attRandom(r, B*c.maxT*C)
			vc := attRandom(r, B*c.maxT*C)
			want := make([]float32, B*C)
			cpu.New().AttentionDecode(want, q, kc, vc, B, c.pos, c.maxT, C, c.NH)

			m, k := attMachine(t)
			out := m.Alloc(4 * B * C)
			if err := k.AttentionDecode(0, out, m.Float32s(q), m.Float32s(kc), m.Float32s(vc), B, c.pos, c.maxT, C, c.NH); err != nil {
				t.Fatal(err)
			}
			if err := m.Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			attCheckClose(t, "out", m.ReadFloat32s(out, B*C), want)
		})
	}
}

// TestAttentionArgs checks that the wrappers refuse what the kernels cannot
// do, with an error saying what, and launch nothing.
func TestAttentionArgs(t *testing.T) {
	m, k := attMachine(t)
	p := m.Alloc(4096)
	cases := []struct {
		name, want string
		call       func() error
	}{
		{"C not a multiple of NH", "multiple", func() error {
			return k.AttentionForward(0, p, p, p, 1, 4, 10, 3, 0, 0, 0, 0, 0)
		}},
		{"head size above 128", "head size", func() error {
			return k.AttentionBackward(0, p, p, p, p, p, 0, 1, 4, 256, 1, 0, 0, 0, 0, 0)
		}},
		{"dropout 1", "dropout", func() error {
			return k.AttentionForward(0, p, p, p, 1, 4, 64, 2, 1, 0, 0, 0, 0)
		}},
		{"heads out of range", "out of range", func() error {
			return k.AttentionForward(0, p, p, p, 1, 4, 64, 2, 0.1, 0, 3, 2, 0)
		}},
		{"empty batch", "at least 1", func() error {
			return k.AttentionForward(0, p, p, p, 0, 4, 64, 2, 0, 0, 0, 0, 0)
		}},
		{"decode past the cache", "position", func() error {
			return k.AttentionDecode(0, p, p, p, p, 1, 8, 8, 64, 2)
		}},
		{"decode head size above 256", "head size", func() error {
			return k.AttentionDecode(0, p, p, p, p, 1, 0, 8, 512, 1)
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

// TestAttentionShared checks the shared-memory sizes the backend must allow
// each kernel: every one fits an H100's 227 KiB, the ones above 48 KiB are
// listed, and a launch is refused under the default limit, as a GPU would.
func TestAttentionShared(t *testing.T) {
	need := cuda.AttentionSharedNeeds()
	for _, hs := range []int{20, 32, 64, 80, 127, 128} {
		f, b := cuda.AttentionForwardShared(hs), cuda.AttentionBackwardShared(hs)
		t.Logf("hs %d: forward %d bytes, backward %d bytes", hs, f, b)
		if f > h100Shared || b > h100Shared {
			t.Errorf("hs %d: forward %d, backward %d bytes of shared memory; an H100 allows %d", hs, f, b, h100Shared)
		}
	}
	for name, n := range need {
		if n <= 48<<10 || n > h100Shared {
			t.Errorf("%s: %d bytes listed", name, n)
		}
	}
	for _, name := range []string{"attention_forward_hs64", "attention_backward_hs64", "attention_backward_hs32", "attention_forward_hs128", "attention_backward_any"} {
		if need[name] == 0 {
			t.Errorf("%s needs more than 48 KiB but is not listed", name)
		}
	}
	if n := need["attention_backward_any"]; n < cuda.AttentionBackwardShared(127) {
		t.Errorf("generic backward listed at %d bytes, below hs 127's %d", n, cuda.AttentionBackwardShared(127))
	}

	m := emuProgram(t).NewMachine() // default 48 KiB limit
	k, err := cuda.NewKernels(m, m.Lookup)
	if err != nil {
		t.Fatal(err)
	}
	p := m.Alloc(1 << 20)
	if err := k.AttentionForward(0, p, p, p, 1, 64, 128, 2, 0, 0, 0, 0, 0); err == nil {
		t.Error("hs 64 forward launched under the 48 KiB default limit")
	}
}
