package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/event"
)

// TestResumeSchedule: the lr schedule is part of the checkpoint. small
// trains 4 steps with decay_steps derived from max_steps (4); resuming
// with max_steps 8 would derive 8 and change the schedule in mid-run: it
// is refused in one line naming the key. With decay_steps set to 8 the
// resume says how the schedule changes, and the lr of each step it trains
// equals that of a run with decay_steps 8 from the start. A checkpoint
// written before the schedule was kept resumes as before, deriving it
// from the config, and says so.
func TestResumeSchedule(t *testing.T) {
	dir := t.TempDir()
	// Each run logs to dir/LOG and saves to dir/LOG-out: the runs from
	// step 0 (log1, ref) need an output folder each.
	args := func(log string, more ...string) []string {
		return append(append(append([]string{"train"}, small(t)...), "-o", "Engine.eval_freq=0", "-o", "Engine.logging_freq=1",
			"-o", "Optimizer.lr.warmup_rate=0.25", "-o", "Engine.log_dir="+filepath.Join(dir, log),
			"-o", "Engine.save_load.output_dir="+filepath.Join(dir, log+"-out")), more...)
	}
	if code, out, e := runCLI(t, args("log1", "-o", "Engine.max_steps=4", "-o", "Engine.save_load.save_steps=4")...); code != 0 {
		t.Fatalf("train: exit %d\n%s\n%s", code, out, e)
	}
	ckpt := filepath.Join(dir, "log1-out", "step_00000004")
	resume := func(log string, more ...string) (int, string, string) {
		return runCLI(t, args(log, append([]string{"-o", "Engine.max_steps=8", "-o", "Engine.save_load.ckpt_dir=" + ckpt}, more...)...)...)
	}

	code, out, e := resume("log2")
	lines := strings.Split(strings.TrimSpace(e), "\n")
	if code != 2 || len(lines) != 1 || strings.Contains(out, "[train] ") {
		t.Fatalf("resume with a larger max_steps: exit %d; want 2, one line and no training\n%s\n%s", code, out, e)
	}
	for _, w := range []string{"gptui: Optimizer.lr.decay_steps: checkpoint " + ckpt + " was trained with 4; left unset, it is now derived from Engine.max_steps as 8",
		"-o Optimizer.lr.decay_steps=4 to keep the schedule", "-o Optimizer.lr.decay_steps=8 to change it"} {
		if !strings.Contains(lines[0], w) {
			t.Errorf("the error %q lacks %q", lines[0], w)
		}
	}

	code, out, e = resume("log3", "-o", "Optimizer.lr.decay_steps=8")
	if w := "[checkpoint] the lr schedule changes from " + ckpt + "'s, as the config sets it: Optimizer.lr.decay_steps 4 → 8, warmup 1 → 2 steps"; code != 0 || !strings.Contains(out, w) {
		t.Fatalf("resume with decay_steps set: exit %d, want 0 and %q\n%s\n%s", code, w, out, e)
	}
	if code, out, e := runCLI(t, args("ref", "-o", "Engine.max_steps=8", "-o", "Optimizer.lr.decay_steps=8")...); code != 0 {
		t.Fatalf("the run with decay_steps 8 from the start: exit %d\n%s\n%s", code, out, e)
	}
	ref := metricsLR(t, filepath.Join(dir, "ref"))
	compareLR(t, metricsLR(t, filepath.Join(dir, "log3")), ref)

	// A checkpoint of before: no schedule in its data state.
	man := filepath.Join(ckpt, checkpoint.ManifestFile)
	b, err := os.ReadFile(man)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	var st map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil || json.Unmarshal(m["data"], &st) != nil || st["schedule"] == nil {
		t.Fatalf("the manifest's data holds no schedule: %s", m["data"])
	}
	delete(st, "schedule")
	m["data"], _ = json.Marshal(st)
	delete(m, "manifest_sha256") // sealed anew below, as gptui would have
	b, _ = json.Marshal(m)
	if err := os.WriteFile(man, checkpoint.Seal(b), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, e = resume("log4")
	if w := "[checkpoint] " + ckpt + " records no lr schedule (it was written before gptui kept one): the schedule is derived from this run's config, as before"; code != 0 || !strings.Contains(out, w) {
		t.Fatalf("resume from a checkpoint without a schedule: exit %d, want 0 and %q\n%s\n%s", code, w, out, e)
	}
	compareLR(t, metricsLR(t, filepath.Join(dir, "log4")), ref)
}

// metricsLR returns the lr of each step in rank 0's metrics file in dir.
func metricsLR(t *testing.T, dir string) map[int]float64 {
	t.Helper()
	b, err := os.ReadFile(event.MetricsFile(dir, 0))
	if err != nil {
		t.Fatal(err)
	}
	lr := map[int]float64{}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if m, ok := event.DecodeMetrics(line); ok {
			lr[m.Step] = m.LR
		}
	}
	return lr
}

// compareLR checks that the resumed run trained steps 4 to 7, each with
// the lr of ref.
func compareLR(t *testing.T, got, ref map[int]float64) {
	t.Helper()
	for s := 4; s < 8; s++ {
		if g, ok := got[s]; !ok || g != ref[s] {
			t.Errorf("step %d: lr %v (logged: %v), %v in the run with decay_steps 8 from the start", s, g, ok, ref[s])
		}
	}
	if len(got) != 4 {
		t.Errorf("the resumed run logged steps %v, want 4 to 7", got)
	}
}
