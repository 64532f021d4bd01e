package cluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/event"
)

// TestResumeAgreement: which checkpoints a resume may start from, newest
// first, and which nodes are refused, for what two nodes hold: the run of
// the newest checkpoint of all decides; an older step of that run counts
// whether or not the newest's node still holds it; a step the newest's
// node holds counts only as that very checkpoint.
func TestResumeAgreement(t *testing.T) {
	const runA, runB = "aaaa", "bbbb"
	rec := func(m, run string) checkpoint.Record { return checkpoint.Record{Manifest: m, Run: run} }
	sum := func(step int, m, run string, h map[int]checkpoint.Record) checkpoint.Summary {
		return checkpoint.Summary{Step: step, Manifest: m, Run: run, History: h}
	}
	tests := []struct {
		name    string
		sums    []checkpoint.Summary
		want    []candidate
		refused string // "" if none
	}{
		{"one holds the newest, the other missed it (keep_last 1)",
			[]checkpoint.Summary{
				sum(15, "m15", runA, map[int]checkpoint.Record{15: rec("m15", runA)}),
				sum(10, "m10", runA, map[int]checkpoint.Record{10: rec("m10", runA)}),
			},
			[]candidate{{15, "m15"}, {10, "m10"}}, ""},
		{"the newest damaged on one node: listed, not its newest",
			[]checkpoint.Summary{
				sum(5, "m5", runA, map[int]checkpoint.Record{5: rec("m5", runA), 10: rec("m10", runA)}),
				sum(10, "m10", runA, map[int]checkpoint.Record{5: rec("m5", runA), 10: rec("m10", runA)}),
			},
			[]candidate{{10, "m10"}, {5, "m5"}}, ""},
		{"none on one node",
			[]checkpoint.Summary{checkpoint.None(), sum(10, "m10", runA, map[int]checkpoint.Record{10: rec("m10", runA)})},
			[]candidate{{10, "m10"}}, ""},
		{"another run's older step",
			[]checkpoint.Summary{
				sum(10, "m10", runA, map[int]checkpoint.Record{10: rec("m10", runA)}),
				sum(5, "x5", runB, map[int]checkpoint.Record{5: rec("x5", runB)}),
			},
			[]candidate{{10, "m10"}}, "n2 would start from step 5 (not of this run: written by run bbbb, step 10 by run aaaa)"},
		{"the same step with another manifest",
			[]checkpoint.Summary{
				sum(10, "m10", runA, map[int]checkpoint.Record{5: rec("m5", runA), 10: rec("m10", runA)}),
				sum(5, "x5", runA, map[int]checkpoint.Record{5: rec("x5", runA)}),
			},
			[]candidate{{10, "m10"}, {5, "m5"}}, "n2 would start from step 5 (another checkpoint: manifest x5)"},
		{"no run recorded: only what the newest's node holds",
			[]checkpoint.Summary{
				sum(10, "m10", "", map[int]checkpoint.Record{5: rec("m5", ""), 10: rec("m10", "")}),
				sum(5, "m5", "", map[int]checkpoint.Record{3: rec("m3", ""), 5: rec("m5", "")}),
			},
			[]candidate{{10, "m10"}, {5, "m5"}}, ""},
		{"no run recorded, a step the newest's node lacks",
			[]checkpoint.Summary{
				sum(10, "m10", "", map[int]checkpoint.Record{10: rec("m10", "")}),
				sum(3, "m3", "", map[int]checkpoint.Record{3: rec("m3", "")}),
			},
			[]candidate{{10, "m10"}}, "n2 would start from step 3 (not of this run: n1 has no such checkpoint)"},
	}
	nodes := []*node{{name: "n1"}, {name: "n2"}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := newestOf(tt.sums)
			if got := resumeCandidates(tt.sums, src); !slices.Equal(got, tt.want) {
				t.Errorf("candidates %v, want %v", got, tt.want)
			}
			err := agreeCheckpoints(nodes, tt.sums, src, "output")
			switch {
			case tt.refused == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.refused != "" && (err == nil || !strings.Contains(err.Error(), tt.refused)):
				t.Errorf("agreement: %v, want a refusal with %q", err, tt.refused)
			}
		})
	}
}

// plantCheckpoint saves a checkpoint of step written by run in the output
// directory of a node's workdir: one tensor whose values depend on the
// step, so that two nodes' checkpoints of a step are the same.
func plantCheckpoint(t *testing.T, workdir string, step int, run string) string {
	t.Helper()
	data := make([]float32, 4096)
	for i := range data {
		data[i] = float32(step*10000 + i)
	}
	dir, err := checkpoint.Save(filepath.Join(workdir, "output"), checkpoint.Manifest{Step: step, Run: run, LossScale: 1},
		[]checkpoint.Part{{Name: "w", GlobalShape: []int{4096}, Start: []int{0}, Shape: []int{4096}, Data: data}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestPlanResume: what a resuming job's plan starts from on two sshd
// nodes, for checkpoints planted in their output directories: with step
// 10 damaged on both nodes, step 5, each node saying that step 10 loads
// nowhere; a node whose newest checkpoint is another run's is refused
// before anything is copied. Every worker is told the directory.
func TestPlanResume(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: cmd/gptui's resume tests run the launcher end to end")
	}
	tc := newCluster(t, "cpu:1")
	for _, tt := range []struct {
		name    string
		plant   func(t *testing.T)
		resume  string   // the plan's Resume
		events  []string // node events, "node: message"
		refused string   // "" for none
	}{
		{"newest damaged on every node", func(t *testing.T) {
			for _, wd := range tc.workdirs {
				plantCheckpoint(t, wd, 5, "aa")
				dir := plantCheckpoint(t, wd, 10, "aa")
				f := filepath.Join(dir, "rank_00000.safetensors")
				b, _ := os.ReadFile(f)
				b[len(b)/2] ^= 1
				os.WriteFile(f, b, 0o644)
			}
		}, "output/step_00000005", []string{
			"127.0.0.2: checkpoint output/step_00000010: no node holds rank_00000.safetensors verified",
			"127.0.0.3: checkpoint output/step_00000010: no node holds rank_00000.safetensors verified",
			"127.0.0.2: step 10 cannot be completed on every node; trying step 5",
		}, ""},
		{"another run's checkpoint", func(t *testing.T) {
			plantCheckpoint(t, tc.workdirs[0], 10, "aa")
			plantCheckpoint(t, tc.workdirs[1], 5, "bb")
		}, "", nil, "127.0.0.3 would start from step 5 (not of this run: written by run bb, step 10 by run aa)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, wd := range tc.workdirs {
				os.RemoveAll(filepath.Join(wd, "output"))
			}
			tt.plant(t)
			j := New(tc.options(t, "Engine.save_load.ckpt_dir=auto"))
			events := collect(j)
			p, err := j.Plan(context.Background())
			j.Close()
			var got []string
			for _, e := range <-events {
				if e.Kind == event.KindNode && e.State == event.NodePushing && !strings.Contains(e.Message, "pushed") && !strings.Contains(e.Message, "push skipped") {
					got = append(got, e.Node+": "+e.Message)
				}
			}
			if tt.refused != "" {
				var ie *InputError
				if !errors.As(err, &ie) || !strings.Contains(err.Error(), tt.refused) {
					t.Fatalf("Plan: %v, want an input error with %q", err, tt.refused)
				}
				if len(got) > 0 {
					t.Errorf("copies before the refusal: %q", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Resume != tt.resume {
				t.Errorf("Resume %q, want %q", p.Resume, tt.resume)
			}
			for _, w := range tt.events {
				if !slices.Contains(got, w) {
					t.Errorf("no event %q among %q", w, got)
				}
			}
			for _, n := range p.Nodes {
				for _, w := range n.Spec.Workers {
					if a := strings.Join(w.Args, " "); !strings.HasSuffix(a, " -o Engine.save_load.ckpt_dir="+tt.resume) {
						t.Errorf("rank %d args %q", w.Rank, a)
					}
				}
			}
		})
	}
}
