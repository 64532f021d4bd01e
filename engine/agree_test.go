package engine

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/presets"
)

func TestResumeDisagreement(t *testing.T) {
	a := resumePoint{step: 20, hash: "aaaa", host: "node1"}
	b := resumePoint{step: 10, hash: "bbbb", host: "node2"}
	c := resumePoint{step: 20, hash: "cccc", host: "node2"}
	none := resumePoint{step: -1, host: "node2"}
	for _, tc := range []struct {
		name   string
		points []resumePoint
		want   string // "" agrees
	}{
		{"same", []resumePoint{a, a, {step: 20, hash: "aaaa", host: "node2"}}, ""},
		{"all fresh", []resumePoint{none, none}, ""},
		{"steps differ", []resumePoint{a, a, b, b},
			"resume: ranks 0–1 on node1 would start from step 20, ranks 2–3 on node2 from step 10: remove the stale checkpoint or pass -o Engine.save_load.ckpt_dir=DIR"},
		{"one without", []resumePoint{a, none},
			"resume: rank 0 on node1 would start from step 20, rank 1 on node2 from step 0 (no checkpoint): remove"},
		{"manifests differ", []resumePoint{a, c},
			"rank 1 on node2 from step 20 (a different checkpoint: manifest cccc)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := resumeDisagreement(tc.points)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("got %v, want agreement", err)
				}
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a ConfigError containing %q", err, tc.want)
			}
		})
	}
}

func TestResumePointRoundTrip(t *testing.T) {
	p := resumePoint{step: 1<<20 + 7, hash: "0123456789abcdef0123456789abcdef", host: "gpu-node-17.example"}
	if got := decodeResumePoint(encodeResumePoint(p)); got != p {
		t.Fatalf("decoded %+v, want %+v", got, p)
	}
}

// TestAgreeRefusesDifferentSteps: two ranks in one world, each with its
// own output directory (as on two nodes that share no filesystem), one
// holding step 4 and the other step 2, are refused by NewTrainer on both
// ranks, before any step.
func TestAgreeRefusesDifferentSteps(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir()}
	trainTiny(t, "Engine.max_steps=4", "Engine.save_load.save_steps=4", "Engine.save_load.output_dir="+dirs[0])
	trainTiny(t, "Engine.max_steps=2", "Engine.save_load.save_steps=2", "Engine.save_load.output_dir="+dirs[1])
	host := os.Getenv("GPTUI_NODE")
	if host == "" {
		host, _ = os.Hostname()
	}
	port := freePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, err := comm.Connect(ctx, comm.Config{Rank: r, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: port, Timeout: 30 * time.Second, Secret: []byte("test")})
			if err != nil {
				errs[r] = err
				return
			}
			defer w.Close()
			cfg, err := presets.Load("tiny", []string{"Engine.save_load.output_dir=" + t.TempDir(), smallVocab, "Engine.max_steps=6", "Engine.log_dir=" + t.TempDir(),
				"Engine.save_load.output_dir=" + dirs[r], "Engine.save_load.ckpt_dir=auto", "Distributed.dp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=4"})
			if err != nil {
				errs[r] = err
				return
			}
			_, errs[r] = NewTrainer(cfg, cpu.New(), Options{Builtin: corpusFor(cfg), World: w})
		}()
	}
	wg.Wait()
	want := "resume: rank 0 on " + host + " would start from step 4, rank 1 on " + host + " from step 2: remove the stale checkpoint"
	for r, err := range errs {
		var ce *ConfigError
		if !errors.As(err, &ce) || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("rank %d: got %v, want a ConfigError starting %q", r, err, want)
		}
	}
}
