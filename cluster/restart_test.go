package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/sshexec"
)

// TestReshape: a job re-planned for fewer or more ranks keeps its global
// batch by accumulation, its tensor, context and pipeline degrees, and its sharding
// and micro-batch sizes where they still divide; where the ranks left
// cannot hold the job, the reason says why.
func TestReshape(t *testing.T) {
	for _, tt := range []struct {
		name      string
		overrides []string
		ranks     int
		want      string // dp sharding mp pp local micro, or the error
	}{
		{"dp4 to dp2", []string{"Distributed.dp_degree=4", "Global.global_batch_size=8", "Global.local_batch_size=2", "Global.micro_batch_size=2"}, 2, "dp2 sh1 mp1 pp1 local 4 micro 2"},
		{"dp2 to dp4", []string{"Distributed.dp_degree=2", "Global.global_batch_size=8", "Global.local_batch_size=4", "Global.micro_batch_size=4"}, 4, "dp4 sh1 mp1 pp1 local 2 micro 2"},
		{"mp kept", []string{"Distributed.dp_degree=2", "Distributed.mp_degree=2", "Global.global_batch_size=8", "Global.local_batch_size=4", "Global.micro_batch_size=2"}, 2, "dp1 sh1 mp2 pp1 local 8 micro 2"},
		{"sharding folded", []string{"Distributed.sharding.sharding_degree=4", "Distributed.sharding.sharding_stage=2", "Global.global_batch_size=8", "Global.local_batch_size=2", "Global.micro_batch_size=1"}, 2, "dp1 sh2 mp1 pp1 local 4 micro 1"},
		{"mp does not divide", []string{"Distributed.dp_degree=2", "Distributed.mp_degree=2", "Global.global_batch_size=8", "Global.local_batch_size=4", "Global.micro_batch_size=4"}, 3, "mp 2 × pp 1 does not divide them"},
		{"cp kept", []string{"Distributed.dp_degree=2", "Distributed.cp_degree=2", "Model.hidden_dropout_prob=0", "Model.attention_probs_dropout_prob=0", "Global.global_batch_size=8", "Global.local_batch_size=4", "Global.micro_batch_size=2"}, 2, "dp1 sh1 mp1 pp1 local 8 micro 2"},
		{"cp does not divide", []string{"Distributed.dp_degree=2", "Distributed.cp_degree=2", "Model.hidden_dropout_prob=0", "Model.attention_probs_dropout_prob=0", "Global.global_batch_size=8", "Global.local_batch_size=4", "Global.micro_batch_size=2"}, 3, "mp 1 × pp 1 × cp 2 does not divide them"},
		{"batch does not divide", []string{"Distributed.dp_degree=4", "Global.global_batch_size=8", "Global.local_batch_size=2", "Global.micro_batch_size=2"}, 3, "the global batch 8 does not divide into 3 replicas"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := presets.Load("tiny", tt.overrides)
			if err != nil {
				t.Fatal(err)
			}
			global := c.Global.GlobalBatchSize
			var got string
			if err := reshape(c, tt.ranks); err != nil {
				got = err.Error()
			} else {
				d, g := c.Distributed, c.Global
				got = fmt.Sprintf("dp%d sh%d mp%d pp%d local %d micro %d", d.DPDegree, d.Sharding.ShardingDegree, d.MPDegree, d.PPDegree, g.LocalBatchSize, g.MicroBatchSize)
				if g.GlobalBatchSize != global {
					t.Errorf("global batch %d, was %d", g.GlobalBatchSize, global)
				}
			}
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// TestResumedFrom: where the replan resumes from another step than the
// restart named, a JobReplanned event carries the restart with the true
// step and says which.
func TestResumedFrom(t *testing.T) {
	r := event.Restart{Count: 1, Max: 1, Cause: "rank 3 killed", Step: 25}
	for _, tt := range []struct {
		step int
		want string
	}{
		{10, "resuming from step 10, not 25: no newer checkpoint can be held by every node"},
		{0, "restarting from the start, not from step 25: no checkpoint can be held by every node"},
		{30, "resuming from step 30, the newest checkpoint every node holds"},
	} {
		e := resumedFrom(r, tt.step)
		if e.Kind != event.KindJob || e.State != event.JobReplanned || e.Message != tt.want || e.Restart == nil ||
			e.Restart.Step != tt.step || e.Restart.Count != 1 || e.Restart.Cause != r.Cause {
			t.Errorf("step %d: %+v (restart %+v), want %q", tt.step, e, e.Restart, tt.want)
		}
	}
	if r.Step != 25 {
		t.Errorf("resumedFrom changed its argument: %+v", r)
	}
}

// TestSupervisorNoRestart: with restarts allowed, a worker's exit status 2
// (bad input: here Model.init_from is not a model file) ends the job at
// once with that failure, and a Stop ends it as stopped; neither is
// restarted.
func TestSupervisorNoRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: cmd/gptui's TestRestartWorkerKilled runs the launcher end to end")
	}
	tc := newCluster(t, "cpu:1")
	notModel := filepath.Join(t.TempDir(), "notmodel.bin")
	if err := os.WriteFile(notModel, make([]byte, 2048), 0o644); err != nil {
		t.Fatal(err)
	}
	dp2 := []string{"Distributed.dp_degree=2", "Global.local_batch_size=1", "Global.micro_batch_size=1", "Global.global_batch_size=2", "Data.Train.dataset.max_seq_len=16"}
	for _, tt := range []struct {
		name      string
		overrides []string
		stop      bool
		check     func(error) bool
	}{
		{"bad input", append([]string{"Engine.max_steps=5", "Model.init_from=" + notModel}, dp2...), false, func(err error) bool {
			var f *Failure
			return errors.As(err, &f) && f.Code == 2 && f.BadInput
		}},
		{"stop", append([]string{"Engine.max_steps=1000000"}, dp2...), true, func(err error) bool { return errors.Is(err, ErrStopped) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := NewSupervisor(tc.options(t, tt.overrides...), Restarts{Max: 3})
			events := make(chan []event.Event, 1)
			training := make(chan struct{})
			go func() {
				var es []event.Event
				for e := range s.Events() {
					if e.Kind == event.KindMetrics && !slices.ContainsFunc(es, func(e event.Event) bool { return e.Kind == event.KindMetrics }) {
						close(training)
					}
					es = append(es, e)
				}
				events <- es
			}()
			if _, err := s.Plan(context.Background()); err != nil {
				s.Close()
				t.Fatal(err)
			}
			if err := s.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if tt.stop {
				select {
				case <-training:
				case <-time.After(60 * time.Second):
					t.Fatal("no training after 60 s")
				}
				s.Stop()
			}
			waited := make(chan error, 1)
			go func() { waited <- s.Wait() }()
			var err error
			select {
			case err = <-waited:
			case <-time.After(60 * time.Second):
				t.Fatal("the job still runs after 60 s")
			}
			if !tt.check(err) {
				t.Errorf("Wait: %v", err)
			}
			es := <-events
			for _, e := range es {
				if e.Kind == event.KindJob && e.State == event.JobRestarting {
					t.Errorf("restarted: %s", e.Message)
				}
			}
			if last := es[len(es)-1]; last.Kind != event.KindJob || (last.State != event.JobFailed && last.State != event.JobStopped) {
				t.Errorf("last event %+v, want the job's end", last)
			}
		})
	}
}

// TestConfigFor: the next attempt's config resumes (ckpt_dir auto) once a
// checkpoint was saved, is re-planned for the ranks of the nodes it runs
// on, and says how when the strategy changes: down to one node, and back.
func TestConfigFor(t *testing.T) {
	cfg, err := presets.Load("tiny", []string{"Distributed.dp_degree=4", "Global.global_batch_size=4", "Global.local_batch_size=1", "Global.micro_batch_size=1"})
	if err != nil {
		t.Fatal(err)
	}
	nodes := []sshexec.Node{
		{Name: "node1", Host: "10.0.0.1", Port: 22, Devices: sshexec.Devices{CPU: 2}},
		{Name: "node2", Host: "10.0.0.2", Port: 22, Devices: sshexec.Devices{CPU: 2}},
	}
	s := NewSupervisor(Options{Nodes: nodes, Config: cfg}, Restarts{Max: 2, MinNodes: 1})
	for _, tt := range []struct {
		nodes     []sshexec.Node
		saved     int
		ckpt      string
		dp, accum int
		how       string
	}{
		{nodes, -1, "", 4, 1, ""},
		{nodes[:1], 10, "auto", 2, 2, "re-planned dp4 mb1 → dp2 mb1, accumulate 2 (global batch 4 kept)"},
		{nodes[:1], 10, "auto", 2, 2, ""},
		{nodes, 15, "auto", 4, 1, "re-planned dp2 mb1 → dp4 mb1, accumulate 1 (global batch 4 kept)"},
	} {
		s.saved = tt.saved
		c, how, err := s.configFor(tt.nodes)
		if err != nil {
			t.Fatal(err)
		}
		g := c.Global
		if c.Engine.SaveLoad.CkptDir != tt.ckpt || c.Distributed.DPDegree != tt.dp || g.LocalBatchSize/g.MicroBatchSize != tt.accum || g.GlobalBatchSize != 4 || how != tt.how {
			t.Errorf("%d node(s), saved %d: ckpt_dir %q dp %d accumulate %d global %d, %q; want %q dp %d accumulate %d, %q",
				len(tt.nodes), tt.saved, c.Engine.SaveLoad.CkptDir, c.Distributed.DPDegree, g.LocalBatchSize/g.MicroBatchSize, g.GlobalBatchSize, how, tt.ckpt, tt.dp, tt.accum, tt.how)
		}
	}
	if cfg.Distributed.DPDegree != 4 || cfg.Engine.SaveLoad.CkptDir != "" {
		t.Errorf("the job's own config was changed: dp %d ckpt_dir %q", cfg.Distributed.DPDegree, cfg.Engine.SaveLoad.CkptDir)
	}
}

// TestSupervisorRestartRequested: Restart, while the job trains, stops the
// gang with a checkpoint (an interrupt) and starts it again from it, a
// requested restart that Restarts.Max (0 here) does not bound; the job
// then trains on past that step. Restart before Start, or once the job
// has ended, is an error.
func TestSupervisorRestartRequested(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: cmd/gptui's TestDetach* run gptui's restart of a job")
	}
	tc := newCluster(t, "cpu:1")
	s := NewSupervisor(tc.options(t, "Engine.max_steps=1000000", "Engine.save_load.save_steps=5", "Distributed.dp_degree=2",
		"Global.local_batch_size=1", "Global.micro_batch_size=1", "Global.global_batch_size=2", "Data.Train.dataset.max_seq_len=16"), Restarts{})
	if err := s.Restart(); err == nil {
		t.Error("Restart before Start succeeded")
	}
	saved, restarted, past := make(chan int, 64), make(chan *event.Restart, 1), make(chan int, 1)
	go func() {
		var r *event.Restart
		for e := range s.Events() {
			switch {
			case e.Kind == event.KindCheckpoint && e.State == event.CheckpointSaved:
				select {
				case saved <- e.Checkpoint.Step:
				default:
				}
			case e.Kind == event.KindJob && e.State == event.JobRestarting:
				r = e.Restart
				restarted <- r
			case e.Kind == event.KindMetrics && r != nil && e.Rank == 0 && e.Metrics.Step > r.Step+2:
				select {
				case past <- e.Metrics.Step:
				default:
				}
			}
		}
	}()
	if _, err := s.Plan(context.Background()); err != nil {
		s.Close()
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var step int
	select {
	case step = <-saved:
	case <-time.After(90 * time.Second):
		t.Fatal("no checkpoint after 90 s")
	}
	if err := s.Restart(); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	select {
	case r := <-restarted:
		if !r.Requested || r.Step < step || r.Max != 0 || !strings.Contains(r.String(), "restart requested; resuming from step") {
			t.Errorf("the restart %+v (%s), want a requested one from step %d or later", r, r.String(), step)
		}
		t.Logf("%s (a checkpoint of step %d saved before)", r.String(), step)
	case <-time.After(60 * time.Second):
		t.Fatal("no restart 60 s after Restart")
	}
	select {
	case n := <-past:
		t.Logf("training again at step %d", n)
	case <-time.After(90 * time.Second):
		t.Fatal("not training past the restart's step after 90 s")
	}
	s.Stop()
	if err := s.Wait(); !errors.Is(err, ErrStopped) {
		t.Errorf("Wait after Stop: %v", err)
	}
	if err := s.Restart(); err == nil {
		t.Error("Restart of an ended job succeeded")
	}
}
