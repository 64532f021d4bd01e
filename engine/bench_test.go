package engine

import (
	"github.com/gptui/gptui/arch"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gptui/gptui/kernels/cpu"
)

// benchStep times one forward, backward and AdamW update of a model shape.
func benchStep(b *testing.B, shape ModelConfig, B, T int) {
	be := cpu.New()
	m, err := NewModel(be, shape, 0.02, 1)
	if err != nil {
		b.Fatal(err)
	}
	opt := NewAdamW(be, AdamWConfig{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}, []Span{{0, 0, m.NumParams()}})
	r := rand.New(rand.NewPCG(1, 1))
	in, tg := randomBatch(r, B*T, shape.V)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m.ZeroGrad()
		trainPass(b, m, in, tg, B, T, DropoutKey{Step: i}, 1/float32(B*T))
		sq := []float64{0}
		be.SumSquares(sq, m.Grads, 1)
		norm := math.Sqrt(sq[0])
		opt.Apply(be, m, m.Params, m.Grads, opt.ClipScale(norm), 1e-4)
	}
	b.ReportMetric(float64(B*T)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkStepTiny is the quickstart preset's shape (B=8, T=64).
func BenchmarkStepTiny(b *testing.B) {
	benchStep(b, ModelConfig{Shape: arch.Shape{MaxT: 256, V: 50257, Vp: 50304, L: 2, NH: 4, C: 64, F: 256}}, 8, 64)
}

// BenchmarkStepGPT2 is GPT-2 124M at B=4, T=64, the llm.c CPU comparison.
func BenchmarkStepGPT2(b *testing.B) {
	benchStep(b, ModelConfig{Shape: arch.Shape{MaxT: 1024, V: 50257, Vp: 50304, L: 12, NH: 12, C: 768, F: 3072}}, 4, 64)
}
