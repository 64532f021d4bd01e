package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/ref"
)

// The Llama family's kernels against kernels/ref, their gradients against
// float64 numerical gradients, as layers_test.go does for GPT-2's.

func TestRMSNormGrad(t *testing.T) {
	for _, c := range []struct {
		N, C int
		eps  float32
	}{
		{70, 9, 1e-5}, // more rows than one reduction chunk
		{5, 64, 1e-6},
		{3, 4, 0.5}, // an eps that matters
	} {
		t.Run(fmt.Sprintf("N%d_C%d", c.N, c.C), func(t *testing.T) {
			be := New()
			r := rand.New(rand.NewPCG(31, uint64(c.N*c.C)))
			N, C := c.N, c.C
			inp, w := randn(r, N*C, 2), randn(r, C, 1)
			G := ref.To64(randn(r, N*C, 1))
			out, rstd := make([]float32, N*C), make([]float32, N)
			be.RMSNormForward(out, rstd, inp, w, N, C, c.eps)
			x64, w64 := ref.To64(inp), ref.To64(w)
			eps := float64(c.eps)
			checkErr(t, "forward", out, ref.RMSNorm(x64, w64, N, C, eps), fwdTol)
			// Backward accumulates: start from random values and subtract them.
			dinp0, dw0 := randn(r, N*C, 1), randn(r, C, 1)
			dinp, dw := slices.Clone(dinp0), slices.Clone(dw0)
			be.RMSNormBackward(dinp, dw, toF32(G), inp, w, rstd, N, C)
			for i := range dinp {
				dinp[i] -= dinp0[i]
			}
			for i := range dw {
				dw[i] -= dw0[i]
			}
			phi := func() float64 { return ref.Dot(G, ref.RMSNorm(x64, w64, N, C, eps)) }
			checkErr(t, "dinp", dinp, ref.NumGrad(phi, x64, 1e-5), gradTol)
			checkErr(t, "dw", dw, ref.NumGrad(phi, w64, 1e-5), gradTol)
		})
	}
}

// TestRMSNormThreads: dw's sum does not depend on the number of threads.
func TestRMSNormThreads(t *testing.T) {
	r := rand.New(rand.NewPCG(32, 33))
	N, C := 300, 24
	inp, w, dout := randn(r, N*C, 1), randn(r, C, 1), randn(r, N*C, 1)
	var first []float32
	for _, threads := range []int{1, 3, 8} {
		be := &Backend{threads: threads}
		out, rstd := make([]float32, N*C), make([]float32, N)
		be.RMSNormForward(out, rstd, inp, w, N, C, 1e-5)
		dinp, dw := make([]float32, N*C), make([]float32, C)
		be.RMSNormBackward(dinp, dw, dout, inp, w, rstd, N, C)
		got := slices.Concat(out, rstd, dinp, dw)
		if first == nil {
			first = got
		} else if !slices.Equal(got, first) {
			t.Errorf("%d threads: results differ from 1 thread's", threads)
		}
	}
}

func TestRoPE(t *testing.T) {
	scaled := kernels.RoPE{Theta: 500000, Scaling: &kernels.RoPEScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 64}}
	for _, c := range []struct {
		B, T, C, heads, hd, pos0 int
		rope                     kernels.RoPE
	}{
		{2, 5, 3 * 4, 2, 4, 0, kernels.RoPE{Theta: 10000}},       // q and k heads of a qkv row, v copied
		{1, 3, 6 * 64, 5, 64, 7, kernels.RoPE{Theta: 10000}},     // hd 64 (NH 4, NKV 1), later positions
		{2, 4, 2 * 8, 2, 8, 100, scaled},                         // Llama 3 scaling, every channel rotated
		{1, 1, 10, 1, 2, 4093, kernels.RoPE{Theta: 500000}},      // decode: one row at a late position
		{3, 7, 5 * 16, 3, 16, 0, kernels.RoPE{Theta: 1e6 + 0.5}}, // odd T
	} {
		name := fmt.Sprintf("B%d_T%d_C%d_heads%d_hd%d_pos%d", c.B, c.T, c.C, c.heads, c.hd, c.pos0)
		t.Run(name, func(t *testing.T) {
			if err := c.rope.Check(c.hd); err != nil {
				t.Fatal(err)
			}
			be := New()
			r := rand.New(rand.NewPCG(41, uint64(c.C)))
			n, maxT := c.B*c.T*c.C, c.pos0+c.T
			table := make([]float32, maxT*c.hd)
			c.rope.Table(table, maxT, c.hd)
			inp := randn(r, n, 1)
			x64, inv := ref.To64(inp), c.rope.InvFreq(c.hd)
			want := ref.RoPE(x64, inv, c.B, c.T, c.C, c.heads, c.hd, c.pos0)

			out := make([]float32, n)
			be.RoPEForward(out, inp, table, c.B, c.T, c.C, c.heads, c.hd, c.pos0)
			checkErr(t, "forward", out, want, fwdTol)
			inplace := slices.Clone(inp)
			be.RoPEForward(inplace, inplace, table, c.B, c.T, c.C, c.heads, c.hd, c.pos0)
			if !slices.Equal(inplace, out) {
				t.Error("in place differs from out of place")
			}

			// The backward pass of a linear map is its transpose: the
			// numerical gradient of Σ G·RoPE(x).
			G := ref.To64(randn(r, n, 1))
			dinp := make([]float32, n)
			be.RoPEBackward(dinp, toF32(G), table, c.B, c.T, c.C, c.heads, c.hd, c.pos0)
			phi := func() float64 { return ref.Dot(G, ref.RoPE(x64, inv, c.B, c.T, c.C, c.heads, c.hd, c.pos0)) }
			checkErr(t, "dinp", dinp, ref.NumGrad(phi, x64, 1e-3), gradTol)
			// ...and the inverse rotation: backward undoes forward, in place.
			be.RoPEBackward(out, out, table, c.B, c.T, c.C, c.heads, c.hd, c.pos0)
			checkErr(t, "backward(forward(x))", out, ref.To64(inp), fwdTol)
		})
	}
}

// TestRoPEFrequencies checks the frequency table: θ_i = Theta^(−2i/hd), and
// Llama 3.1's scaling, high frequencies kept, low ones divided by the
// factor, the band between interpolated so that the ratio falls steadily
// from 1 to 1/factor; and the table's rows are cos, sin of p·θ_i.
func TestRoPEFrequencies(t *testing.T) {
	const hd = 128
	plain := kernels.RoPE{Theta: 500000}
	f := plain.InvFreq(hd)
	if len(f) != hd/2 || f[0] != 1 || math.Abs(f[32]-1/math.Sqrt(500000)) > 1e-15 {
		t.Fatalf("InvFreq: len %d, θ_0 %v, θ_32 %v; want 64, 1, 500000^−½", len(f), f[0], f[32])
	}
	sc := &kernels.RoPEScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}
	g := kernels.RoPE{Theta: 500000, Scaling: sc}.InvFreq(hd)
	var kept, divided, between int
	prev := 1.0
	for i := range f {
		wave, ratio := 2*math.Pi/f[i], g[i]/f[i]
		switch {
		case wave < 8192/4:
			kept++
			if ratio != 1 {
				t.Errorf("θ_%d (wavelength %.0f) scaled by %v; want kept", i, wave, ratio)
			}
		case wave > 8192/1:
			divided++
			if math.Abs(ratio-1.0/8) > 1e-15 {
				t.Errorf("θ_%d (wavelength %.0f) scaled by %v; want 1/8", i, wave, ratio)
			}
		default:
			between++
			if !(ratio < prev && ratio > 1.0/8) {
				t.Errorf("θ_%d (wavelength %.0f) scaled by %v after %v; want between 1/8 and the previous ratio", i, wave, ratio, prev)
			}
		}
		prev = ratio
	}
	// Llama 3.1 at hd 128: 29 high, 6 interpolated (wavelengths 2402 …
	// 6695), 29 low frequencies.
	if kept != 29 || between != 6 || divided != 29 {
		t.Errorf("kept %d, interpolated %d, divided %d; want 29, 6, 29", kept, between, divided)
	}
	// θ_32 = 500000^−½: wavelength 4442.9, s = (8192/4442.9 − 1)/3 = 0.2813.
	th := 1 / math.Sqrt(500000)
	s := (8192/(2*math.Pi/th) - 1) / 3
	if want := (1-s)*th/8 + s*th; math.Abs(g[32]-want) > 1e-15*want || math.Abs(s-0.2813) > 1e-4 {
		t.Errorf("θ_32 = %v, want %v (s %v)", g[32], want, s)
	}

	table := make([]float32, 3*hd)
	plain.Table(table, 3, hd)
	for p := 0; p < 3; p++ {
		for _, i := range []int{0, 1, 63} {
			if c, s := table[p*hd+i], table[p*hd+hd/2+i]; c != float32(math.Cos(float64(p)*f[i])) || s != float32(math.Sin(float64(p)*f[i])) {
				t.Errorf("table row %d pair %d: cos %v sin %v", p, i, c, s)
			}
		}
	}

	for _, bad := range []struct {
		r  kernels.RoPE
		hd int
	}{
		{kernels.RoPE{Theta: 10000}, 7},
		{kernels.RoPE{Theta: 0}, 64},
		{kernels.RoPE{Theta: math.NaN()}, 64},
		{kernels.RoPE{Theta: 1e4, Scaling: &kernels.RoPEScaling{Factor: 0, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}}, 64},
		{kernels.RoPE{Theta: 1e4, Scaling: &kernels.RoPEScaling{Factor: 8, LowFreqFactor: 4, HighFreqFactor: 4, OriginalMaxPositions: 8192}}, 64},
		{kernels.RoPE{Theta: 1e4, Scaling: &kernels.RoPEScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4}}, 64},
	} {
		if err := bad.r.Check(bad.hd); err == nil {
			t.Errorf("Check(%+v, hd %d) = nil, want an error", bad.r, bad.hd)
		}
	}
}

// TestSwiGLUGrad checks the forward pass against the reference and the
// backward pass against an elementwise numerical gradient (each output
// depends on its own gate and up value only), over tails of the sigmoid.
func TestSwiGLUGrad(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(51, 52))
	for _, c := range []struct{ N, F int }{{7, 33}, {1, 1}, {130, 64}} {
		N, F := c.N, c.F
		inp := randn(r, N*2*F, 3)
		special := []float32{0, 1e-7, -20, 20, -90, 90, 5}
		for i, v := range special {
			if i < F {
				inp[i] = v // gate values of row 0
			}
		}
		x64 := ref.To64(inp)
		out := make([]float32, N*F)
		be.SwiGLUForward(out, inp, N, F)
		checkErr(t, "forward", out, ref.SwiGLU(x64, N, F), fwdTol)

		dout := randn(r, N*F, 1)
		dinp := make([]float32, N*2*F)
		for i := range dinp {
			dinp[i] = 9 // overwritten, not accumulated
		}
		be.SwiGLUBackward(dinp, inp, dout, N, F)
		f := func(g, u float64) float64 { return g / (1 + math.Exp(-g)) * u }
		want := make([]float64, N*2*F)
		const h = 1e-5
		for row := 0; row < N; row++ {
			for i := 0; i < F; i++ {
				gi, ui, d := 2*row*F+i, (2*row+1)*F+i, float64(dout[row*F+i])
				g, u := x64[gi], x64[ui]
				want[gi] = d * (f(g+h, u) - f(g-h, u)) / (2 * h)
				want[ui] = d * (f(g, u+h) - f(g, u-h)) / (2 * h)
			}
		}
		checkErr(t, fmt.Sprintf("N%d F%d dinp", N, F), dinp, want, gradTol)
	}
}

// gqaCases are the grouped-query shapes the CPU and CUDA tests share in
// spirit: one key/value head for all, one per query head, four query heads
// per group, odd T, head sizes 64 and small ones.
var gqaCases = []struct {
	B, T, NH, NKV, hd int
	p                 float32
}{
	{2, 5, 2, 2, 4, 0},    // NKV = NH
	{2, 5, 2, 2, 4, 0.3},  // ... with dropout
	{2, 5, 4, 1, 4, 0.3},  // NKV = 1, NH/NKV = 4
	{1, 7, 4, 2, 6, 0},    // odd T, groups of 2
	{1, 3, 8, 2, 64, 0.2}, // hd 64, NH/NKV = 4
}

func TestGQAGrad(t *testing.T) {
	be := New()
	be.poisonScratch = true // nothing reads a working buffer before writing it
	for _, c := range gqaCases {
		name := fmt.Sprintf("B%d_T%d_NH%d_NKV%d_hd%d_p%g", c.B, c.T, c.NH, c.NKV, c.hd, c.p)
		t.Run(name, func(t *testing.T) {
			B, T, NH, NKV, hd := c.B, c.T, c.NH, c.NKV, c.hd
			r := rand.New(rand.NewPCG(61, uint64(NH*100+NKV*10+hd)))
			qkv := randn(r, B*T*(NH+2*NKV)*hd, 1)
			C := NH * hd
			G := ref.To64(randn(r, B*T*C, 1))
			d := kernels.Dropout{P: c.p, Key: 77}
			const off = 500
			var keep func(int) bool
			if c.p > 0 {
				keep = func(i int) bool { return d.Keep(off + uint64(i)) }
			}
			out, att := make([]float32, B*T*C), make([]float32, B*NH*T*T)
			be.GQAForward(out, att, qkv, B, T, NH, NKV, hd, d, off)
			q64 := ref.To64(qkv)
			want := ref.GQA(q64, B, T, NH, NKV, hd, float64(c.p), keep)
			checkErr(t, "forward", out, want, fwdTol)
			if NKV == NH {
				checkErr(t, "forward against ref.Attention", out, ref.Attention(q64, B, T, C, NH, float64(c.p), keep), fwdTol)
			}
			dqkv := make([]float32, len(qkv))
			for i := range dqkv {
				dqkv[i] = 7 // overwritten, not accumulated
			}
			be.GQABackward(dqkv, toF32(G), out, qkv, att, B, T, NH, NKV, hd, d, off)
			phi := func() float64 { return ref.Dot(G, ref.GQA(q64, B, T, NH, NKV, hd, float64(c.p), keep)) }
			checkErr(t, "dqkv", dqkv, ref.NumGrad(phi, q64, 1e-5), gradTol)
		})
	}
}

// TestGQAEqualsAttention: with NKV = NH, grouped-query attention is the
// existing multi-head attention, bit for bit, forward and backward.
func TestGQAEqualsAttention(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(71, 72))
	B, T, NH, hd := 2, 9, 3, 16
	C := NH * hd
	qkv, dout := randn(r, B*T*3*C, 1), randn(r, B*T*C, 1)
	d := kernels.Dropout{P: 0.1, Key: 5, Heads: 6, Head0: 3}
	o1, a1, d1 := make([]float32, B*T*C), make([]float32, B*NH*T*T), make([]float32, B*T*3*C)
	o2, a2, d2 := make([]float32, B*T*C), make([]float32, B*NH*T*T), make([]float32, B*T*3*C)
	be.AttentionForward(o1, a1, qkv, B, T, C, NH, d, 40)
	be.AttentionBackward(d1, dout, o1, qkv, a1, B, T, C, NH, d, 40)
	be.GQAForward(o2, a2, qkv, B, T, NH, NH, hd, d, 40)
	be.GQABackward(d2, dout, o2, qkv, a2, B, T, NH, NH, hd, d, 40)
	if !slices.Equal(o1, o2) || !slices.Equal(a1, a2) || !slices.Equal(d1, d2) {
		t.Error("GQA with NKV = NH differs from AttentionForward/Backward")
	}
}

// TestGQADecode: decoding position pos against a grouped cache gives the
// last row of GQAForward over positions 0…pos.
func TestGQADecode(t *testing.T) {
	be := New()
	for _, c := range []struct{ B, pos, maxT, NH, NKV, hd int }{
		{2, 0, 3, 2, 1, 8},
		{2, 6, 9, 4, 1, 4},
		{1, 10, 11, 8, 2, 64},
		{3, 4, 8, 3, 3, 5},
	} {
		B, T, NH, NKV, hd := c.B, c.pos+1, c.NH, c.NKV, c.hd
		r := rand.New(rand.NewPCG(81, uint64(c.pos)))
		ld, C, CKV := (NH+2*NKV)*hd, NH*hd, NKV*hd
		qkv := randn(r, B*T*ld, 1)
		out, att := make([]float32, B*T*C), make([]float32, B*NH*T*T)
		be.GQAForward(out, att, qkv, B, T, NH, NKV, hd, kernels.Dropout{}, 0)
		q := make([]float32, B*C)
		kc, vc := randn(r, B*c.maxT*CKV, 1), randn(r, B*c.maxT*CKV, 1) // rows past pos: noise
		var want []float32
		for b := 0; b < B; b++ {
			for t := 0; t < T; t++ {
				row := qkv[(b*T+t)*ld : (b*T+t+1)*ld]
				copy(kc[(b*c.maxT+t)*CKV:], row[C:C+CKV])
				copy(vc[(b*c.maxT+t)*CKV:], row[C+CKV:])
			}
			copy(q[b*C:], qkv[(b*T+c.pos)*ld:(b*T+c.pos)*ld+C])
			want = append(want, out[(b*T+c.pos)*C:(b*T+c.pos+1)*C]...)
		}
		got := make([]float32, B*C)
		be.GQADecode(got, q, kc, vc, B, c.pos, c.maxT, NH, NKV, hd)
		checkErr(t, fmt.Sprintf("decode %+v", c), got, ref.To64(want), fwdTol)
	}
}
