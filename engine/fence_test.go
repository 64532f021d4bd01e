package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/fence"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/presets"
)

// TestFencedRun: a worker whose attempt a later one has outdated (package
// fence) writes nothing more into its workdir: fenced before it starts,
// it opens no log file; fenced at step 3, its metrics end at step 2 and
// its checkpoints at the one before, and the run ends with the
// *fence.StaleError.
func TestFencedRun(t *testing.T) {
	for _, tc := range []struct {
		name    string
		from    int64 // the step from which a later attempt holds the workdir; -1: before the start
		metrics int   // records left in the metrics file; -1: no file
		ckpts   []string
	}{
		{"before the start", -1, -1, nil},
		{"at step 3", 3, 3, []string{"latest", "step_00000002"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			work, logs, out := t.TempDir(), t.TempDir(), t.TempDir()
			gen, err := fence.Next(work)
			if err != nil {
				t.Fatal(err)
			}
			tok := &fence.Token{Dir: work, Gen: gen}
			cfg, err := presets.Load("tiny", []string{smallVocab, "Engine.eval_freq=0", "Engine.logging_freq=1", "Engine.max_steps=8",
				"Engine.save_load.save_steps=2", "Engine.save_load.output_dir=" + out, "Engine.log_dir=" + logs, "Global.micro_batch_size=4"})
			if err != nil {
				t.Fatal(err)
			}
			var tr *Trainer
			bumped := false
			check := func() error {
				if !bumped && (tc.from < 0 || tr.current.Load() >= tc.from) {
					bumped = true
					if _, err := fence.Next(work); err != nil { // the later attempt takes the workdir
						return err
					}
				}
				return tok.Check()
			}
			if tr, err = NewTrainer(cfg, fixedPeak{cpu.New()}, Options{Builtin: corpusFor(cfg), Fence: check}); err != nil {
				t.Fatal(err)
			}
			_, err = tr.Run(context.Background())
			var stale *fence.StaleError
			if !errors.As(err, &stale) || stale.Gen != gen || stale.Now != gen+1 {
				t.Fatalf("Run: %v, want a *fence.StaleError", err)
			}
			b, err := os.ReadFile(event.MetricsFile(logs, 0))
			switch {
			case tc.metrics < 0 && !errors.Is(err, os.ErrNotExist):
				t.Errorf("fenced before the start, the metrics file exists (%v)", err)
			case tc.metrics >= 0 && strings.Count(string(b), "\n") != tc.metrics:
				t.Errorf("metrics file: %d records, want %d:\n%s", strings.Count(string(b), "\n"), tc.metrics, b)
			}
			des, _ := os.ReadDir(out)
			var got []string
			for _, de := range des {
				got = append(got, de.Name())
			}
			if strings.Join(got, " ") != strings.Join(tc.ckpts, " ") {
				t.Errorf("%s holds %v, want %v", filepath.Base(out), got, tc.ckpts)
			}
		})
	}
}
