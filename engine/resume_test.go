package engine

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gptui/gptui/badinput"
	"github.com/gptui/gptui/engine/checkpoint"

	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/presets"
)

func trainTiny(t *testing.T, overrides ...string) (*Trainer, *Result) {
	t.Helper()
	base := []string{smallVocab, "Engine.eval_freq=0", "Engine.logging_freq=1", "Engine.log_dir=" + t.TempDir(),
		"Model.hidden_dropout_prob=0.1", "Model.attention_probs_dropout_prob=0.1",
		"Data.Train.dataset.shuffle=true", "Optimizer.lr.decay_steps=20", "Global.micro_batch_size=4"}
	return trainPreset(t, "tiny", append(base, overrides...)...)
}

// TestExactResume: 20 steps straight and 10 + resume + 10 give the same
// losses and the same weights and moments, bit for bit, with dropout on,
// shuffled data and gradient accumulation.
func TestExactResume(t *testing.T) {
	straight, rs := trainTiny(t, "Engine.max_steps=20")
	out := t.TempDir()
	_, r1 := trainTiny(t, "Engine.max_steps=10", "Engine.save_load.save_steps=5", "Engine.save_load.output_dir="+out)
	if want := filepath.Join(out, "step_00000010"); r1.Checkpoint != want {
		t.Fatalf("first half saved %q, want %q", r1.Checkpoint, want)
	}
	resumed, r2 := trainTiny(t, "Engine.max_steps=20", "Engine.save_load.ckpt_dir=auto", "Engine.save_load.output_dir="+out)
	got := append(slices.Clone(r1.Losses), r2.Losses...)
	if !slices.Equal(got, rs.Losses) {
		t.Errorf("losses differ:\nstraight %v\nresumed  %v", rs.Losses, got)
	}
	if !slices.Equal(resumed.Model.Params, straight.Model.Params) {
		t.Error("final weights differ")
	}
	if !slices.Equal(resumed.Opt.M, straight.Opt.M) || !slices.Equal(resumed.Opt.V, straight.Opt.V) {
		t.Error("final AdamW moments differ")
	}
	// The resumed run writes its checkpoints as the run it resumed: one
	// identity, drawn when the first half started.
	c1, err := checkpoint.Load(r1.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := checkpoint.Load(r2.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	if c1.Manifest.Run == "" || c2.Manifest.Run != c1.Manifest.Run || c2.Manifest.Step != 20 {
		t.Errorf("runs: step %d %q, step %d %q; want one run, not empty", c1.Manifest.Step, c1.Manifest.Run, c2.Manifest.Step, c2.Manifest.Run)
	}
	// The log names the checkpoint it resumed from.
	log, _ := os.ReadFile(filepath.Join(resumed.Cfg.Engine.LogDir, "workerlog.0"))
	if !strings.Contains(string(log), "resumed from "+r1.Checkpoint+" at step 10") {
		t.Errorf("log does not name the checkpoint resumed from:\n%s", log)
	}
}

// TestResumeShapeMismatch names the keys where config and checkpoint differ.
func TestResumeShapeMismatch(t *testing.T) {
	out := t.TempDir()
	trainTiny(t, "Engine.max_steps=1", "Engine.save_load.save_steps=1", "Engine.save_load.output_dir="+out)
	cfg, err := presets.Load("tiny", []string{smallVocab, "Model.hidden_size=32", "Engine.save_load.ckpt_dir=auto", "Engine.save_load.output_dir=" + out, "Engine.log_dir=" + t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewTrainer(cfg, cpu.New(), Options{Builtin: corpusFor(cfg)})
	if err == nil || !strings.Contains(err.Error(), "Model.hidden_size=32 (checkpoint 64)") || !errors.Is(err, badinput.Err) {
		t.Fatalf("err = %v, want a user error naming Model.hidden_size", err)
	}
}

// TestResumeSkipsDamaged: with the newest checkpoint damaged, auto resume
// falls back to the one before and says so.
func TestResumeSkipsDamaged(t *testing.T) {
	out := t.TempDir()
	trainTiny(t, "Engine.max_steps=4", "Engine.save_load.save_steps=2", "Engine.save_load.output_dir="+out)
	f := filepath.Join(out, "step_00000004", "rank_00000.safetensors")
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 1
	os.WriteFile(f, b, 0o644)
	cfg, _ := presets.Load("tiny", []string{smallVocab, "Engine.max_steps=4", "Engine.save_load.ckpt_dir=auto", "Engine.save_load.output_dir=" + out, "Engine.log_dir=" + t.TempDir(), "Global.micro_batch_size=4", "Optimizer.lr.decay_steps=20"})
	tr, err := NewTrainer(cfg, cpu.New(), Options{Builtin: corpusFor(cfg)})
	if err != nil {
		t.Fatal(err)
	}
	if tr.start != 2 {
		t.Errorf("resumed at step %d, want 2", tr.start)
	}
	if w := strings.Join(tr.warnings, "\n"); !strings.Contains(w, "step_00000004") {
		t.Errorf("warnings %q do not name the damaged checkpoint", w)
	}
}

// TestInitFromCheckpoint: Model.init_from a checkpoint directory loads its
// weights and nothing else (step 0, fresh moments).
func TestInitFromCheckpoint(t *testing.T) {
	out := t.TempDir()
	first, _ := trainTiny(t, "Engine.max_steps=2", "Engine.save_load.save_steps=2", "Engine.save_load.output_dir="+out)
	cfg, err := presets.Load("tiny", []string{"Engine.save_load.output_dir=" + t.TempDir(), smallVocab, "Model.init_from=" + filepath.Join(out, "step_00000002"), "Engine.log_dir=" + t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTrainer(cfg, cpu.New(), Options{Builtin: corpusFor(cfg)})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tr.Model.Params, first.Model.Params) || tr.start != 0 || tr.Opt.Step != 0 {
		t.Errorf("init_from: weights equal %v, start %d, adam step %d; want true, 0, 0", slices.Equal(tr.Model.Params, first.Model.Params), tr.start, tr.Opt.Step)
	}
}

// TestRunIdentity: a run from step 0 into an output directory holding
// another run's checkpoints is refused, naming that run's newest
// checkpoint and the ways out, and writes nothing; with force it trains
// beside them; and a resume restricted to a run (save_load.run, what a
// job's restart sets) takes that run's newest checkpoint, passing over
// the other run's newer one, with the uninterrupted losses.
func TestRunIdentity(t *testing.T) {
	out := t.TempDir()
	_, a := trainTiny(t, "Engine.max_steps=20", "Engine.save_load.save_steps=20", "Engine.save_load.output_dir="+out)
	ca, err := checkpoint.Load(a.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(a.Checkpoint, checkpoint.ManifestFile))

	// Another model into the same folder: refused, bad input.
	cfg, err := presets.Load("llama-tiny", []string{smallVocab, "Engine.max_steps=10", "Engine.save_load.save_steps=5", "Engine.save_load.output_dir=" + out, "Engine.log_dir=" + t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewTrainer(cfg, cpu.New(), Options{Builtin: smallTokens})
	if err == nil || !errors.Is(err, badinput.Err) {
		t.Fatalf("llama-tiny from step 0 into tiny's output_dir: %v, want a refusal (bad input)", err)
	}
	for _, want := range []string{"step_00000020", "of run " + ca.Manifest.Run[:12], "--resume", "Engine.save_load.output_dir=DIR", "--force"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not name %q", err, want)
		}
	}
	if after, _ := os.ReadFile(filepath.Join(a.Checkpoint, checkpoint.ManifestFile)); !slices.Equal(before, after) {
		t.Error("the refused run changed the other run's checkpoint")
	}

	// With force, a second run of tiny trains beside it to step 10 (its
	// own steps 5 and 10), and a resume of that run takes its step 10,
	// not the first run's step 20.
	_, b := trainTiny(t, "Engine.max_steps=10", "Engine.save_load.save_steps=5", "Engine.save_load.output_dir="+out,
		"Engine.save_load.force=true", "Global.seed=7")
	cb, err := checkpoint.Load(b.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	if cb.Manifest.Run == ca.Manifest.Run {
		t.Fatal("the forced run took the first run's identity")
	}
	// The first run saved last (latest names its step 20): a resume of
	// the folder would take it; the second run's resume must not.
	if err := os.WriteFile(filepath.Join(out, checkpoint.LatestFile), []byte("step_00000020\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if c, _, err := checkpoint.Latest(out); err != nil || c.Manifest.Run != ca.Manifest.Run {
		t.Fatalf("the folder's newest: %v %v; want the first run's step 20", c, err)
	}
	_, straight := trainTiny(t, "Engine.max_steps=15", "Global.seed=7")
	resumed, r := trainTiny(t, "Engine.max_steps=15", "Engine.save_load.output_dir="+out, "Engine.save_load.ckpt_dir=auto",
		"Engine.save_load.run="+cb.Manifest.Run, "Global.seed=7")
	if resumed.start != 10 {
		t.Fatalf("the run's resume started at step %d, want its own step 10 (not the other run's 20)", resumed.start)
	}
	if !slices.Equal(r.Losses, straight.Losses[10:]) {
		t.Errorf("steps 10-14 after the resume %v, uninterrupted %v", r.Losses, straight.Losses[10:])
	}
	if !strings.Contains(strings.Join(resumed.warnings, "\n"), "step_00000020") {
		t.Errorf("warnings %q do not name the other run's checkpoint passed over", resumed.warnings)
	}
}
