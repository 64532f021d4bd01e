package engine

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/kernels/cpu"
)

// benchStep times one forward, backward and AdamW update of a model
// shape, edit (if not nil) adjusting the model first.
func benchStep(b *testing.B, shape ModelConfig, B, T int, edit func(*Model)) {
	be := cpu.New()
	m, err := NewModel(be, shape, 0.02, 1)
	if err != nil {
		b.Fatal(err)
	}
	if edit != nil {
		edit(m)
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
	benchStep(b, ModelConfig{Shape: arch.Shape{MaxT: 256, V: 50257, Vp: 50304, L: 2, NH: 4, C: 64, F: 256}}, 8, 64, nil)
}

// BenchmarkStepGPT2 is GPT-2 124M at B=4, T=64, the llm.c CPU comparison.
func BenchmarkStepGPT2(b *testing.B) {
	benchStep(b, ModelConfig{Shape: arch.Shape{MaxT: 1024, V: 50257, Vp: 50304, L: 12, NH: 12, C: 768, F: 3072}}, 4, 64, nil)
}

// BenchmarkHeadChunks times the step of a model whose head dominates it
// (the tiny preset's shape, hidden 64 against a 50,304-wide vocabulary;
// B=16, T=256) with the head's logits in one chunk of 4,096 rows and in
// the four chunks of arch.MinHeadRows its rule gives: the cost of reading
// and writing the head's weight gradient once a chunk.
func BenchmarkHeadChunks(b *testing.B) {
	shape := ModelConfig{Shape: arch.Shape{MaxT: 256, V: 50257, Vp: 50304, L: 2, NH: 4, C: 64, F: 256}}
	const B, T = 16, 256
	for _, tc := range []struct {
		name   string
		chunks int
	}{{"one chunk", 1}, {"four chunks", 4}} {
		b.Run(tc.name, func(b *testing.B) {
			benchStep(b, shape, B, T, func(m *Model) {
				m.ensureActs(B, T)
				if n := m.scratch.headRows; n != B*T/4 {
					b.Fatalf("the rule gives chunks of %d rows, want %d", n, B*T/4)
				}
				if tc.chunks == 1 { // the whole batch's logits, as before the chunks
					m.scratch.logits, m.scratch.headRows = make([]float32, B*T*m.dims.Vpl), B*T
				}
			})
		})
	}
}
