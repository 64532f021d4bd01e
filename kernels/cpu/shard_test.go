package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gptui/gptui/kernels"
)

// The tensor-parallel kernels, run on the pieces of a split tensor and
// combined as the engine combines them, give what the whole-tensor kernels
// give.

func TestEncoderShardSumsToWhole(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(3, 4))
	B, T, C, V := 2, 3, 4, 10
	inp := []int32{0, 9, 4, 5, 5, 1}
	wte, wpe := randn(r, V*C, 1), randn(r, T*C, 1)
	dout := randn(r, B*T*C, 1)
	want := make([]float32, B*T*C)
	be.EncoderForward(want, inp, wte, wpe, B, T, C)
	wdte, wdpe := make([]float32, V*C), make([]float32, T*C)
	be.EncoderBackward(wdte, wdpe, dout, inp, B, T, C)

	got := make([]float32, B*T*C)
	part := make([]float32, B*T*C)
	gdte := make([]float32, V*C)
	for k, vlo := range []int{0, 5} { // two ranks, five rows each
		pe := wpe
		if k > 0 {
			pe = nil // only the first rank adds positions
		}
		be.EncoderShardForward(part, inp, wte[vlo*C:(vlo+5)*C], vlo, pe, B, T, C)
		for i := range got {
			got[i] += part[i]
		}
		gdpe := make([]float32, T*C)
		be.EncoderShardBackward(gdte[vlo*C:(vlo+5)*C], vlo, gdpe, dout, inp, B, T, C)
		if !equal(gdpe, wdpe) {
			t.Errorf("rank %d: dwpe differs from the whole's", k)
		}
	}
	if !equal(got, want) {
		t.Errorf("summed shard embeddings %v, want %v", got[:4], want[:4])
	}
	if !equal(gdte, wdte) {
		t.Error("shard dwte differs from the whole's")
	}
}

func TestClassifierShardMatchesWhole(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(5, 6))
	N, V := 5, 13
	logits := randn(r, N*V, 3)
	targets := []int32{0, 12, 6, 7, 3}
	const dscale = 0.5
	wantL := make([]float32, N)
	wantG := append([]float32(nil), logits...)
	be.CrossEntropy(wantL, wantG, targets, N, V, V, dscale, true)

	// Ranks hold columns [0,7) and [7,13) — and a third rank none.
	splits := [][2]int{{0, 7}, {7, 13}, {13, 13}}
	pieces := make([][]float32, len(splits))
	maxes := make([]float32, N)
	for i := range maxes {
		maxes[i] = float32(math.Inf(-1))
	}
	for k, s := range splits {
		w := s[1] - s[0]
		pieces[k] = make([]float32, N*w)
		for rr := 0; rr < N; rr++ {
			copy(pieces[k][rr*w:(rr+1)*w], logits[rr*V+s[0]:rr*V+s[1]])
		}
		m := make([]float32, N)
		be.ClassifierMax(m, pieces[k], N, w, w)
		for i := range m {
			maxes[i] = max(maxes[i], m[i])
		}
	}
	stats := make([]float64, 2*N)
	for k, s := range splits {
		st := make([]float64, 2*N)
		be.ClassifierExp(st, pieces[k], targets, maxes, N, s[1]-s[0], s[1]-s[0], s[0])
		for i := range st {
			stats[i] += st[i]
		}
	}
	for k, s := range splits {
		w := s[1] - s[0]
		losses := make([]float32, N)
		be.ClassifierFinish(losses, pieces[k], targets, maxes, stats, N, w, w, s[0], dscale, true)
		for i := range losses {
			if d := math.Abs(float64(losses[i] - wantL[i])); d > 1e-5*math.Abs(float64(wantL[i]))+1e-6 {
				t.Errorf("rank %d row %d: loss %v, whole %v", k, i, losses[i], wantL[i])
			}
		}
		for rr := 0; rr < N; rr++ {
			for j := 0; j < w; j++ {
				g, want := pieces[k][rr*w+j], wantG[rr*V+s[0]+j]
				if math.Abs(float64(g-want)) > 1e-6 {
					t.Fatalf("rank %d grad[%d,%d] = %v, whole %v", k, rr, s[0]+j, g, want)
				}
			}
		}
	}
}

func TestAttentionHeadsSplitDropout(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(7, 8))
	B, T, NH, hs := 2, 5, 4, 3
	C := NH * hs
	qkv := randn(r, B*T*3*C, 1)
	d := kernels.Dropout{P: 0.3, Key: kernels.SiteKey(9)}
	const off = 7 * 4 * 5 * 5 // some sample offset · NH·T·T
	out := make([]float32, B*T*C)
	att := make([]float32, B*NH*T*T)
	be.AttentionForward(out, att, qkv, B, T, C, NH, d, off)
	// Two ranks of two heads each: their q, k, v columns packed as the
	// column-parallel QKV projection lays them out.
	for k := 0; k < 2; k++ {
		Cl := C / 2
		loc := make([]float32, B*T*3*Cl)
		for bt := 0; bt < B*T; bt++ {
			for j := 0; j < 3; j++ {
				copy(loc[bt*3*Cl+j*Cl:bt*3*Cl+(j+1)*Cl], qkv[bt*3*C+j*C+k*Cl:bt*3*C+j*C+(k+1)*Cl])
			}
		}
		dl := d
		dl.Heads, dl.Head0 = NH, k*2
		o := make([]float32, B*T*Cl)
		be.AttentionForward(o, make([]float32, B*2*T*T), loc, B, T, Cl, 2, dl, off)
		for bt := 0; bt < B*T; bt++ {
			for j := 0; j < Cl; j++ {
				if g, w := o[bt*Cl+j], out[bt*C+k*Cl+j]; math.Abs(float64(g-w)) > 1e-6 {
					t.Fatalf("rank %d: out[%d,%d] = %v, whole %v", k, bt, j, g, w)
				}
			}
		}
	}
}

func equal(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
