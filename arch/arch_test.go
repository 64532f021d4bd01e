package arch

import "testing"

// TestGPT2Shapes: the counts of GPT-2 124M and 350M are the published
// ones (llm.c's num_parameters with the padded vocabulary: 124,475,904 for
// 124M) and the FLOPs per token follow the formula.
func TestGPT2Shapes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		s      Shape
		params int64
		flops  float64 // at T
		T      int
	}{
		{"124M", Shape{MaxT: 1024, V: 50257, Vp: 50304, L: 12, NH: 12, C: 768, F: 3072}, 124475904, 6*(124475904-1024*768-47*768) + 6*12*768*1024, 1024},
		{"350M", Shape{MaxT: 1024, V: 50257, Vp: 50304, L: 24, NH: 16, C: 1024, F: 4096}, 354871296, 6*(354871296-1024*1024-47*1024) + 6*24*1024*64, 64},
	} {
		if got := tc.s.Params(); got != tc.params {
			t.Errorf("%s: %d parameters, want %d", tc.name, got, tc.params)
		}
		if got := tc.s.ParamBound(); got != float64(tc.params) {
			t.Errorf("%s: bound %g parameters, want %d", tc.name, got, tc.params)
		}
		if got := tc.s.FLOPsPerToken(tc.T); got != tc.flops {
			t.Errorf("%s: %.6g FLOPs per token, want %.6g", tc.name, got, tc.flops)
		}
	}
}

func TestPadVocab(t *testing.T) {
	for _, tc := range []struct{ v, want int }{{0, 0}, {-3, 0}, {1, 128}, {128, 128}, {129, 256}, {50257, 50304}} {
		if got := PadVocab(tc.v); got != tc.want {
			t.Errorf("PadVocab(%d) = %d, want %d", tc.v, got, tc.want)
		}
	}
}

// TestLlamaShapes: a Llama's counts are its tensors' sizes, worked out by
// hand: Llama 3.2 1B's published 1,235,814,400 parameters (vocabulary
// 128256, already a multiple of 128, tied) and a 124M-sized untied Llama,
// and their FLOPs per token.
func TestLlamaShapes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		s      Shape
		params int64
		flops  float64
		T      int
	}{
		{"Llama 3.2 1B", Shape{Family: Llama, MaxT: 131072, V: 128256, Vp: 128256, L: 16, NH: 32, NKV: 8, C: 2048, F: 8192}, 1235814400,
			6*1235814400 + 6*16*2048*2048, 2048},
		// Per block: 2·768 norms, 768·(12+8)·64 q, k, v, 768² o_proj, 3·768·2048 gate, up, down.
		{"124M-sized, untied", Shape{Family: Llama, MaxT: 1024, V: 50257, Vp: 50304, L: 12, NH: 12, NKV: 4, C: 768, F: 2048, Untied: true},
			2*50304*768 + 12*(2*768+768*20*64+768*768+3*768*2048) + 768,
			6*float64(50257*768+12*(2*768+768*20*64+768*768+3*768*2048)+768) + 6*12*768*1024, 1024},
	} {
		if got := tc.s.Params(); got != tc.params {
			t.Errorf("%s: %d parameters, want %d", tc.name, got, tc.params)
		}
		if got := tc.s.ParamBound(); got != float64(tc.params) {
			t.Errorf("%s: bound %g parameters, want %d", tc.name, got, tc.params)
		}
		if got := tc.s.FLOPsPerToken(tc.T); got != tc.flops {
			t.Errorf("%s: %.6g FLOPs per token, want %.6g", tc.name, got, tc.flops)
		}
	}
	g := Shape{L: 1, NH: 2, C: 4, F: 16, NKV: 1, Untied: true}
	if g.KVHeads() != 2 || !g.Tied() {
		t.Errorf("a GPT-2 shape has %d key/value heads, tied %v: want NH and tied, whatever NKV and Untied say", g.KVHeads(), g.Tied())
	}
}
