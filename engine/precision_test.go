package engine

import (
	"bytes"
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/presets"
)

// TestLossScaleIsExact: a power-of-two loss scale changes no bit of the
// update, so fp16's loss scaling on the CPU backend (which computes in
// fp32) reproduces the fp32 run exactly, step for step.
func TestLossScaleIsExact(t *testing.T) {
	base := []string{smallVocab, "Engine.max_steps=4", "Model.hidden_dropout_prob=0", "Model.attention_probs_dropout_prob=0", "Engine.log_dir=" + t.TempDir()}
	_, want := trainPreset(t, "tiny", append(base, "Engine.mix_precision.dtype=fp32")...)
	tr, got := trainPreset(t, "tiny", append(base, "Engine.mix_precision.dtype=fp16", "Engine.mix_precision.scale_loss=32768")...)
	if tr.scaler == nil || tr.scaler.skipped != 0 {
		t.Fatalf("fp16 run: scaler %+v, want one with no skipped step", tr.scaler)
	}
	for i := range want.Losses {
		if got.Losses[i] != want.Losses[i] {
			t.Errorf("step %d: loss %.9g with loss scale 32768, %.9g in fp32", i, got.Losses[i], want.Losses[i])
		}
	}
}

// TestLossScaleOverflowSkips: a scale past float32's range overflows the
// gradients; those steps are skipped (parameters untouched), logged and
// counted, the scale backs off, and training goes on with finite losses.
func TestLossScaleOverflowSkips(t *testing.T) {
	cfg, err := presets.Load("tiny", []string{"Engine.save_load.output_dir=" + t.TempDir(), smallVocab, "Engine.max_steps=6", "Engine.logging_freq=1", "Engine.mix_precision.dtype=fp16",
		"Engine.mix_precision.scale_loss=1e39", "Engine.log_dir=" + t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	tr, err := NewTrainer(cfg, cpu.New(), Options{Stdout: &out, Builtin: corpusFor(cfg)})
	if err != nil {
		t.Fatal(err)
	}
	before := append([]float32(nil), tr.Model.Params...)
	// The first step overflows (1e39 is +Inf in float32): nothing moves.
	tr.log = &runLog{out: &out} // Run opens the files; a step called alone logs here
	if _, _, _, err := tr.trainStep(context.Background(), 0, 1e-3, tr.newBatch()); err != nil {
		t.Fatal(err)
	}
	for i := range before {
		if tr.Model.Params[i] != before[i] {
			t.Fatalf("parameter %d changed in a skipped step", i)
		}
	}
	if tr.scaler.skipped != 1 || tr.scaler.Scale() != 5e38 {
		t.Fatalf("after one overflow: skipped %d, scale %g; want 1, 5e38", tr.scaler.skipped, tr.scaler.Scale())
	}
	res, err := tr.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	log := out.String()
	if tr.scaler.skipped < 2 || !strings.Contains(log, "[amp] gradient overflow") || !strings.Contains(log, "skipped_steps: ") {
		t.Fatalf("skipped %d steps; log:\n%s", tr.scaler.skipped, log)
	}
	if tr.scaler.Scale() >= 1e39 {
		t.Errorf("scale %g did not back off", tr.scaler.Scale())
	}
	for i, l := range res.Losses {
		if math.IsNaN(float64(l)) || math.IsInf(float64(l), 0) {
			t.Errorf("step %d: loss %v", i, l)
		}
	}
	t.Logf("skipped %d of %d steps, loss scale now %g", tr.scaler.skipped, len(res.Losses)+1, tr.scaler.Scale())
}

// TestCPUBF16Tiny: tiny trained for 40 steps with bf16 matmuls on the CPU
// (cpu.Options.BF16: bf16 GEMM inputs, fp32 accumulation, master weights
// and optimizer) stays within 2% of the fp32 run's loss at every step, and
// is not the fp32 run. On a CPU without AVX512_BF16, cpu.Open refuses and
// names the missing feature.
func TestCPUBF16Tiny(t *testing.T) {
	be, err := cpu.Open(cpu.Options{BF16: true})
	var fe *cpu.FeatureError
	if errors.As(err, &fe) {
		if fe.Feature == "" || !strings.Contains(err.Error(), fe.Feature) {
			t.Errorf("cpu.Open(BF16): %v, want the missing feature named", err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if testing.Short() {
		t.Skip("trains tiny for 40 steps twice, in fp32 (the run TestTrainTinyLossFalls checks) and in bf16 (about 12 s)")
	}
	want, _, _ := tinyFP32(t)
	cfg, err := presets.Load("tiny", append([]string{"Engine.save_load.output_dir=" + t.TempDir()}, append(slices.Clone(tinyOverrides), "Engine.mix_precision.dtype=bf16", "Engine.log_dir="+t.TempDir())...))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTrainer(cfg, be, Options{Builtin: builtin})
	if err != nil {
		t.Fatal(err)
	}
	got, err := tr.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Losses) != len(want.Losses) {
		t.Fatalf("%d bf16 steps, %d fp32 steps", len(got.Losses), len(want.Losses))
	}
	same, worst := true, 0.0
	for i, w := range want.Losses {
		e := math.Abs(float64(got.Losses[i]-w)) / float64(w)
		worst = max(worst, e)
		if e > 0.02 {
			t.Errorf("step %d: bf16 loss %.6f, fp32 %.6f: %.2f%% apart, want ≤ 2%%", i, got.Losses[i], w, 100*e)
		}
		same = same && got.Losses[i] == w
	}
	if same {
		t.Error("bf16 losses equal the fp32 ones bit for bit: the matmuls did not run in bf16")
	}
	n := len(got.Losses)
	t.Logf("%d steps: final loss bf16 %.6f, fp32 %.6f; worst step %.3f%% apart", n, got.Losses[n-1], want.Losses[n-1], 100*worst)
}
