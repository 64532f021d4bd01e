package cpu

import (
	"math"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/gptui/gptui/kernels"
)

// TestActivationsStoreBF16: under bf16, what a kernel stores into buffers
// from Activations is its float32 result rounded to bfloat16 — once, at
// the end (an accumulated output too, a GEMM's bias after the product,
// read rounded) —
// while float32 buffers keep the float32 result; the fused residual norms
// equal the unfused pair, whose norm reads the rounded sum; in fp32,
// Activations are plain float32s. A buffer's span goes once it is
// unreachable.
func TestActivationsStoreBF16(t *testing.T) {
	b, err := Open(Options{BF16: true})
	if err != nil {
		t.Skipf("bf16 on this CPU: %v", err)
	}
	const N, C = 7, 96
	rnd := func(seed float64) []float32 {
		x := make([]float32, 64*C)
		for i := range x {
			x[i] = float32(math.Sin(seed*float64(i+1)) * 1.7)
		}
		return x
	}
	rounded := func(x []float32) []float32 { y := slices.Clone(x); kernels.RoundBF16(y); return y }
	x, y, w, bias := rnd(0.37)[:N*C], rnd(1.3)[:N*C], rnd(0.11)[:C], rnd(2.9)[:C]

	// One kernel: ResidualForward.
	h, f := b.Activations(N*C), make([]float32, N*C)
	b.ResidualForward(h, x, y)
	b.ResidualForward(f, x, y)
	if !slices.Equal(h, rounded(f)) || slices.Equal(f, rounded(f)) {
		t.Fatal("ResidualForward: the activations are not the float32 result rounded, or the float32 buffer was rounded")
	}

	// An accumulated output: LayerNormBackward's dinp += …, rounded after the add.
	mean, rstd, out := make([]float32, N), make([]float32, N), make([]float32, N*C)
	b.LayerNormForward(out, mean, rstd, x, w, bias, N, C)
	dh := b.Activations(N * C)
	copy(dh, rounded(y))
	df := slices.Clone(dh)
	dw, db := make([]float32, C), make([]float32, C)
	b.LayerNormBackward(dh, dw, db, x, x, w, mean, rstd, N, C)
	b.LayerNormBackward(df, dw, db, x, x, w, mean, rstd, N, C)
	if !slices.Equal(dh, rounded(df)) {
		t.Fatal("LayerNormBackward: the accumulated activations gradient is not the float32 sum rounded")
	}

	// A GEMM with a bias: rounded once, after the bias (not after the
	// product), the bias read as a bfloat16 (as cuBLASLt's bias epilogue
	// reads it) into activations, as it is into float32.
	const OC = 40
	wm := rnd(0.77)[:OC*C]
	mh, mf, mr := b.Activations(N*OC), make([]float32, N*OC), make([]float32, N*OC)
	b.MatmulForward(mh, x, wm, y[:OC], N, C, OC)
	b.MatmulForward(mf, x, wm, y[:OC], N, C, OC)
	b.MatmulForward(mr, x, wm, rounded(y[:OC]), N, C, OC)
	if !slices.Equal(mh, rounded(mr)) || slices.Equal(mh, rounded(mf)) {
		t.Fatal("MatmulForward: the activations are not the float32 result with the bias rounded, rounded once")
	}

	// GELU in the GEMM's epilogue: the pre-activation and GELU's output
	// each rounded once from the float32 sum (GELU not of the rounded
	// pre-activation); GELU's backward in the input gradient's epilogue:
	// the float32 product times the derivative at the stored
	// pre-activation, rounded once.
	pre, gl := b.Activations(N*OC), b.Activations(N*OC)
	b.MatmulGeluForward(gl, pre, x, wm, y[:OC], N, C, OC)
	gf, gr := make([]float32, N*OC), make([]float32, N*OC)
	b.GeluForward(gf, mr)
	b.GeluForward(gr, rounded(mr))
	if !slices.Equal(pre, rounded(mr)) || !slices.Equal(gl, rounded(gf)) || slices.Equal(gl, rounded(gr)) {
		t.Fatal("MatmulGeluForward: pre and out are not each rounded once from the float32 sum")
	}
	dpre, dw2, db2 := b.Activations(N*OC), make([]float32, C*OC), make([]float32, C)
	b.MatmulBackwardGelu(dpre, dw2, db2, x, gl, pre, wm, N, OC, C)
	prod := make([]float32, N*OC)
	b.MatmulBackward(prod, make([]float32, C*OC), nil, x, gl, wm, N, OC, C)
	th := make([]float32, N*OC)
	geluTanh(th, pre)
	for i := range prod {
		prod[i] *= geluGrad(pre[i], th[i])
	}
	if !slices.Equal(dpre, rounded(prod)) {
		t.Fatal("MatmulBackwardGelu: the input gradient is not the float32 product times GELU' rounded once")
	}

	// Fused = unfused, the norm reading the rounded sum.
	res1, res2 := b.Activations(N*C), b.Activations(N*C)
	o1, o2 := b.Activations(N*C), b.Activations(N*C)
	m1, r1, m2, r2 := make([]float32, N), make([]float32, N), make([]float32, N), make([]float32, N)
	b.ResidualLayerNormForward(res1, o1, m1, r1, x, y, w, bias, N, C)
	b.ResidualForward(res2, x, y)
	b.LayerNormForward(o2, m2, r2, res2, w, bias, N, C)
	if !slices.Equal(res1, res2) || !slices.Equal(o1, o2) || !slices.Equal(m1, m2) || !slices.Equal(r1, r2) {
		t.Fatal("ResidualLayerNormForward differs from ResidualForward then LayerNormForward under bf16")
	}
	b.ResidualRMSNormForward(res1, o1, r1, x, y, w, N, C, 1e-5)
	b.RMSNormForward(o2, r2, res2, w, N, C, 1e-5)
	if !slices.Equal(res1, res2) || !slices.Equal(o1, o2) || !slices.Equal(r1, r2) {
		t.Fatal("ResidualRMSNormForward differs from ResidualForward then RMSNormForward under bf16")
	}

	// fp32: Activations are float32s.
	f32 := New()
	h32 := f32.Activations(N * C)
	f32.ResidualForward(h32, x, y)
	if !slices.Equal(h32, f) {
		t.Fatal("fp32 backend: Activations were rounded")
	}

	// Unreachable buffers leave the registry.
	b.halves.mu.RLock()
	before := len(b.halves.spans)
	b.halves.mu.RUnlock()
	if before == 0 {
		t.Fatal("no spans registered")
	}
	runtime.KeepAlive(h)
	h, dh, mh, res1, res2, o1, o2 = nil, nil, nil, nil, nil, nil, nil
	for deadline := time.Now().Add(5 * time.Second); ; {
		runtime.GC()
		b.halves.mu.RLock()
		n := len(b.halves.spans)
		b.halves.mu.RUnlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d spans still registered after their buffers became unreachable", n, before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
