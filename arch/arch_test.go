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
