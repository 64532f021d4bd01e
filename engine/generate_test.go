package engine

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
)

// TestGenerateKVCacheMatchesRecompute: greedy decoding with the key/value
// cache gives, token for token, what re-running the whole sequence gives —
// for GPT-2 and for Llamas whose cache holds their grouped key/value
// heads (NKV·hd channels a position, not C): 2 of 4 heads, untied, with
// Llama 3's rotary scaling, and 1 of 4 heads, tied.
func TestGenerateKVCacheMatchesRecompute(t *testing.T) {
	gpt2 := arch.Shape{MaxT: 80, V: 97, Vp: 128, L: 2, NH: 4, C: 32, F: 128}
	llama := arch.Shape{MaxT: 80, V: 97, Vp: 128, L: 2, NH: 4, C: 32, F: 48, Family: arch.Llama}
	gqa2, mqa := llama, llama
	gqa2.NKV, gqa2.Untied = 2, true
	mqa.NKV = 1
	scaled := kernels.RoPE{Theta: 500000, Scaling: &kernels.RoPEScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 16}}
	for _, tc := range []struct {
		name  string
		shape ModelConfig
	}{
		{"gpt2", ModelConfig{Shape: gpt2}},
		{"llama nkv2 untied", ModelConfig{Shape: gqa2, NormEps: 1e-5, RoPE: scaled}},
		{"llama nkv1", ModelConfig{Shape: mqa, NormEps: 1e-5, RoPE: kernels.RoPE{Theta: 10000}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkKVCache(t, tc.shape)
		})
	}
}

// checkKVCache generates 64 tokens greedily after three prompts with the
// cache, then token by token from the whole sequence, and compares.
func checkKVCache(t *testing.T, shape ModelConfig) {
	m, err := NewModel(cpu.New(), shape, 0.02, 3)
	if err != nil {
		t.Fatal(err)
	}
	randomize(m, rand.New(rand.NewPCG(6, 6)))
	prompts := [][]int{{5, 17, 3}, {42}, {1, 2, 3, 4, 5, 6, 7, 8}}
	const n = 64
	got, err := m.Generate(context.Background(), prompts, SampleOptions{MaxNewTokens: n}, nil)
	if err != nil {
		t.Fatal(err)
	}
	distinct := map[int]bool{}
	for b, p := range prompts {
		seq := append([]int(nil), p...)
		for i := 0; i < n; i++ {
			in := make([]int32, len(seq))
			for j, v := range seq {
				in[j] = int32(v)
			}
			logits := logitsOf(t, m, in, 1, len(seq))
			last := logits[(len(seq)-1)*shape.V : len(seq)*shape.V]
			want := sample(last, SampleOptions{}, nil, nil)
			if got[b][i] != want {
				t.Fatalf("prompt %d token %d: cache gives %d, recompute %d", b, i, got[b][i], want)
			}
			distinct[want] = true
			seq = append(seq, want)
		}
	}
	// A model stuck on one token would agree trivially.
	if len(distinct) < 10 {
		t.Errorf("%d distinct tokens generated: want a model whose choices depend on the context", len(distinct))
	}
}

func TestSampleOptions(t *testing.T) {
	logits := []float32{0, 5, 1, 4.9, -3}
	r := rand.New(rand.NewPCG(1, 2))
	probs := make([]float64, len(logits))
	if got := sample(logits, SampleOptions{}, r, probs); got != 1 {
		t.Errorf("greedy = %d, want 1", got)
	}
	seen := map[int]int{}
	for i := 0; i < 2000; i++ {
		seen[sample(logits, SampleOptions{Temperature: 1, TopK: 2}, r, probs)]++
	}
	if len(seen) != 2 || seen[1] == 0 || seen[3] == 0 {
		t.Errorf("top-k 2 drew %v, want only tokens 1 and 3", seen)
	}
	clear(seen)
	for i := 0; i < 2000; i++ {
		seen[sample(logits, SampleOptions{Temperature: 1, TopP: 0.3}, r, probs)]++
	}
	if len(seen) != 1 || seen[1] != 2000 {
		t.Errorf("top-p 0.3 drew %v, want only token 1", seen)
	}
}

// logitsOf runs m on inputs (B,T) without dropout and returns the logits
// (B,T,V) of every position, the real vocabulary's (Model.Logits: the
// device's logits are (B,T,Vp), the padding masked).
func logitsOf(t *testing.T, m *Model, inputs []int32, B, T int) []float32 {
	t.Helper()
	logits, err := m.Logits(context.Background(), inputs, B, T)
	if err != nil {
		t.Fatal(err)
	}
	return logits
}
