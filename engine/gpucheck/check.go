package gpucheck

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"

	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/kernels/cuda"
)

// CheckBackend runs every method of kernels.Backend on the GPU backend g
// and on the CPU backend with the same random inputs, and writes one line
// per output: its relative L2 error ‖gpu−cpu‖/‖cpu‖, the largest absolute
// difference, and PASS or FAIL against the output's tolerance (1e-5 for
// fp32 work, exact for dropout masks, 2e-2 for GEMMs with 16-bit inputs).
// It returns an error naming the failed outputs. It is the device half of
// the kernel tests, which run the same sources under an emulator in CI.
func CheckBackend(g *cuda.Backend, w io.Writer) error {
	c := &checker{g: g, c: cpu.New(), w: w, rng: rand.New(rand.NewPCG(1, 2))}
	gemmTol := 1e-5
	if g.Precision() != cuda.PrecisionFP32 {
		gemmTol = 2e-2
	}
	// Attention without dropout runs on the tensor-core flash kernels in
	// bf16 (these checks have head sizes 64 and 128), to the emulator
	// tests' bf16 tolerance; with dropout, and in fp32 or fp16, on the fp32
	// kernels.
	attnTol := func(d kernels.Dropout) float64 {
		if g.Precision() == cuda.PrecisionBF16 && d.P == 0 && os.Getenv("GPTUI_FLASH_ATTENTION") != "off" {
			return 1e-2
		}
		return 1e-5
	}
	const (
		B, T, C, NH, F = 2, 67, 256, 4, 1024
		V, Vp          = 1000, 1024
		N              = B * T
	)
	tok := func(n, v int) []int32 {
		x := make([]int32, n)
		for i := range x {
			x[i] = int32(c.rng.IntN(v))
		}
		return x
	}
	inp := tok(N, V)
	drop := kernels.Dropout{P: 0.1, Key: kernels.SiteKey(7, 1, 2, 3)}

	// Embedding, whole and vocabulary-parallel.
	wte, wpe := c.randn(Vp*C, 0.02), c.randn(T*C, 0.02)
	c.compare("EncoderForward", 1e-6, func(be kernels.Backend, a args) {
		be.EncoderForward(a.f(0), a.i(0), a.f(1), a.f(2), B, T, C)
	}, outs{c.zeros(N * C)}, ins{wte, wpe}, ints{inp})
	dout := c.randn(N*C, 1)
	c.compare("EncoderBackward", 1e-5, func(be kernels.Backend, a args) {
		be.EncoderBackward(a.f(0), a.f(1), a.f(2), a.i(0), B, T, C)
	}, outs{c.randn(Vp*C, 0.01), c.randn(T*C, 0.01)}, ins{dout}, ints{inp})
	c.compare("EncoderShardForward", 1e-6, func(be kernels.Backend, a args) {
		be.EncoderShardForward(a.f(0), a.i(0), a.f(1), 512, a.f(2), B, T, C)
	}, outs{c.zeros(N * C)}, ins{wte[512*C:], wpe}, ints{inp})
	c.compare("EncoderShardBackward", 1e-5, func(be kernels.Backend, a args) {
		be.EncoderShardBackward(a.f(0), 512, a.f(1), a.f(2), a.i(0), B, T, C)
	}, outs{c.randn(512*C, 0.01), c.randn(T*C, 0.01)}, ins{dout}, ints{inp})

	// LayerNorm.
	x, lw, lb := c.randn(N*C, 1), c.randn(C, 1), c.randn(C, 1)
	c.compare("LayerNormForward", 1e-5, func(be kernels.Backend, a args) {
		be.LayerNormForward(a.f(0), a.f(1), a.f(2), a.f(3), a.f(4), a.f(5), N, C)
	}, outs{c.zeros(N * C), c.zeros(N), c.zeros(N)}, ins{x, lw, lb})
	mean, rstd := make([]float32, N), make([]float32, N)
	c.c.LayerNormForward(make([]float32, N*C), mean, rstd, x, lw, lb, N, C)
	c.compare("LayerNormBackward", 1e-5, func(be kernels.Backend, a args) {
		be.LayerNormBackward(a.f(0), a.f(1), a.f(2), a.f(3), a.f(4), a.f(5), a.f(6), a.f(7), N, C)
	}, outs{c.randn(N*C, 1), c.randn(C, 1), c.randn(C, 1)}, ins{dout, x, lw, mean, rstd})

	// Linear layers, and the plain GEMM.
	xin, wm, bias := c.randn(N*C, 1), c.randn(F*C, 0.05), c.randn(F, 0.1)
	c.compare("MatmulForward", gemmTol, func(be kernels.Backend, a args) {
		be.MatmulForward(a.f(0), a.f(1), a.f(2), a.f(3), N, C, F)
	}, outs{c.zeros(N * F)}, ins{xin, wm, bias})
	dmm := c.randn(N*F, 1)
	c.compare("MatmulBackward", gemmTol, func(be kernels.Backend, a args) {
		be.MatmulBackward(a.f(0), a.f(1), a.f(2), a.f(3), a.f(4), a.f(5), N, C, F)
	}, outs{c.zeros(N * C), c.randn(F*C, 0.1), c.randn(F, 0.1)}, ins{dmm, xin, wm})
	// GPT-2's fc with GELU in its epilogue, and the GEMM after the GELU
	// with GELU's backward in its input gradient's (here in fp32: the
	// GEMM, then GELU's kernels; the backward's derivative from GELU's
	// input alone).
	c.compare("MatmulGeluForward", gemmTol, func(be kernels.Backend, a args) {
		be.MatmulGeluForward(a.f(0), a.f(1), a.f(2), a.f(3), a.f(4), N, C, F)
	}, outs{c.zeros(N * F), c.zeros(N * F)}, ins{xin, wm, bias})
	pre := c.randn(N*F, 2)
	gl := make([]float32, N*F)
	c.c.GeluForward(gl, pre)
	c.compare("MatmulBackwardGelu", gemmTol, func(be kernels.Backend, a args) {
		be.MatmulBackwardGelu(a.f(0), a.f(1), a.f(2), a.f(3), a.f(4), a.f(5), a.f(6), N, F, C)
	}, outs{c.zeros(N * F), c.randn(C*F, 0.1), c.randn(C, 0.1)}, ins{x, gl, pre, wm})
	c.compare("Sgemm", 1e-5, func(be kernels.Backend, a args) {
		be.Sgemm(true, false, 70, 90, 50, 0.5, a.f(1), 70, a.f(2), 90, 1, a.f(0), 90)
	}, outs{c.randn(70*90, 1)}, ins{c.randn(50*70, 1), c.randn(50*90, 1)})

	// Attention, with and without dropout, with tensor-parallel heads.
	qkv := c.randn(N*3*C, 1)
	for _, d := range []kernels.Dropout{{}, drop, {P: 0.1, Key: drop.Key, Heads: 2 * NH, Head0: NH}} {
		name := fmt.Sprintf("Attention p=%g heads=%d", d.P, d.Heads)
		c.compare(name+" forward", attnTol(d), func(be kernels.Backend, a args) {
			att := kernels.Float32s(be, kernels.AttentionFloats(be, B, NH, T))
			be.AttentionForward(a.f(0), att, a.f(1), B, T, C, NH, d, 12345)
			kernels.Sync(be)
			kernels.Free(be, att)
		}, outs{c.zeros(N * C)}, ins{qkv})
		da := c.randn(N*C, 1)
		c.compare(name+" backward", attnTol(d), func(be kernels.Backend, a args) {
			att := kernels.Float32s(be, kernels.AttentionFloats(be, B, NH, T))
			out := kernels.Float32s(be, N*C)
			be.AttentionForward(out, att, a.f(1), B, T, C, NH, d, 12345)
			be.AttentionBackward(a.f(0), a.f(2), out, a.f(1), att, B, T, C, NH, d, 12345)
			kernels.Sync(be)
			kernels.Free(be, att)
			kernels.Free(be, out)
		}, outs{c.zeros(N * 3 * C)}, ins{qkv, da})
	}
	const maxT, pos = 80, 66
	c.compare("AttentionDecode", 1e-5, func(be kernels.Backend, a args) {
		be.AttentionDecode(a.f(0), a.f(1), a.f(2), a.f(3), B, pos, maxT, C, NH)
	}, outs{c.zeros(B * C)}, ins{c.randn(B*C, 1), c.randn(B*maxT*C, 1), c.randn(B*maxT*C, 1)})

	// The Llama family: RMSNorm, rotary embeddings on a grouped-query qkv
	// (NH query heads, NKV key/value heads of hd), SwiGLU, grouped-query
	// attention and its decoding.
	const NKV, hd, pos0 = 2, C / NH, 5
	const ldq = (NH + 2*NKV) * hd
	rw := c.randn(C, 1)
	c.compare("RMSNormForward", 1e-5, func(be kernels.Backend, a args) {
		be.RMSNormForward(a.f(0), a.f(1), a.f(2), a.f(3), N, C, 1e-5)
	}, outs{c.zeros(N * C), c.zeros(N)}, ins{x, rw})
	rrstd := make([]float32, N)
	c.c.RMSNormForward(make([]float32, N*C), rrstd, x, rw, N, C, 1e-5)
	c.compare("RMSNormBackward", 1e-5, func(be kernels.Backend, a args) {
		be.RMSNormBackward(a.f(0), a.f(1), a.f(2), a.f(3), a.f(4), a.f(5), N, C)
	}, outs{c.randn(N*C, 1), c.randn(C, 1)}, ins{dout, x, rw, rrstd})
	table := make([]float32, (pos0+T)*hd)
	kernels.RoPE{Theta: 500000, Scaling: &kernels.RoPEScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 32}}.Table(table, pos0+T, hd)
	gqkv := c.randn(N*ldq, 1)
	c.compare("RoPEForward", 1e-5, func(be kernels.Backend, a args) {
		be.RoPEForward(a.f(0), a.f(1), a.f(2), B, T, ldq, NH+NKV, hd, pos0)
	}, outs{c.zeros(N * ldq)}, ins{gqkv, table})
	c.compare("RoPEBackward in place", 1e-5, func(be kernels.Backend, a args) {
		be.RoPEBackward(a.f(0), a.f(0), a.f(1), B, T, ldq, NH+NKV, hd, pos0)
	}, outs{c.randn(N*ldq, 1)}, ins{table})
	gu := c.randn(N*2*F, 2)
	c.compare("SwiGLUForward", 1e-5, func(be kernels.Backend, a args) { be.SwiGLUForward(a.f(0), a.f(1), N, F) },
		outs{c.zeros(N * F)}, ins{gu})
	c.compare("SwiGLUBackward", 1e-5, func(be kernels.Backend, a args) { be.SwiGLUBackward(a.f(0), a.f(1), a.f(2), N, F) },
		outs{c.zeros(N * 2 * F)}, ins{gu, c.randn(N*F, 1)})
	for _, d := range []kernels.Dropout{{}, {P: 0.1, Key: drop.Key, Heads: 2 * NH, Head0: NH}} {
		name := fmt.Sprintf("GQA NKV=%d p=%g heads=%d", NKV, d.P, d.Heads)
		c.compare(name+" forward", attnTol(d), func(be kernels.Backend, a args) {
			att := kernels.Float32s(be, kernels.AttentionFloats(be, B, NH, T))
			be.GQAForward(a.f(0), att, a.f(1), B, T, NH, NKV, hd, d, 12345)
			kernels.Sync(be)
			kernels.Free(be, att)
		}, outs{c.zeros(N * C)}, ins{gqkv})
		da := c.randn(N*C, 1)
		c.compare(name+" backward", attnTol(d), func(be kernels.Backend, a args) {
			att := kernels.Float32s(be, kernels.AttentionFloats(be, B, NH, T))
			out := kernels.Float32s(be, N*C)
			be.GQAForward(out, att, a.f(1), B, T, NH, NKV, hd, d, 12345)
			be.GQABackward(a.f(0), a.f(2), out, a.f(1), att, B, T, NH, NKV, hd, d, 12345)
			kernels.Sync(be)
			kernels.Free(be, att)
			kernels.Free(be, out)
		}, outs{c.zeros(N * ldq)}, ins{gqkv, da})
	}
	// Head size 128 (Llama's), grouped: under bf16 the hs-128 flash kernels.
	{
		const nh, nkv, hd2 = 2, 1, C / 2
		const ld2 = (nh + 2*nkv) * hd2
		q2, da2 := c.randn(N*ld2, 1), c.randn(N*C, 1)
		name := fmt.Sprintf("GQA hs=%d NKV=%d p=0", hd2, nkv)
		c.compare(name+" forward", attnTol(kernels.Dropout{}), func(be kernels.Backend, a args) {
			att := kernels.Float32s(be, kernels.AttentionFloats(be, B, nh, T))
			be.GQAForward(a.f(0), att, a.f(1), B, T, nh, nkv, hd2, kernels.Dropout{}, 12345)
			kernels.Sync(be)
			kernels.Free(be, att)
		}, outs{c.zeros(N * C)}, ins{q2})
		c.compare(name+" backward", attnTol(kernels.Dropout{}), func(be kernels.Backend, a args) {
			att := kernels.Float32s(be, kernels.AttentionFloats(be, B, nh, T))
			out := kernels.Float32s(be, N*C)
			be.GQAForward(out, att, a.f(1), B, T, nh, nkv, hd2, kernels.Dropout{}, 12345)
			be.GQABackward(a.f(0), a.f(2), out, a.f(1), att, B, T, nh, nkv, hd2, kernels.Dropout{}, 12345)
			kernels.Sync(be)
			kernels.Free(be, att)
			kernels.Free(be, out)
		}, outs{c.zeros(N * ld2)}, ins{q2, da2})
	}
	c.compare("GQADecode", 1e-5, func(be kernels.Backend, a args) {
		be.GQADecode(a.f(0), a.f(1), a.f(2), a.f(3), B, pos, maxT, NH, NKV, hd)
	}, outs{c.zeros(B * C)}, ins{c.randn(B*C, 1), c.randn(B*maxT*NKV*hd, 1), c.randn(B*maxT*NKV*hd, 1)})

	// Context parallelism's ring attention on the grouped-query qkv: rank 0
	// of a ring of 2 folds its own block, then rank 1's, and takes both
	// back (rows = 2·B·c, c positions a chunk).
	const cpN, cpc = 2, 16
	const rrows, kvw = 2 * B * cpc, 2 * NKV * hd
	rqkv, rkv1, rdout := c.randn(rrows*ldq, 1), c.randn(rrows*kvw, 1), c.randn(rrows*C, 1)
	ringForward := func(be kernels.Backend, out, lse, qkv, kv1 []float32) {
		kv0, st := kernels.Float32s(be, rrows*kvw), kernels.Float32s(be, rrows*NH*2)
		be.RingKV(kv0, qkv, rrows, NH, NKV, hd)
		be.RingAttentionForward(out, st, qkv, kv0, B, cpc, NH, NKV, hd, cpN, 0, 0, true)
		be.RingAttentionForward(out, st, qkv, kv1, B, cpc, NH, NKV, hd, cpN, 0, 1, false)
		be.RingAttentionFinish(out, lse, st, rrows, NH, hd)
		kernels.Sync(be)
		kernels.Free(be, kv0)
		kernels.Free(be, st)
	}
	c.compare("RingAttention forward", 1e-5, func(be kernels.Backend, a args) {
		ringForward(be, a.f(0), a.f(1), a.f(2), a.f(3))
	}, outs{c.zeros(rrows * C), c.zeros(rrows * NH)}, ins{rqkv, rkv1})
	c.compare("RingAttention backward", 1e-5, func(be kernels.Backend, a args) {
		dqkv, dkv1, qkv, kv1, dout := a.f(0), a.f(1), a.f(2), a.f(3), a.f(4)
		out, lse := kernels.Float32s(be, rrows*C), kernels.Float32s(be, rrows*NH)
		ringForward(be, out, lse, qkv, kv1)
		kv0, dkv0, delta := kernels.Float32s(be, rrows*kvw), kernels.Float32s(be, rrows*kvw), kernels.Float32s(be, rrows*NH)
		be.Zero(dqkv)
		be.RingAttentionDelta(delta, dout, out, rrows, NH, hd)
		be.RingKV(kv0, qkv, rrows, NH, NKV, hd)
		be.RingAttentionBackward(dqkv, dkv0, dout, qkv, kv0, lse, delta, B, cpc, NH, NKV, hd, cpN, 0, 0)
		be.RingAttentionBackward(dqkv, dkv1, dout, qkv, kv1, lse, delta, B, cpc, NH, NKV, hd, cpN, 0, 1)
		be.RingKVGrad(dqkv, dkv0, rrows, NH, NKV, hd)
		kernels.Sync(be)
		for _, b := range [][]float32{out, lse, kv0, dkv0, delta} {
			kernels.Free(be, b)
		}
	}, outs{c.zeros(rrows * ldq), c.zeros(rrows * kvw)}, ins{rqkv, rkv1, rdout})

	// The residual add fused with the norm after it.
	c.compare("ResidualLayerNormForward", 1e-5, func(be kernels.Backend, a args) {
		be.ResidualLayerNormForward(a.f(0), a.f(1), a.f(2), a.f(3), a.f(4), a.f(5), a.f(6), a.f(7), N, C)
	}, outs{c.zeros(N * C), c.zeros(N * C), c.zeros(N), c.zeros(N)}, ins{x, dout, lw, lb})
	c.compare("ResidualRMSNormForward", 1e-5, func(be kernels.Backend, a args) {
		be.ResidualRMSNormForward(a.f(0), a.f(1), a.f(2), a.f(3), a.f(4), a.f(5), N, C, 1e-5)
	}, outs{c.zeros(N * C), c.zeros(N * C), c.zeros(N)}, ins{x, dout, rw})

	// Elementwise.
	h := c.randn(N*F, 2)
	c.compare("GeluForward", 1e-6, func(be kernels.Backend, a args) { be.GeluForward(a.f(0), a.f(1)) }, outs{c.zeros(N * F)}, ins{h})
	hg := make([]float32, N*F)
	c.c.GeluForward(hg, h)
	c.compare("GeluBackward", 1e-5, func(be kernels.Backend, a args) { be.GeluBackward(a.f(0), a.f(1), a.f(2), a.f(3)) },
		outs{c.zeros(N * F)}, ins{h, hg, dmm})
	c.compare("ResidualForward", 0, func(be kernels.Backend, a args) { be.ResidualForward(a.f(0), a.f(1), a.f(2)) },
		outs{c.zeros(N * C)}, ins{x, dout})
	c.compare("DropoutForward", 0, func(be kernels.Backend, a args) { be.DropoutForward(a.f(0), a.f(1), drop, 999) },
		outs{c.zeros(N * C)}, ins{x})
	c.compare("DropoutBackward in place", 0, func(be kernels.Backend, a args) { be.DropoutBackward(a.f(0), a.f(0), drop, 5) },
		outs{c.randn(N*C, 1)}, ins{})
	c.compare("Scale", 0, func(be kernels.Backend, a args) { be.Scale(a.f(0), 0.37) }, outs{c.randn(N*C, 1)}, ins{})
	c.compare("Zero", 0, func(be kernels.Backend, a args) { be.Zero(a.f(0)) }, outs{c.randn(N*C+3, 1)}, ins{})

	// Classifier: fused, and vocabulary-parallel in three kernels, over
	// logits (N,Vp) of which the first V columns are real (the padding's
	// gradient 0).
	logits, targets := c.randn(N*Vp, 3), tok(N, V)
	c.compare("CrossEntropy", 1e-5, func(be kernels.Backend, a args) {
		be.CrossEntropy(a.f(0), a.f(1), a.i(0), N, V, Vp, 1.0/N, true)
	}, outs{c.zeros(N), slices.Clone(logits)}, ins{}, ints{targets})
	c.compare("ClassifierMax", 0, func(be kernels.Backend, a args) { be.ClassifierMax(a.f(0), a.f(1), N, V, Vp) },
		outs{c.zeros(N)}, ins{logits})
	maxes := make([]float32, N)
	c.c.ClassifierMax(maxes, logits, N, V, Vp)
	c.compare64("ClassifierExp", 1e-9, func(be kernels.Backend, st []float64, a args) {
		be.ClassifierExp(st, a.f(0), a.i(0), a.f(1), N, V, Vp, 300)
	}, 2*N, ins{logits, maxes}, ints{targets})
	stats := make([]float64, 2*N)
	c.c.ClassifierExp(stats, logits, targets, maxes, N, V, Vp, 300)
	c.compare("ClassifierFinish", 1e-5, func(be kernels.Backend, a args) {
		st := kernels.Float64s(be, 2*N)
		kernels.Upload(be, st, stats)
		be.ClassifierFinish(a.f(0), a.f(1), a.i(0), a.f(2), st, N, V, Vp, 300, 1.0/N, true)
		kernels.Sync(be)
		kernels.Free(be, st)
	}, outs{c.zeros(N), slices.Clone(logits)}, ins{maxes}, ints{targets})

	// Optimizer and norm.
	const P = 100003
	c.compare("AdamW", 1e-6, func(be kernels.Backend, a args) {
		be.AdamW(a.f(0), a.f(3), a.f(1), a.f(2), 6e-4, 0.9, 0.95, 1e-8, 0.1, 0.5, 7)
	}, outs{c.randn(P, 0.02), c.randn(P, 0.01), c.abs(c.randn(P, 0.001))}, ins{c.randn(P, 0.1)})
	sq := c.randn(P, 1)
	c.compare64("Sum", 1e-12, func(be kernels.Backend, out []float64, a args) { be.Sum(out, a.f(0), 0.25) }, 1, ins{sq}, nil)
	c.compare64("SumSquares", 1e-12, func(be kernels.Backend, out []float64, a args) {
		be.SumSquares(out, a.f(0), 1)
		be.SumSquares(out, a.f(0)[:P/2], 0.5) // a second tensor adds to the same double
	}, 1, ins{sq}, nil)

	// Copies on the device, and the tensor-parallel loss's row maxima.
	c.compare("Copy", 0, func(be kernels.Backend, a args) { be.Copy(a.f(0), a.f(1)) }, outs{c.zeros(P)}, ins{sq})
	gmax := c.randn(4*N, 3)
	gmax[7] = float32(math.Inf(-1))
	c.compare("ClassifierGlobalMax", 0, func(be kernels.Backend, a args) { be.ClassifierGlobalMax(a.f(0), a.f(1), N, 4) },
		outs{c.zeros(N)}, ins{gmax})

	if err := g.Sync(); err != nil {
		c.failed = append(c.failed, err.Error())
	}
	fmt.Fprintf(w, "kernels: %d checks, %d failed\n", c.n, len(c.failed))
	if len(c.failed) > 0 {
		return fmt.Errorf("kernel checks failed: %v", c.failed)
	}
	return nil
}

// checker runs one method on both backends and compares the outputs.
type checker struct {
	g      *cuda.Backend
	c      *cpu.Backend
	w      io.Writer
	rng    *rand.Rand
	n      int
	failed []string
}

type (
	outs []([]float32) // buffers the method writes (their initial values are inputs too)
	ins  []([]float32) // buffers it reads
	ints []([]int32)
)

// args are one backend's copies of the buffers: outputs first, then inputs.
type args struct {
	fs [][]float32
	is [][]int32
}

func (a args) f(i int) []float32 { return a.fs[i] }
func (a args) i(i int) []int32   { return a.is[i] }

func (c *checker) randn(n int, std float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(c.rng.NormFloat64() * std)
	}
	return x
}

func (c *checker) zeros(n int) []float32 { return make([]float32, n) }

func (c *checker) abs(x []float32) []float32 {
	for i, v := range x {
		x[i] = float32(math.Abs(float64(v)))
	}
	return x
}

// compare calls run on the CPU backend with copies of the buffers and on
// the GPU with GPU copies, then compares every output buffer.
func (c *checker) compare(name string, tol float64, run func(kernels.Backend, args), o outs, in ins, is ...ints) {
	var iv ints
	if len(is) > 0 {
		iv = is[0]
	}
	mk := func(be kernels.Backend) args {
		var a args
		for _, x := range append(append([][]float32{}, o...), in...) {
			y := kernels.Float32s(be, len(x))
			kernels.Upload(be, y, x)
			a.fs = append(a.fs, y)
		}
		for _, x := range iv {
			y := kernels.Int32s(be, len(x))
			kernels.Upload(be, y, x)
			a.is = append(a.is, y)
		}
		return a
	}
	ca, ga := mk(c.c), mk(c.g)
	run(c.c, ca)
	run(c.g, ga)
	got := make([][]float32, len(o))
	var err error
	for k := range o {
		got[k] = make([]float32, len(ga.f(k)))
		err = errors.Join(err, c.g.Download(got[k], ga.f(k)))
	}
	for k := range o {
		label := name
		if len(o) > 1 {
			label = fmt.Sprintf("%s out%d", name, k)
		}
		if err != nil {
			c.report(label, math.Inf(1), math.Inf(1), tol)
			c.failed = append(c.failed, fmt.Sprintf("%s: %v", label, err))
			continue
		}
		rel, mx := diff(got[k], ca.f(k))
		c.report(label, rel, mx, tol)
	}
	for _, x := range ga.fs {
		c.g.Free(x)
	}
	for _, x := range ga.is {
		c.g.Free(x)
	}
}

// compare64 is compare for one float64 output of n elements.
func (c *checker) compare64(name string, tol float64, run func(kernels.Backend, []float64, args), n int, in ins, is ints) {
	var outsBy [2][]float64
	for k, be := range []kernels.Backend{c.c, c.g} {
		var a args
		for _, x := range in {
			y := kernels.Float32s(be, len(x))
			kernels.Upload(be, y, x)
			a.fs = append(a.fs, y)
		}
		for _, x := range is {
			y := kernels.Int32s(be, len(x))
			kernels.Upload(be, y, x)
			a.is = append(a.is, y)
		}
		st := kernels.Float64s(be, n)
		run(be, st, a)
		outsBy[k] = make([]float64, n)
		if err := kernels.Download(be, outsBy[k], st); err != nil {
			c.failed = append(c.failed, fmt.Sprintf("%s: %v", name, err))
		}
		kernels.Free(be, st)
		for _, x := range a.fs {
			kernels.Free(be, x)
		}
		for _, x := range a.is {
			kernels.Free(be, x)
		}
	}
	var num, den, mx float64
	for i := range outsBy[0] {
		d := outsBy[1][i] - outsBy[0][i]
		num += d * d
		den += outsBy[0][i] * outsBy[0][i]
		mx = max(mx, math.Abs(d))
	}
	c.report(name, math.Sqrt(num/max(den, 1e-300)), mx, tol)
}

func diff(got, want []float32) (rel, maxAbs float64) {
	var num, den float64
	for i := range want {
		d := float64(got[i]) - float64(want[i])
		if math.IsNaN(d) {
			return math.NaN(), math.NaN()
		}
		num += d * d
		den += float64(want[i]) * float64(want[i])
		maxAbs = max(maxAbs, math.Abs(d))
	}
	if den == 0 {
		return math.Sqrt(num), maxAbs
	}
	return math.Sqrt(num / den), maxAbs
}

func (c *checker) report(name string, rel, mx, tol float64) {
	c.n++
	verdict := "PASS"
	if !(rel <= tol) {
		verdict = "FAIL"
		c.failed = append(c.failed, name)
	}
	fmt.Fprintf(c.w, "%-4s %-44s rel %.2e  max %.2e  (tol %.0e)\n", verdict, name, rel, mx, tol)
}
