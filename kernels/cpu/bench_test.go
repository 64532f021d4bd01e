package cpu

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// stepShape is one GEMM of the GPT-2 124M training step.
type stepShape struct {
	name           string
	transA, transB bool
	m, n, k        int
	beta           float32
	matmul         bool // a MatmulForward/Backward product (bf16 under Options.BF16), or 1024³
}

// gpt2StepShapes lists the distinct GEMMs of one GPT-2 124M step at
// B=4, T=64 (N = B·T = 256 rows, C = 768, NH = 12, hs = 64, padded vocab
// V = 50304), as MatmulForward/MatmulBackward (matmul.go) and
// AttentionForward/AttentionBackward (attention.go) call them: per layer
// the qkv (C→3C), attention projection (C→C), fc (C→4C) and fc projection
// (4C→C) linears, forward (NT), input gradient (NN) and weight gradient
// (TN, beta 1), the classifier (C→V) the same, and per batch row and head
// the four attention products (T×T×hs and T×hs×T).
func gpt2StepShapes() []stepShape {
	const N, C, V, T, hs = 256, 768, 50304, 64, 64
	var s []stepShape
	for _, l := range []struct {
		name   string
		ic, oc int
	}{{"qkv", C, 3 * C}, {"attproj", C, C}, {"fc", C, 4 * C}, {"fcproj", 4 * C, C}, {"classifier", C, V}} {
		s = append(s,
			stepShape{l.name + "-fwd-NT", false, true, N, l.oc, l.ic, 0, true},
			stepShape{l.name + "-dinp-NN", false, false, N, l.ic, l.oc, 0, true},
			stepShape{l.name + "-dw-TN", true, false, l.oc, l.ic, N, 1, true},
		)
	}
	return append(s,
		stepShape{"att-qk-NT", false, true, T, T, hs, 0, false},
		stepShape{"att-pv-NN", false, false, T, hs, T, 0, false},
		stepShape{"att-dv-TN", true, false, T, hs, T, 0, false},
		stepShape{"square-1024-NN", false, false, 1024, 1024, 1024, 0, true},
	)
}

// BenchmarkGemmStep times each GEMM of the GPT-2 124M B=4 T=64 step (and
// 1024³) on OpenBLAS, the built-in GEMM, its AVX2 kernel (where the best
// is AVX-512) and, on CPUs with AVX512_BF16, the built-in bf16 GEMM (on
// the matmuls' shapes, the ones that run in bf16), alternating them call
// by call so that all see the same machine, and reports each one's median
// rate and the ratios. Run with
//
//	GPTUI_THREADS=2 go test ./kernels/cpu -run XXX -bench GemmStep -benchtime 15x
func BenchmarkGemmStep(b *testing.B) {
	type path struct {
		name string
		be   *Backend
		bf16 bool
	}
	var paths []path
	if be, err := newBackend(config{blas: "openblas", threads: envConfig().threads}); err == nil {
		paths = append(paths, path{"openblas", be, false})
	} else {
		b.Logf("no OpenBLAS: %v", err)
	}
	paths = append(paths, path{"builtin", testBackend(b, config{blas: "go", threads: envConfig().threads}), false})
	if best := fp32Kernels()[0]; best.name != "avx2" && slices.ContainsFunc(fp32Kernels(), func(k *gemmKernel) bool { return k.name == "avx2" }) {
		// What a CPU without AVX-512 gets.
		paths = append(paths, path{"avx2", testBackend(b, config{blas: "go", kernel: "avx2", threads: envConfig().threads}), false})
	}
	if be, err := newBackend(config{blas: "go", threads: envConfig().threads, bf16: true}); err == nil {
		paths = append(paths, path{"bf16", be, true})
	}
	for _, sh := range gpt2StepShapes() {
		b.Run(fmt.Sprintf("%s/%dx%dx%d", sh.name, sh.m, sh.n, sh.k), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			a := randMatrix(r, sh.m*sh.k)
			bm := randMatrix(r, sh.k*sh.n)
			c := randMatrix(r, sh.m*sh.n)
			lda, ldb := sh.k, sh.n
			if sh.transA {
				lda = sh.m
			}
			if sh.transB {
				ldb = sh.k
			}
			paths := slices.DeleteFunc(slices.Clone(paths), func(p path) bool { return p.bf16 && !sh.matmul })
			times := make([][]time.Duration, len(paths))
			run := func(i int) {
				p := paths[i]
				t0 := time.Now()
				if p.bf16 {
					p.be.matmulGemm(sh.transA, sh.transB, sh.m, sh.n, sh.k, a, lda, bm, ldb, sh.beta, c, sh.n)
				} else {
					p.be.Sgemm(sh.transA, sh.transB, sh.m, sh.n, sh.k, 1, a, lda, bm, ldb, sh.beta, c, sh.n)
				}
				times[i] = append(times[i], time.Since(t0))
			}
			for i := range paths { // warm-up: threads, buffers
				run(i)
				times[i] = times[i][:0]
			}
			for b.Loop() {
				for i := range paths {
					run(i)
				}
			}
			flops := 2 * float64(sh.m) * float64(sh.n) * float64(sh.k)
			rate := make(map[string]float64)
			for i, p := range paths {
				slices.Sort(times[i])
				rate[p.name] = flops / times[i][len(times[i])/2].Seconds() / 1e9
				b.ReportMetric(rate[p.name], p.name+"-GFLOP/s")
			}
			if rate["openblas"] > 0 {
				b.ReportMetric(rate["builtin"]/rate["openblas"], "builtin/openblas")
				if rate["avx2"] > 0 {
					b.ReportMetric(rate["avx2"]/rate["openblas"], "avx2/openblas")
				}
			}
			if rate["bf16"] > 0 {
				b.ReportMetric(rate["bf16"]/rate["builtin"], "bf16/builtin")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkMeasurePeak reports what MeasureSgemmFLOPS(1024) and PeakFLOPS
// return on each path. Run with
//
//	go test ./kernels/cpu -run XXX -bench MeasurePeak -benchtime 3x
func BenchmarkMeasurePeak(b *testing.B) {
	cfgs := map[string]config{"openblas": {blas: "openblas"}, "builtin": {blas: "go"}, "bf16": {blas: "go", bf16: true}}
	for name, cfg := range cfgs {
		be, err := newBackend(cfg)
		if err != nil {
			continue
		}
		b.Run(name, func(b *testing.B) {
			var f float64
			for b.Loop() {
				f = be.MeasureSgemmFLOPS(1024)
			}
			b.ReportMetric(f/1e9, "GFLOP/s")
			b.ReportMetric(be.PeakFLOPS()/1e9, "peak-GFLOP/s")
			b.Logf("%s: MeasureSgemmFLOPS(1024) = %.1f GFLOP/s, PeakFLOPS = %.1f GFLOP/s", be.Name(), f/1e9, be.PeakFLOPS()/1e9)
		})
	}
}

func randMatrix(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.Float64()*2 - 1)
	}
	return x
}
