package arch

import (
	"math"
	"testing"
)

// TestTensorSlices: under tensor parallelism every rank's slice of a split
// tensor is an mp-th of the global tensor — but a Llama's qkvw when mp
// exceeds its key/value heads, which holds a whole key and value head a
// rank (KVWidth), each alike on KVCopies ranks — and a tensor that is not
// split is held whole; a block's tensor holds the part's layers.
func TestTensorSlices(t *testing.T) {
	gpt := Shape{MaxT: 64, V: 500, Vp: 512, L: 8, NH: 8, C: 64, F: 256}
	llama := Shape{Family: Llama, MaxT: 64, V: 500, Vp: 512, L: 8, NH: 8, NKV: 2, C: 64, F: 96}
	untied := llama
	untied.Untied = true
	for _, s := range []Shape{gpt, llama, untied} {
		for _, mp := range []int{1, 2, 4, 8} {
			p := Part{MP: mp, Layers: 2, Embed: true, Head: true}
			for _, ts := range s.Tensors(p) {
				global := int64(1)
				for _, d := range ts.Global {
					global *= int64(d)
				}
				if ts.Layered {
					if ts.Shape[0] != p.Layers || ts.Global[0] != s.L {
						t.Errorf("%v mp %d: %s %v of %v: want %d of the %d layers", s.Family, mp, ts.Name, ts.Shape, ts.Global, p.Layers, s.L)
					}
					global = global / int64(s.L) * int64(p.Layers)
				}
				want := global
				if ts.Split {
					want = global / int64(mp)
					if ts.Name == "qkvw" && s.KVCopies(mp) > 1 {
						// mp ranks hold NKV heads' keys and values
						// KVCopies times each.
						hd := int64(s.C / s.NH)
						want = (global + 2*hd*int64(s.C)*int64(mp-s.KVHeads())*int64(p.Layers)) / int64(mp)
					}
				} else if mp > 1 && (ts.Name == "wte" || ts.Name == "lmhead" || len(ts.Shape) > 2) { // the vocabulary and the matrices
					t.Errorf("%v mp %d: %s is not split", s.Family, mp, ts.Name)
				}
				if got := ts.Size(); got != want {
					t.Errorf("%v mp %d: %s %v holds %d elements, want %d", s.Family, mp, ts.Name, ts.Shape, got, want)
				}
			}
		}
	}
	if w, c := llama.KVWidth(4), llama.KVCopies(4); w != 8 || c != 2 {
		t.Errorf("Llama, 2 key/value heads of 8 channels, mp 4: width %d on %d copies, want 8 on 2", w, c)
	}
	if w, c := llama.KVWidth(2), llama.KVCopies(2); w != 8 || c != 1 {
		t.Errorf("Llama, 2 key/value heads of 8 channels, mp 2: width %d on %d copies, want 8 on 1", w, c)
	}
	if w, c := gpt.KVWidth(4), gpt.KVCopies(4); w != 16 || c != 1 {
		t.Errorf("GPT-2, 64 channels, mp 4: key width %d on %d copies, want 16 on 1", w, c)
	}
}

// TestPartParams: the stages of a pipeline hold the whole model and, tied,
// the last stage's copy of the token embedding; a part without blocks or
// ends holds nothing.
func TestPartParams(t *testing.T) {
	gpt := Shape{MaxT: 64, V: 500, Vp: 512, L: 8, NH: 8, C: 64, F: 256}
	llama := Shape{Family: Llama, MaxT: 64, V: 500, Vp: 512, L: 8, NH: 8, NKV: 2, C: 64, F: 96}
	untied := llama
	untied.Untied = true
	for _, s := range []Shape{gpt, llama, untied} {
		for _, pp := range []int{1, 2, 4, 8} {
			var sum int64
			for st := range pp {
				sum += s.PartParams(s.Stage(1, pp, st))
			}
			want := s.Params()
			if pp > 1 && s.Tied() {
				want += int64(s.Vp * s.C)
			}
			if sum != want {
				t.Errorf("%v pp %d: the stages hold %d parameters, want %d", s.Family, pp, sum, want)
			}
		}
		if n := s.PartParams(Part{MP: 2}); n != 0 {
			t.Errorf("%v: an empty part holds %d parameters", s.Family, n)
		}
	}
}

// TestParamBoundHostile: ParamBound of sizes no model has is +Inf, and of
// sizes that are zero or negative a number, without a panic or an int
// overflow.
func TestParamBoundHostile(t *testing.T) {
	for _, s := range []Shape{
		{MaxT: 1 << 62, Vp: 128, L: 1, NH: 1, C: 1, F: 1},
		{Vp: 128, L: 1, NH: 1, C: math.MaxInt, F: 1},
		{Family: Llama, Vp: 128, L: 1, NH: 2, NKV: 1 << 61, C: 1 << 30, F: 1},
		{Vp: 128, L: 1, NH: 1, C: math.MinInt, F: 1},
	} {
		if b := s.ParamBound(); !math.IsInf(b, 1) {
			t.Errorf("%+v: bound %g, want +Inf", s, b)
		}
	}
	for _, s := range []Shape{{}, {Family: Llama}, {Vp: -128, L: -1, NH: -2, C: 8, F: -3, MaxT: -1}, {Family: Llama, NH: -2, NKV: -1, C: 8, L: 1, Vp: 128, F: 1}} {
		if b := s.ParamBound(); math.IsInf(b, 0) || math.IsNaN(b) {
			t.Errorf("%+v: bound %g, want a number", s, b)
		}
	}
	if b := (Shape{MaxT: 1 << 40, Vp: 128, L: 1, NH: 1, C: 1, F: 1}).ParamBound(); b < 1<<40 {
		t.Errorf("2⁴⁰ positions: bound %g", b)
	}
}
