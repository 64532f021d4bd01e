package cpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/ref"
)

// Each layer's backward is checked against a float64 numerical gradient of
// the float64 reference forward (kernels/ref), through the scalar
// Φ = Σ G ⊙ forward(x) for a random upstream gradient G. The forward is
// checked against the same reference.

const (
	fwdTol  = 1e-5 // float32 forward vs float64 reference
	gradTol = 1e-4 // float32 analytic gradient vs float64 numerical gradient
)

func randn(r *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * scale)
	}
	return x
}

func checkErr(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	if e := ref.RelErr(got, want); !(e < tol) {
		t.Errorf("%s: relative error %.3g, want < %g", what, e, tol)
	}
}

func newTestBackends(t *testing.T) map[string]*Backend {
	t.Helper()
	t.Setenv("GPTUI_BLAS", "")
	bs := map[string]*Backend{"default": New()}
	t.Setenv("GPTUI_BLAS", "go")
	bs["pure-go"] = New()
	return bs
}

func TestEncoderGrad(t *testing.T) {
	for name, be := range newTestBackends(t) {
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			B, T, C, V := 2, 3, 5, 7
			inp := []int32{0, 6, 3, 3, 1, 6}
			wte, wpe := randn(r, V*C, 1), randn(r, T*C, 1)
			G := ref.To64(randn(r, B*T*C, 1))
			out := make([]float32, B*T*C)
			be.EncoderForward(out, inp, wte, wpe, B, T, C)
			wte64, wpe64 := ref.To64(wte), ref.To64(wpe)
			checkErr(t, "forward", out, ref.Encoder(inp, wte64, wpe64, B, T, C), fwdTol)
			dwte, dwpe := make([]float32, V*C), make([]float32, T*C)
			be.EncoderBackward(dwte, dwpe, toF32(G), inp, B, T, C)
			phi := func() float64 { return ref.Dot(G, ref.Encoder(inp, wte64, wpe64, B, T, C)) }
			checkErr(t, "dwte", dwte, ref.NumGrad(phi, wte64, 1e-5), gradTol)
			checkErr(t, "dwpe", dwpe, ref.NumGrad(phi, wpe64, 1e-5), gradTol)
		})
	}
}

func toF32(x []float64) []float32 {
	y := make([]float32, len(x))
	for i, v := range x {
		y[i] = float32(v)
	}
	return y
}

func TestLayerNormGrad(t *testing.T) {
	for name, be := range newTestBackends(t) {
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(3, 4))
			N, C := 70, 9 // more rows than one reduction chunk
			inp, w, b := randn(r, N*C, 2), randn(r, C, 1), randn(r, C, 1)
			for i := range inp {
				inp[i] += 0.5
			}
			G := ref.To64(randn(r, N*C, 1))
			out, mean, rstd := make([]float32, N*C), make([]float32, N), make([]float32, N)
			be.LayerNormForward(out, mean, rstd, inp, w, b, N, C)
			x64, w64, b64 := ref.To64(inp), ref.To64(w), ref.To64(b)
			checkErr(t, "forward", out, ref.LayerNorm(x64, w64, b64, N, C), fwdTol)
			dinp, dw, db := make([]float32, N*C), make([]float32, C), make([]float32, C)
			be.LayerNormBackward(dinp, dw, db, toF32(G), inp, w, mean, rstd, N, C)
			phi := func() float64 { return ref.Dot(G, ref.LayerNorm(x64, w64, b64, N, C)) }
			checkErr(t, "dinp", dinp, ref.NumGrad(phi, x64, 1e-5), gradTol)
			checkErr(t, "dw", dw, ref.NumGrad(phi, w64, 1e-5), gradTol)
			checkErr(t, "dbias", db, ref.NumGrad(phi, b64, 1e-5), gradTol)
		})
	}
}

func TestMatmulGrad(t *testing.T) {
	for name, be := range newTestBackends(t) {
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(5, 6))
			N, IC, OC := 13, 11, 7
			inp, w, bias := randn(r, N*IC, 1), randn(r, OC*IC, 1), randn(r, OC, 1)
			G := ref.To64(randn(r, N*OC, 1))
			out := make([]float32, N*OC)
			be.MatmulForward(out, inp, w, bias, N, IC, OC)
			x64, w64, b64 := ref.To64(inp), ref.To64(w), ref.To64(bias)
			checkErr(t, "forward", out, ref.Matmul(x64, w64, b64, N, IC, OC), fwdTol)
			dinp, dw, db := make([]float32, N*IC), make([]float32, OC*IC), make([]float32, OC)
			for i := range dinp {
				dinp[i] = 123 // overwritten, not accumulated
			}
			be.MatmulBackward(dinp, dw, db, toF32(G), inp, w, N, IC, OC)
			phi := func() float64 { return ref.Dot(G, ref.Matmul(x64, w64, b64, N, IC, OC)) }
			checkErr(t, "dinp", dinp, ref.NumGrad(phi, x64, 1e-5), gradTol)
			checkErr(t, "dw", dw, ref.NumGrad(phi, w64, 1e-5), gradTol)
			checkErr(t, "dbias", db, ref.NumGrad(phi, b64, 1e-5), gradTol)
		})
	}
}

func TestAttentionGrad(t *testing.T) {
	for _, p := range []float32{0, 0.3} {
		be := New()
		be.poisonScratch = true // nothing reads a working buffer before writing it
		r := rand.New(rand.NewPCG(7, 8))
		B, T, C, NH := 2, 5, 8, 2
		qkv := randn(r, B*T*3*C, 1)
		G := ref.To64(randn(r, B*T*C, 1))
		d := kernels.Dropout{P: p, Key: 99}
		const off = 1000
		var keep func(int) bool
		if p > 0 {
			keep = func(i int) bool { return d.Keep(off + uint64(i)) }
		}
		out, att := make([]float32, B*T*C), make([]float32, B*NH*T*T)
		be.AttentionForward(out, att, qkv, B, T, C, NH, d, off)
		q64 := ref.To64(qkv)
		checkErr(t, "forward", out, ref.Attention(q64, B, T, C, NH, float64(p), keep), fwdTol)
		dqkv := make([]float32, len(qkv))
		for i := range dqkv {
			dqkv[i] = 7 // overwritten, not accumulated
		}
		be.AttentionBackward(dqkv, toF32(G), nil, qkv, att, B, T, C, NH, d, off)
		phi := func() float64 { return ref.Dot(G, ref.Attention(q64, B, T, C, NH, float64(p), keep)) }
		checkErr(t, "dqkv", dqkv, ref.NumGrad(phi, q64, 1e-5), gradTol)
	}
}

func TestGeluGrad(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(9, 10))
	x := randn(r, 5000, 3)
	x[0], x[1] = 12, -12                          // tails of tanh
	x[2], x[3], x[4], x[5] = 0, 1e-7, -3e-7, 2e-6 // where tanh u comes from u, not from out/x
	G := ref.To64(randn(r, len(x), 1))
	out := make([]float32, len(x))
	be.GeluForward(out, x)
	x64 := ref.To64(x)
	checkErr(t, "forward", out, ref.Gelu(x64), fwdTol)
	dx := make([]float32, len(x))
	be.GeluBackward(dx, x, out, toF32(G))
	phi := func() float64 { return ref.Dot(G, ref.Gelu(x64)) }
	checkErr(t, "dinp", dx, ref.NumGrad(phi, x64, 1e-5), gradTol)
}

// TestMatmulGeluGrad: GPT-2's MLP with GELU in its GEMMs' epilogues.
// MatmulGeluForward equals MatmulForward then GeluForward bit for bit
// (in fp32 the stored pre-activation is the sum GELU reads), and
// MatmulBackwardGelu's gradients are those of pre → GELU → linear layer.
func TestMatmulGeluGrad(t *testing.T) {
	for name, be := range newTestBackends(t) {
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(13, 14))
			N, IC, OC := 9, 7, 12
			inp, w, bias := randn(r, N*IC, 1), randn(r, OC*IC, 1), randn(r, OC, 1)
			pre, out := make([]float32, N*OC), make([]float32, N*OC)
			be.MatmulGeluForward(out, pre, inp, w, bias, N, IC, OC)
			pre2, out2 := make([]float32, N*OC), make([]float32, N*OC)
			be.MatmulForward(pre2, inp, w, bias, N, IC, OC)
			be.GeluForward(out2, pre2)
			if !slices.Equal(pre, pre2) || !slices.Equal(out, out2) {
				t.Fatal("MatmulGeluForward differs from MatmulForward then GeluForward")
			}

			// The GEMM after the GELU: y (N,C2) = GELU(pre)·w2ᵀ + b2.
			C2 := 5
			w2, b2 := randn(r, C2*OC, 1), randn(r, C2, 1)
			G := ref.To64(randn(r, N*C2, 1))
			dpre, dw, db := make([]float32, N*OC), make([]float32, C2*OC), make([]float32, C2)
			for i := range dpre {
				dpre[i] = 123 // overwritten, not accumulated
			}
			be.MatmulBackwardGelu(dpre, dw, db, toF32(G), out, pre, w2, N, OC, C2)
			p64, w64, b64 := ref.To64(pre), ref.To64(w2), ref.To64(b2)
			phi := func() float64 { return ref.Dot(G, ref.Matmul(ref.Gelu(p64), w64, b64, N, OC, C2)) }
			checkErr(t, "dpre", dpre, ref.NumGrad(phi, p64, 1e-5), gradTol)
			checkErr(t, "dw", dw, ref.NumGrad(phi, w64, 1e-5), gradTol)
			checkErr(t, "dbias", db, ref.NumGrad(phi, b64, 1e-5), gradTol)
		})
	}
}

func TestCrossEntropyGrad(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(11, 12))
	N, V := 6, 33
	logits := randn(r, N*V, 3)
	targets := []int32{0, 32, 5, 5, 17, 1}
	l64 := ref.To64(logits)
	losses := make([]float32, N)
	const dscale = 0.25
	be.CrossEntropy(losses, logits, targets, N, V, V, dscale, true)
	checkErr(t, "losses", losses, ref.CrossEntropy(l64, targets, N, V), fwdTol)
	phi := func() float64 {
		var s float64
		for _, l := range ref.CrossEntropy(l64, targets, N, V) {
			s += dscale * l
		}
		return s
	}
	checkErr(t, "dlogits", logits, ref.NumGrad(phi, l64, 1e-5), gradTol)
}

func TestDropout(t *testing.T) {
	be := New()
	const n = 200000
	x := make([]float32, n)
	for i := range x {
		x[i] = 1
	}
	d := kernels.Dropout{P: 0.25, Key: kernels.SiteKey(1, 2, 3)}
	out := make([]float32, n)
	be.DropoutForward(out, x, d, 0)
	var kept int
	for i, v := range out {
		switch v {
		case 0:
		case d.Scale():
			kept++
		default:
			t.Fatalf("out[%d] = %v, want 0 or %v", i, v, d.Scale())
		}
		if (v != 0) != d.Keep(uint64(i)) {
			t.Fatalf("element %d: output disagrees with Keep", i)
		}
	}
	if frac := float64(kept) / n; frac < 0.74 || frac > 0.76 {
		t.Errorf("kept fraction %.4f, want 0.75 ± 0.01", frac)
	}
	// Offsets address one global stream: a slice starting at 1000 draws the
	// same mask as elements 1000… of the whole.
	part := make([]float32, 500)
	be.DropoutForward(part, x[:500], d, 1000)
	for i := range part {
		if part[i] != out[1000+i] {
			t.Fatalf("offset stream differs at %d", i)
		}
	}
}

func TestAdamWMatchesFormula(t *testing.T) {
	be := New()
	p := []float32{1, -2, 0.5}
	g := []float32{0.1, -0.3, 0}
	m, v := make([]float32, 3), make([]float32, 3)
	be.AdamW(p, g, m, v, 0.01, 0.9, 0.999, 1e-8, 0.1, 1, 1)
	// step 1: m̂ = g, v̂ = g², so p -= lr·(g/(|g|+ε) + wd·p)
	want := []float64{1 - 0.01*(0.1/(0.1+1e-8)+0.1*1), -2 - 0.01*(-0.3/(0.3+1e-8)+0.1*-2), 0.5 - 0.01*(0+0.1*0.5)}
	checkErr(t, "params", p, want, 1e-6)
}

// TestSums: Sum and SumSquares add w times their sums into out[0], the
// same bits whatever the thread count, across chunk boundaries.
func TestSums(t *testing.T) {
	be := New()
	out := []float64{1}
	be.SumSquares(out, []float32{3, 4}, 0.5)
	be.Sum(out, []float32{3, -4}, 2)
	if out[0] != 1+12.5-2 {
		t.Errorf("1 + ½·Σx² + 2·Σx = %v, want 11.5", out[0])
	}
	r := rand.New(rand.NewPCG(23, 24))
	x := randn(r, 3*normChunk+17, 1)
	var want, wantSq float64
	for c := 0; c < len(x); c += normChunk {
		var s, sq float64
		for _, v := range x[c:min(len(x), c+normChunk)] {
			s += float64(v)
			sq += float64(v) * float64(v)
		}
		want += s
		wantSq += sq
	}
	for _, threads := range []int{1, 3} {
		b := &Backend{threads: threads}
		got := []float64{0, 0}
		b.Sum(got[:1], x, 1)
		b.SumSquares(got[1:], x, 1)
		if got[0] != want || got[1] != wantSq {
			t.Errorf("%d threads: Σx = %v, Σx² = %v; want %v, %v", threads, got[0], got[1], want, wantSq)
		}
	}
}

// TestCopyAndGlobalMax: Copy copies; ClassifierGlobalMax takes each row's
// largest value over the ranks.
func TestCopyAndGlobalMax(t *testing.T) {
	be := New()
	src := []float32{1, 2, 3}
	dst := make([]float32, 3)
	be.Copy(dst, src)
	if !slices.Equal(dst, src) {
		t.Errorf("Copy: %v, want %v", dst, src)
	}
	ninf := float32(math.Inf(-1))
	gmax := []float32{1, ninf, 5, 2, ninf, -1, 0, ninf, 7} // (3 ranks, 3 rows)
	maxes := make([]float32, 3)
	be.ClassifierGlobalMax(maxes, gmax, 3, 3)
	if want := []float32{2, ninf, 7}; !slices.Equal(maxes, want) {
		t.Errorf("ClassifierGlobalMax: %v, want %v", maxes, want)
	}
}

// TestAdamWVectorMatchesScalar: the SSE loop gives the scalar loop's bits,
// for odd lengths (the tail) and gradients that are clipped and zero.
func TestAdamWVectorMatchesScalar(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, n := range []int{1, 3, 4, 7, 1000, 70001} {
		p0, g := randn(r, n, 1), randn(r, n, 1e-3)
		g[0] = 0
		m0, v0 := randn(r, n, 1e-3), randn(r, n, 1e-6)
		for i := range v0 {
			v0[i] *= v0[i]
		}
		run := func(scalar bool) ([]float32, []float32, []float32) {
			be := New()
			be.scalarAdamW = scalar
			p, m, v := append([]float32(nil), p0...), append([]float32(nil), m0...), append([]float32(nil), v0...)
			for step := 1; step <= 3; step++ {
				be.AdamW(p, g, m, v, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.5, step)
			}
			return p, m, v
		}
		ps, ms, vs := run(true)
		pv, mv, vv := run(false)
		for i := range ps {
			if ps[i] != pv[i] || ms[i] != mv[i] || vs[i] != vv[i] {
				t.Fatalf("n=%d element %d: vector (%v %v %v), scalar (%v %v %v)", n, i, pv[i], mv[i], vv[i], ps[i], ms[i], vs[i])
			}
		}
	}
}
