package engine

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/kernels/ref"
)

var testShape = ModelConfig{Shape: arch.Shape{MaxT: 8, V: 37, Vp: 128, L: 2, NH: 2, C: 8, F: 32}}

// refLoss is the whole model's forward in float64, composed of the reference
// layers, with no dropout: the mean cross-entropy of targets.
func refLoss(c ModelConfig, ts []Tensor, p []float64, inputs, targets []int32, B, T int) float64 {
	w := map[string][]float64{}
	for _, t := range ts {
		w[t.Name] = p[t.Offset : t.Offset+t.Size]
	}
	lay := func(name string, l, n int) []float64 { return w[name][l*n : (l+1)*n] }
	N, C, F := B*T, c.C, c.F
	x := ref.Encoder(inputs, w["wte"], w["wpe"], B, T, C)
	for l := 0; l < c.L; l++ {
		h := ref.LayerNorm(x, lay("ln1w", l, C), lay("ln1b", l, C), N, C)
		qkv := ref.Matmul(h, lay("qkvw", l, 3*C*C), lay("qkvb", l, 3*C), N, C, 3*C)
		a := ref.Attention(qkv, B, T, C, c.NH, 0, nil)
		x = ref.Add(x, ref.Matmul(a, lay("attprojw", l, C*C), lay("attprojb", l, C), N, C, C))
		h = ref.LayerNorm(x, lay("ln2w", l, C), lay("ln2b", l, C), N, C)
		f := ref.Gelu(ref.Matmul(h, lay("fcw", l, F*C), lay("fcb", l, F), N, C, F))
		x = ref.Add(x, ref.Matmul(f, lay("fcprojw", l, C*F), lay("fcprojb", l, C), N, F, C))
	}
	x = ref.LayerNorm(x, w["lnfw"], w["lnfb"], N, C)
	logits := ref.Matmul(x, w["wte"][:c.V*C], nil, N, C, c.V)
	var s float64
	for _, l := range ref.CrossEntropy(logits, targets, N, c.V) {
		s += l
	}
	return s / float64(N)
}

func randomBatch(r *rand.Rand, n, V int) ([]int32, []int32) {
	in, tg := make([]int32, n), make([]int32, n)
	for i := range in {
		in[i], tg[i] = int32(r.IntN(V)), int32(r.IntN(V))
	}
	return in, tg
}

// randomize gives every parameter a non-trivial value (LayerNorm weights
// away from 1, biases non-zero) so that every path carries gradient.
func randomize(m *Model, r *rand.Rand) {
	for i := range m.Params {
		m.Params[i] = float32(r.NormFloat64() * 0.3)
	}
	for _, t := range m.Tensors {
		if t.Name == "ln1w" || t.Name == "ln2w" || t.Name == "lnfw" {
			for i := t.Offset; i < t.Offset+t.Size; i++ {
				m.Params[i] += 1
			}
		}
	}
}

// TestModelGradient checks the whole model's backward against a float64
// numerical gradient of the float64 reference model, for every tensor.
func TestModelGradient(t *testing.T) {
	be := cpu.New()
	m, err := NewModel(be, testShape, 0.02, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 1))
	randomize(m, r)
	B, T := 2, 5
	in, tg := randomBatch(r, B*T, testShape.V)

	m.ZeroGrad()
	loss := trainPass(t, m, in, tg, B, T, DropoutKey{}, 1/float32(B*T))
	p64 := ref.To64(m.Params)
	want := refLoss(m.Cfg, m.Tensors, p64, in, tg, B, T)
	if d := float64(loss) - want; d > 1e-5 || d < -1e-5 {
		t.Fatalf("loss %.7f, float64 reference %.7f", loss, want)
	}
	phi := func() float64 { return refLoss(m.Cfg, m.Tensors, p64, in, tg, B, T) }
	for _, ts := range m.Tensors {
		// Up to 40 evenly spread elements of each tensor, padded rows excluded.
		size := ts.Size
		if ts.Name == "wte" {
			size = testShape.V * testShape.C
		}
		var idx []int
		for i := 0; i < size; i += max(1, size/40) {
			idx = append(idx, ts.Offset+i)
		}
		got := make([]float32, len(idx))
		num := make([]float64, len(idx))
		for k, i := range idx {
			got[k] = m.Grads[i]
			v := p64[i]
			p64[i] = v + 1e-5
			fp := phi()
			p64[i] = v - 1e-5
			fm := phi()
			p64[i] = v
			num[k] = (fp - fm) / 2e-5
		}
		if e := ref.RelErr(got, num); !(e < 1e-3) {
			t.Errorf("%s: gradient relative error %.3g, want < 1e-3", ts.Name, e)
		}
	}
	// Padded vocabulary rows never receive gradient.
	for i := testShape.V * testShape.C; i < testShape.Vp*testShape.C; i++ {
		if m.Grads[i] != 0 {
			t.Fatalf("padded wte element %d has gradient %v", i, m.Grads[i])
		}
	}
}

// TestRecomputeIsExact: with dropout on, every recompute policy gives the
// same loss and the same gradients, bit for bit, and keeps fewer bytes —
// where the head computes its logits in one chunk under each, as it does
// at this size (the chunks follow the policy: TestHeadChunks).
func TestRecomputeIsExact(t *testing.T) {
	shape := testShape
	shape.HiddenDropout, shape.AttnDropout = 0.1, 0.1
	B, T := 3, 8
	r := rand.New(rand.NewPCG(2, 2))
	in, tg := randomBatch(r, B*T, shape.V)
	type run struct {
		loss  float32
		grads []float32
		bytes int
	}
	do := func(rc Recompute) run {
		m, err := NewModel(cpu.New(), shape, 0.02, 7)
		if err != nil {
			t.Fatal(err)
		}
		m.SetRecompute(rc)
		m.ZeroGrad()
		var loss float32
		for micro := 0; micro < 2; micro++ {
			ps := DropoutKey{Step: 3, Sample: micro * B}
			loss += trainPass(t, m, in, tg, B, T, ps, 1/float32(2*B*T))
		}
		return run{loss, slices.Clone(m.Grads), m.ActivationBytes(B, T)}
	}
	base := do(RecomputeNone)
	for _, rc := range []Recompute{RecomputeOnlyAttn, RecomputeFull} {
		got := do(rc)
		if got.loss != base.loss {
			t.Errorf("recompute %d: loss %v, want %v", rc, got.loss, base.loss)
		}
		if !slices.Equal(got.grads, base.grads) {
			t.Errorf("recompute %d: gradients differ from no recompute", rc)
		}
		if got.bytes >= base.bytes {
			t.Errorf("recompute %d keeps %d bytes, not fewer than %d", rc, got.bytes, base.bytes)
		}
	}
}

// TestDropoutDependsOnSamplesNotSplit: one micro-batch of 4 samples and two
// of 2 draw the same dropout masks, so accumulation does not change results.
func TestDropoutDependsOnSamplesNotSplit(t *testing.T) {
	shape := testShape
	shape.HiddenDropout, shape.AttnDropout = 0.2, 0.2
	T := 6
	r := rand.New(rand.NewPCG(3, 3))
	in, tg := randomBatch(r, 4*T, shape.V)
	whole, _ := NewModel(cpu.New(), shape, 0.02, 5)
	whole.ZeroGrad()
	lw := trainPass(t, whole, in, tg, 4, T, DropoutKey{Step: 1}, 1/float32(4*T))
	split, _ := NewModel(cpu.New(), shape, 0.02, 5)
	split.ZeroGrad()
	var ls float32
	for k := 0; k < 2; k++ {
		ps := DropoutKey{Step: 1, Sample: 2 * k}
		ls += trainPass(t, split, in[2*k*T:(2*k+2)*T], tg[2*k*T:(2*k+2)*T], 2, T, ps, 1/float32(4*T)) / 2
	}
	if d := lw - ls; d > 1e-5 || d < -1e-5 {
		t.Errorf("loss %v whole vs %v split", lw, ls)
	}
	if e := ref.RelErr(split.Grads, ref.To64(whole.Grads)); e > 1e-5 {
		t.Errorf("gradients differ between one and two micro-batches: %.3g", e)
	}
}

func TestScheduleLR(t *testing.T) {
	s := Schedule{MaxLR: 1e-3, MinLR: 1e-4, Warmup: 10, DecaySteps: 110}
	tests := []struct {
		step int
		want float64
	}{
		{0, 1e-4}, {4, 5e-4}, {9, 1e-3}, {10, 1e-3}, {60, 5.5e-4}, {110, 1e-4}, {500, 1e-4},
	}
	for _, tc := range tests {
		if got := s.LR(tc.step); got-tc.want > 1e-12 || tc.want-got > 1e-12 {
			t.Errorf("LR(%d) = %g, want %g", tc.step, got, tc.want)
		}
	}
	c := Schedule{MaxLR: 1e-4, MinLR: 1e-4, DecaySteps: 10}
	for step := 0; step < 20; step++ {
		if c.LR(step) != 1e-4 {
			t.Fatalf("constant schedule LR(%d) = %g", step, c.LR(step))
		}
	}
}

func TestLayoutMatchesLLMC(t *testing.T) {
	// Offsets of llm.c's GPT-2 124M (V=50257, Vp=50304, maxT=1024, L=12, C=768).
	ts, n := Tensors(ModelConfig{Shape: arch.Shape{MaxT: 1024, V: 50257, Vp: 50304, L: 12, NH: 12, C: 768, F: 3072}})
	if n != 124475904 {
		t.Errorf("GPT-2 124M with padded vocabulary: %d parameters, want 124475904", n)
	}
	names := []string{"wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"}
	for i, tn := range ts {
		if tn.Name != names[i] {
			t.Errorf("tensor %d is %s, want %s", i, tn.Name, names[i])
		}
	}
}

// TestLayoutCountsShape: the tensors the engine lays out are the
// parameters package arch counts (which the planner and the FLOPs per
// token use), for shapes with F ≠ 4C and odd sizes.
func TestLayoutCountsShape(t *testing.T) {
	for _, s := range []arch.Shape{testShape.Shape, {MaxT: 5, V: 130, Vp: 256, L: 1, NH: 3, C: 6, F: 10}, {MaxT: 1024, V: 50257, Vp: 50304, L: 24, NH: 16, C: 1024, F: 4096}} {
		if _, n := Tensors(ModelConfig{Shape: s}); int64(n) != s.Params() {
			t.Errorf("%+v: Layout lays out %d parameters, arch counts %d", s, n, s.Params())
		}
	}
}

// trainPass runs the forward and backward pass of one micro-batch of a
// model of one process (no communication to fail) and returns its loss.
func trainPass(t testing.TB, m *Model, in, tg []int32, B, T int, ps DropoutKey, dscale float32) float32 {
	t.Helper()
	ctx := context.Background()
	loss, err := m.Forward(ctx, in, tg, B, T, ps, dscale)
	if err == nil {
		err = m.Backward(ctx, ps, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	return loss
}

// TestHeadChunks: the head cut into chunks of rows (classify) gives the
// loss of one chunk bit for bit — each row's loss is its own — and the
// gradients within fp32 rounding of it (the weights' product is summed
// chunk by chunk), for GPT-2 and an untied Llama, with a chunk that
// divides the rows and one that does not.
func TestHeadChunks(t *testing.T) {
	llama := ModelConfig{Shape: arch.Shape{MaxT: 16, V: 97, Vp: 128, L: 2, NH: 4, C: 32, F: 48, Family: arch.Llama, NKV: 2, Untied: true}, NormEps: 1e-5, RoPE: kernels.RoPE{Theta: 10000}}
	for _, tc := range []struct {
		name  string
		shape ModelConfig
	}{{"gpt2", testShape}, {"llama untied", llama}} {
		B, T := 3, 8
		in, tg := randomBatch(rand.New(rand.NewPCG(4, 4)), B*T, tc.shape.V)
		do := func(rows int) (float32, []float32, int) {
			m, err := NewModel(cpu.New(), tc.shape, 0.02, 7)
			if err != nil {
				t.Fatal(err)
			}
			m.maxHeadRows = rows
			m.ZeroGrad()
			loss := trainPass(t, m, in, tg, B, T, DropoutKey{Step: 1}, 1/float32(B*T))
			return loss, slices.Clone(m.Grads), m.headChunk()
		}
		lw, gw, n := do(0)
		if n != B*T {
			t.Fatalf("%s: %d rows a chunk for %d rows: want one chunk", tc.name, n, B*T)
		}
		for _, rows := range []int{6, 5, 1} {
			l, g, n := do(rows)
			if n != rows {
				t.Fatalf("%s: %d rows a chunk, want %d", tc.name, n, rows)
			}
			if l != lw {
				t.Errorf("%s, chunks of %d rows: loss %v, one chunk's %v", tc.name, rows, l, lw)
			}
			if e := ref.RelErr(g, ref.To64(gw)); e > 1e-6 {
				t.Errorf("%s, chunks of %d rows: gradients %.3g from one chunk's (relative L2), want within 1e-6", tc.name, rows, e)
			} else {
				t.Logf("%s, chunks of %d rows: gradients %.3g from one chunk's", tc.name, rows, e)
			}
		}
	}
}
