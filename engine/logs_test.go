package engine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/gptui/gptui/badinput"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/presets"
)

// metricsSteps reads the training records' steps of a metrics file, in order.
func metricsSteps(t *testing.T, file string) []int {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var steps []int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m Metrics
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("%s: line %q: %v", file, sc.Text(), err)
		}
		if m.EvalLoss == 0 {
			steps = append(steps, m.Step)
		}
	}
	return steps
}

// TestResumeKeepsLogs: a run of 4 steps saving every 2, resumed from its
// step-2 checkpoint to 5 steps, leaves one metrics record per step 0..4 and
// a worker log holding all the first run's lines (its steps 2 and 3 after
// the save too: nothing a log said is lost), then the resumed run's.
func TestResumeKeepsLogs(t *testing.T) {
	logs, out := t.TempDir(), t.TempDir()
	first, _ := trainTiny(t, "Engine.max_steps=4", "Engine.save_load.save_steps=2", "Engine.save_load.output_dir="+out, "Engine.log_dir="+logs)
	firstLog, err := os.ReadFile(filepath.Join(logs, "workerlog.0"))
	if err != nil {
		t.Fatal(err)
	}
	ckpt := filepath.Join(out, "step_00000002")
	resumed, _ := trainTiny(t, "Engine.max_steps=5", "Engine.save_load.ckpt_dir="+ckpt, "Engine.save_load.output_dir="+t.TempDir(), "Engine.log_dir="+logs)
	if resumed.start != 2 || first.Cfg.Engine.LogDir != logs {
		t.Fatalf("resumed at step %d in %s; want 2 in %s", resumed.start, first.Cfg.Engine.LogDir, logs)
	}
	if got, want := fmt.Sprint(metricsSteps(t, filepath.Join(logs, "metrics.0.jsonl"))), "[0 1 2 3 4]"; got != want {
		t.Errorf("metrics steps %s, want %s", got, want)
	}
	log, err := os.ReadFile(filepath.Join(logs, "workerlog.0"))
	if err != nil {
		t.Fatal(err)
	}
	// The first run's lines, all of them, unchanged; then the resumed
	// run's, from its [resume] line: steps 2 and 3 twice, 4 once.
	if !bytes.HasPrefix(log, firstLog) {
		t.Errorf("the resumed log does not start with the first run's lines:\n%s", log)
	}
	rest := string(log[len(firstLog):])
	if !strings.Contains(rest, "[resume] resumed from step 2 ("+ckpt+")") {
		t.Errorf("the resumed run's lines lack the [resume] line:\n%s", rest)
	}
	for step, want := range []int{1, 1, 2, 2, 1} {
		if n := strings.Count(string(log), fmt.Sprintf("[train] epoch: 0 step: %d ", step)); n != want {
			t.Errorf("the log has %d [train] lines of step %d, want %d", n, step, want)
		}
	}
	// A fresh run starts the files anew.
	trainTiny(t, "Engine.max_steps=2", "Engine.log_dir="+logs)
	if got := fmt.Sprint(metricsSteps(t, filepath.Join(logs, "metrics.0.jsonl"))); got != "[0 1]" {
		t.Errorf("a fresh run's metrics steps %s, want [0 1]", got)
	}
}

// TestLogsOnFullDisk: with metrics.0.jsonl and workerlog.0 on /dev/full,
// training finishes and saves its checkpoint, each file's failure is said
// once on stderr, and Run ends with both files' errors.
func TestLogsOnFullDisk(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Fatalf("this test needs /dev/full: %v", err)
	}
	logs, out := t.TempDir(), t.TempDir()
	for _, f := range []string{"metrics.0.jsonl", "workerlog.0"} {
		if err := os.Symlink("/dev/full", filepath.Join(logs, f)); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := presets.Load("tiny", []string{"Engine.save_load.output_dir=" + t.TempDir(), smallVocab, "Engine.max_steps=2", "Engine.eval_freq=0", "Engine.logging_freq=1", "Engine.log_dir=" + logs,
		"Engine.save_load.save_steps=2", "Engine.save_load.output_dir=" + out, "Global.micro_batch_size=4"})
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	tr, err := NewTrainer(cfg, cpu.New(), Options{Builtin: corpusFor(cfg), Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		t.Fatal(err)
	}
	res, err := tr.Run(context.Background())
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Run: %v, want ENOSPC", err)
	}
	var lwe *LogWriteError
	if !errors.As(err, &lwe) || !strings.Contains(err.Error(), "metrics.0.jsonl") || !strings.Contains(err.Error(), "workerlog.0") {
		t.Errorf("Run's error %q does not name both files", err)
	}
	if res == nil || len(res.Losses) != 2 || res.Checkpoint != filepath.Join(out, "step_00000002") {
		t.Errorf("result %+v: want 2 steps and the checkpoint step_00000002", res)
	}
	if _, err := os.Stat(filepath.Join(out, "step_00000002")); err != nil {
		t.Errorf("no checkpoint: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if len(lines) != 2 || !strings.Contains(stderr.String(), "no space left on device") {
		t.Errorf("stderr %q: want one line per file, naming ENOSPC", stderr.String())
	}
	if !strings.Contains(stdout.String(), "[train] epoch: 0 step: 1 ") {
		t.Errorf("stdout lacks the last step's line:\n%s", stdout.String())
	}
}

// TestLogDirNotWritable: a log_dir that is a file is a ConfigError naming
// Engine.log_dir, before any step.
func TestLogDirNotWritable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	os.WriteFile(file, nil, 0o644)
	cfg, err := presets.Load("tiny", []string{"Engine.save_load.output_dir=" + t.TempDir(), smallVocab, "Engine.max_steps=1", "Engine.log_dir=" + filepath.Join(file, "logs")})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTrainer(cfg, cpu.New(), Options{Builtin: corpusFor(cfg)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := tr.Run(context.Background())
	if !errors.Is(err, badinput.Err) || !strings.Contains(err.Error(), "Engine.log_dir") || res != nil {
		t.Errorf("Run = %v, %v; want a user error naming Engine.log_dir and no result", res, err)
	}
}

// TestKeepMetrics keeps the records before the resumed step, eval records
// included, and drops a torn last line.
func TestKeepMetrics(t *testing.T) {
	in := "{\"step\":0}\n{\"step\":1}\n{\"step\":1,\"eval_loss\":5}\n{\"step\":2}\n{\"step\":3}\n{\"st"
	for _, c := range []struct {
		start int
		want  string
	}{
		{2, "{\"step\":0}\n{\"step\":1}\n{\"step\":1,\"eval_loss\":5}\n"},
		{1, "{\"step\":0}\n"},
		{9, "{\"step\":0}\n{\"step\":1}\n{\"step\":1,\"eval_loss\":5}\n{\"step\":2}\n{\"step\":3}\n"},
	} {
		if got := string(keepMetrics([]byte(in), c.start)); got != c.want {
			t.Errorf("keepMetrics(start %d) = %q, want %q", c.start, got, c.want)
		}
	}
}

// TestLogFile: a failed write is reported once and breaks the file (later
// writes are counted, not tried); a record with a NaN is written with
// the figure named in non_finite.
func TestLogFile(t *testing.T) {
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("this test needs /dev/full: %v", err)
	}
	defer full.Close()
	var stderr bytes.Buffer
	l := &logFile{f: full, stderr: &stderr}
	for range 3 {
		if n, err := l.Write([]byte("line\n")); n != 5 || err != nil {
			t.Fatalf("Write = %d, %v; want 5, nil", n, err)
		}
	}
	if !l.broken || l.err == nil || l.err.Lost != 3 || !errors.Is(l.err, syscall.ENOSPC) {
		t.Errorf("after 3 writes to /dev/full: broken %v, err %v", l.broken, l.err)
	}
	if want := "gptui: log file /dev/full: no space left on device; training goes on without it, and gptui will exit with status 1\n"; stderr.String() != want {
		t.Errorf("stderr %q, want %q", stderr.String(), want)
	}

	f, err := os.Create(filepath.Join(t.TempDir(), "metrics.0.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	stderr.Reset()
	m := &logFile{f: f, stderr: &stderr}
	rl := &runLog{metrics: m}
	rl.writeMetrics(Metrics{Step: 1, Loss: math.NaN(), GradNorm: math.Inf(1)})
	rl.writeMetrics(Metrics{Step: 2, Loss: 1})
	b, _ := os.ReadFile(f.Name())
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if m.broken || m.err != nil || len(lines) != 2 || !strings.HasPrefix(lines[1], `{"step":2,`) {
		t.Fatalf("after a NaN record: broken %v, err %v, file %q; want both records written", m.broken, m.err, b)
	}
	var rec Metrics
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil || rec.Step != 1 || rec.Loss != 0 || !slices.Equal(rec.NonFinite, []string{"loss", "grad_norm"}) {
		t.Errorf("NaN record %q: %+v, %v; want step 1 with non_finite [loss grad_norm]", lines[0], rec, err)
	}
	if stderr.Len() != 0 {
		t.Errorf("stderr %q, want nothing", stderr.String())
	}
}

// TestMetricsReadBack: the records the engine writes are what event's
// reader (the agent's, the UI's, gptui report's) reads: every step, its
// loss as the run returned it, its learning rate.
func TestMetricsReadBack(t *testing.T) {
	dir := t.TempDir()
	_, res := trainTiny(t, "Engine.max_steps=3", "Engine.log_dir="+dir)
	f, err := os.Open(event.MetricsFile(dir, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ms, err := event.ReadMetrics(f.Name(), f)
	if err != nil || len(ms) != 3 {
		t.Fatalf("read %d records, %v; want 3", len(ms), err)
	}
	for i, m := range ms {
		if m.Step != i || float32(m.Loss) != res.Losses[i] || m.LR <= 0 || m.TokensPerS <= 0 {
			t.Errorf("record %d: %+v; the run's loss %v", i, m, res.Losses[i])
		}
	}
}
