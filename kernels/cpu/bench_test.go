package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkSgemm times the GEMMs of the GPT-2 124M MLP's first linear layer
// (768 → 3072) at B·T = 256 rows, forward and backward, on each GEMM path,
// and reports GFLOP/s. Run with
//
//	go test ./kernels/cpu -run XXX -bench Sgemm -benchtime 20x
func BenchmarkSgemm(b *testing.B) {
	const N, C, OC = 256, 768, 3072
	shapes := []struct {
		name           string
		transA, transB bool
		m, n, k        int
		beta           float32
	}{
		{"fwd-out=inp·wT", false, true, N, OC, C, 0},    // (256×768)·(3072×768)ᵀ
		{"bwd-dinp=dout·w", false, false, N, C, OC, 0},  // (256×3072)·(3072×768)
		{"bwd-dw+=doutT·inp", true, false, OC, C, N, 1}, // (256×3072)ᵀ·(256×768)
		{"square-1024", false, false, 1024, 1024, 1024, 0},
	}
	for _, path := range []struct {
		name string
		be   *Backend
	}{
		{"blas", newBackend(config{})},
		{"go", newBackend(config{blas: "go"})},
	} {
		name, be := path.name, path.be
		if name == "blas" && be.blas == nil {
			b.Logf("no BLAS: %s", be.FallbackReason())
			continue
		}
		for _, sh := range shapes {
			b.Run(fmt.Sprintf("%s/%s/%dx%dx%d", name, sh.name, sh.m, sh.n, sh.k), func(b *testing.B) {
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
				b.ResetTimer()
				for b.Loop() {
					be.Sgemm(sh.transA, sh.transB, sh.m, sh.n, sh.k, 1, a, lda, bm, ldb, sh.beta, c, sh.n)
				}
				flops := 2 * float64(sh.m) * float64(sh.n) * float64(sh.k) * float64(b.N)
				b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkMeasurePeak reports what MeasureSgemmFLOPS(1024) returns on
// each path; the time per operation is that of the whole measurement. Run
// with
//
//	go test ./kernels/cpu -run XXX -bench MeasurePeak -benchtime 3x
func BenchmarkMeasurePeak(b *testing.B) {
	for name, be := range map[string]*Backend{"blas": newBackend(config{}), "go": newBackend(config{blas: "go"})} {
		if be.blas == nil && name == "blas" {
			continue
		}
		b.Run(name, func(b *testing.B) {
			var f float64
			for b.Loop() {
				f = be.MeasureSgemmFLOPS(1024)
			}
			b.ReportMetric(f/1e9, "GFLOP/s")
			b.Logf("%s: MeasureSgemmFLOPS(1024) = %.1f GFLOP/s", be.BLAS(), f/1e9)
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
