//go:build unix

package engine

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/presets"
)

// asyncHelperEnv carries "<output dir>|<log dir>" to TestAsyncSaveHelper.
const asyncHelperEnv = "GPTUI_ASYNC_SAVE_HELPER"

// smallConfig is a model small enough for a step of a few milliseconds,
// saving every step in the background and resuming from the newest
// checkpoint in out.
func smallConfig(t *testing.T, out, logDir string, steps int, extra ...string) *presets.Config {
	t.Helper()
	cfg, err := presets.Load("tiny", append([]string{"Model.vocab_size=96", "Model.hidden_size=32", "Model.num_attention_heads=2",
		"Model.ffn_hidden_size=64", "Model.max_position_embeddings=16", "Data.Train.dataset.max_seq_len=16",
		"Global.global_batch_size=4", "Global.local_batch_size=4", "Global.micro_batch_size=2",
		"Model.hidden_dropout_prob=0.1", "Model.attention_probs_dropout_prob=0.1", "Optimizer.lr.decay_steps=100",
		"Engine.eval_freq=0", "Engine.logging_freq=1", "Engine.log_dir=" + logDir, "Engine.max_steps=" + fmt.Sprint(steps),
		"Engine.save_load.output_dir=" + out}, extra...))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestAsyncSaveHelper is not a test: run as a child process by
// TestAsyncSaveCrash, it trains (resuming from the newest checkpoint)
// with a background save after every step until it is killed.
func TestAsyncSaveHelper(t *testing.T) {
	spec := os.Getenv(asyncHelperEnv)
	if spec == "" {
		return
	}
	f := strings.Split(spec, "|")
	cfg := smallConfig(t, f[0], f[1], 1<<30, "Engine.save_load.save_steps=1", "Engine.save_load.async=true",
		"Engine.save_load.keep_last=2", "Engine.save_load.ckpt_dir=auto")
	tr, err := NewTrainer(cfg, fixedPeak{cpu.New()}, Options{Builtin: smallTokens})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// newestAfterKill returns the newest checkpoint of out after kill i, nil
// if there is none yet, and fails the test unless it loads whole and is
// not older than step last, the newest before the kill.
func newestAfterKill(t *testing.T, out string, i, last int) *checkpoint.Checkpoint {
	t.Helper()
	c, warn, err := checkpoint.Latest(out)
	switch {
	case errors.Is(err, checkpoint.ErrNoCheckpoint) || errors.Is(err, os.ErrNotExist):
		if last > 0 {
			t.Fatalf("after kill %d no checkpoint loads; step %d did before", i, last)
		}
		return nil
	case err != nil:
		t.Fatalf("after kill %d the newest checkpoint does not load: %v (%q)", i, err, warn)
	case c.Manifest.Step < last:
		t.Fatalf("after kill %d the newest checkpoint is step %d, older than step %d before", i, c.Manifest.Step, last)
	}
	return c
}

// stepLossesOf reads step → loss from a metrics file; a torn last line is
// ignored.
func stepLossesOf(t *testing.T, path string) map[int]float64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		return nil // killed before it opened its logs
	}
	defer f.Close()
	m := map[int]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var mt Metrics
		if json.Unmarshal(sc.Bytes(), &mt) == nil {
			m[mt.Step] = mt.Loss
		}
	}
	return m
}

// TestAsyncSaveCrash: 100 processes training with a background save after
// every step, each resuming from the newest checkpoint of the one before,
// are SIGKILLed at random moments. After each kill the newest checkpoint
// loads, and every step any process ran, resumed or not, has the loss of
// one uninterrupted run, bit for bit.
func TestAsyncSaveCrash(t *testing.T) {
	kills := 100
	if testing.Short() {
		kills = 10 // -short: the path, not the odds
	}
	out := t.TempDir()
	logs := t.TempDir()
	r := rand.New(rand.NewPCG(3, 4))
	seen := map[int]float64{} // step → loss, over every process
	last := 0                 // the newest checkpoint's step so far
	var steps, killedDuringWrite int
	for i := range kills {
		logDir := filepath.Join(logs, fmt.Sprint(i))
		cmd := exec.Command(os.Args[0], "-test.run=^TestAsyncSaveHelper$", "-test.count=1")
		cmd.Env = append(os.Environ(), asyncHelperEnv+"="+out+"|"+logDir)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		before, _ := filepath.Glob(filepath.Join(out, ".tmp-*"))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill it at a random moment of the 60 ms after its second step (a
		// step and its save take a few milliseconds), whatever its start
		// took: more often than not a write is in progress, and each
		// process has finished a step past the one it resumed from, so the
		// run moves on however loaded the machine is.
		metrics := filepath.Join(logDir, "metrics.0.jsonl")
		for start := time.Now(); len(stepLossesOf(t, metrics)) < 2 && time.Since(start) < time.Minute; {
			time.Sleep(2 * time.Millisecond)
		}
		time.Sleep(time.Duration(r.IntN(60)) * time.Millisecond)
		cmd.Process.Kill()
		err := cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("process %d ended before its kill: %v\n%s", i, err, stderr.String())
		}
		if tmps, _ := filepath.Glob(filepath.Join(out, ".tmp-*")); len(tmps) > 0 && !slices.Equal(tmps, before) {
			killedDuringWrite++
		}
		if c := newestAfterKill(t, out, i, last); c != nil {
			last = c.Manifest.Step
		}
		for s, l := range stepLossesOf(t, filepath.Join(logDir, "metrics.0.jsonl")) {
			if prev, ok := seen[s]; ok && prev != l {
				t.Errorf("step %d: loss %v in process %d, %v in an earlier one", s, l, i, prev)
			}
			seen[s] = l
			steps++
		}
	}
	if last < 2*kills/10 {
		t.Fatalf("the processes got to step %d only", last)
	}
	// One run, never interrupted, to the furthest step any process ran.
	most := 0
	for s := range seen {
		most = max(most, s+1)
	}
	ref := t.TempDir()
	tr, err := NewTrainer(smallConfig(t, ref, ref, most), fixedPeak{cpu.New()}, Options{Builtin: smallTokens})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := stepLossesOf(t, filepath.Join(ref, "metrics.0.jsonl"))
	for s, l := range seen {
		if want[s] != l {
			t.Errorf("step %d: loss %v after kills and resumes, %v uninterrupted", s, l, want[s])
		}
	}
	t.Logf("%d kills (%d left a write in progress): %d steps run over all, checkpoints up to step %d", kills, killedDuringWrite, steps, last)
}

// TestAsyncSaveError: an asynchronous save that fails (the output
// directory is a file: the save's directory cannot be made, before
// anything is written in the background) fails the run with the save's
// error, and the steps' log says what each save cost.
func TestAsyncSaveError(t *testing.T) {
	for _, tc := range []struct {
		name    string
		file    bool // output_dir is a regular file
		wantErr string
	}{
		{"fails", true, "saving checkpoint: checkpoint: saving step 1: mkdir"},
		{"saves", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "out")
			if tc.file {
				if err := os.WriteFile(out, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cfg := smallConfig(t, out, dir, 3, "Engine.save_load.save_steps=1", "Engine.save_load.async=true")
			var log strings.Builder
			tr, err := NewTrainer(cfg, fixedPeak{cpu.New()}, Options{Builtin: smallTokens, Stdout: &log})
			if err != nil {
				t.Fatal(err)
			}
			res, err := tr.Run(context.Background())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Run: %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(out, checkpoint.DirName(3)); res.Checkpoint != want {
				t.Errorf("checkpoint %q, want %q", res.Checkpoint, want)
			}
			for s := 1; s <= 3; s++ {
				line := fmt.Sprintf("[checkpoint] saved step %d to %s (blocked the step ", s, filepath.Join(out, checkpoint.DirName(s)))
				if !strings.Contains(log.String(), line) {
					t.Errorf("the log lacks %q:\n%s", line, log.String())
				}
			}
		})
	}
}
