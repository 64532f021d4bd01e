package tui

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/jobdir"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/sshexec"
)

// TestEventLogThroughDashboard: each kind of event, written to a job's
// event log as its supervisor writes it (jobdir.Log), comes back through
// jobdir.Attach — the runner of 'gptui attach' and of jobs the UI launches —
// and shows on the dashboard (or the Nodes screen): no log line is read
// for a fact.
func TestEventLogThroughDashboard(t *testing.T) {
	base := t.TempDir()
	dir, err := jobdir.Create(base, jobdir.Spec{ID: "20260301-120000-abcdef", Dir: base, Hosts: "hosts.txt", Config: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	log, err := jobdir.OpenLog(dir, jobdir.NewSummary(100, t0))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	if err := jobdir.WriteSupervisor(dir, jobdir.Self("")); err != nil { // this process: alive
		t.Fatal(err)
	}
	cfg, err := presets.Load("tiny", []string{"Engine.max_steps=100"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runner := jobdir.Attach(ctx, dir, 0)
	nodes := []sshexec.Node{{Name: "gpu0", Host: "10.0.0.1"}, {Name: "gpu1", Host: "10.0.0.2"}}
	m := New(Options{Nodes: nodes, Config: "tiny", Attach: &Attached{Runner: runner, Config: cfg}})
	m.Update(tea.WindowSizeMsg{Width: 160, Height: 50})
	if m.screen != screenDash || m.runner == nil {
		t.Fatalf("attached: screen %d, runner %v", m.screen, m.runner)
	}

	write := func(evs ...event.Event) {
		t.Helper()
		for _, e := range evs {
			if err := log.Write(e); err != nil {
				t.Fatal(err)
			}
		}
	}
	// await feeds the model what the runner brings until the screen (the
	// dashboard's, or with gpu1 set, gpu1's details on the Nodes screen)
	// shows every text of want.
	await := func(gpu1 bool, want ...string) string {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for {
			scr := m.Render()
			if gpu1 {
				press(m, "1", "G", "enter")
				scr = m.Render()
				press(m, "esc", "4")
			}
			missing := ""
			for _, w := range want {
				if !strings.Contains(scr, w) {
					missing = w
					break
				}
			}
			if missing == "" {
				return scr
			}
			select {
			case e, ok := <-runner.Events():
				m.Update(eventsMsg{stream: m.jobN, events: []event.Event{e}, closed: !ok})
			case <-deadline:
				t.Fatalf("the screen lacks %q:\n%s", missing, scr)
			}
		}
	}
	mk := func(kind, node string, rank int, state string, f func(*event.Event)) event.Event {
		e := ev(kind, 1, f)
		e.Node, e.Rank, e.State = node, rank, state
		return e
	}
	nodeOf := []string{"gpu0", "gpu1"}

	// The setup, the start, the workers, a step, a log line, checkpoints
	// and the samples.
	write(
		mk(event.KindNode, "gpu0", -1, event.NodeConnecting, nil),
		mk(event.KindProbe, "gpu0", -1, "", func(e *event.Event) {
			e.Probe = &event.Probe{Hostname: "gpu0", Cores: 8, MemBytes: 32 << 30, NoGPU: "no NVML"}
		}),
		mk(event.KindNode, "gpu0", -1, event.NodeReady, nil),
		mk(event.KindNode, "gpu1", -1, event.NodeReady, nil),
		mk(event.KindJob, "", -1, event.JobStarted, func(e *event.Event) { e.Job = "20260301-120000-abcdef" }),
	)
	for r := range 2 {
		write(mk(event.KindWorker, nodeOf[r], r, event.WorkerStarting, nil),
			mk(event.KindWorker, nodeOf[r], r, event.WorkerRunning, func(e *event.Event) { e.Message = fmt.Sprintf("pid %d", 4242+r) }),
			mk(event.KindMetrics, nodeOf[r], r, "", func(e *event.Event) {
				e.Metrics = &event.Metrics{Step: 7, Loss: 3.5, LR: 1e-3, TokensPerS: 1000, StepTimeS: 0.1}
			}))
	}
	write(
		mk(event.KindLog, "gpu0", 0, "", func(e *event.Event) { e.Line = "[train] step 7 as rank 0 logged it" }),
		mk(event.KindCheckpoint, "gpu0", 0, event.CheckpointSaving, func(e *event.Event) { e.Checkpoint = &event.Checkpoint{Step: 8} }),
	)
	await(false, "saving step 8…")
	write(
		mk(event.KindCheckpoint, "gpu0", 0, event.CheckpointSaved, func(e *event.Event) {
			e.Checkpoint = &event.Checkpoint{Step: 8, Dir: "output/step_00000008"}
		}),
		mk(event.KindCheckpoint, "gpu1", -1, event.CheckpointCopied, func(e *event.Event) {
			e.Checkpoint = &event.Checkpoint{Step: 8, Dir: "output/step_00000008", From: "gpu0"}
		}),
		mk(event.KindCheckpoint, "gpu1", -1, event.CheckpointReplicated, func(e *event.Event) {
			e.Checkpoint = &event.Checkpoint{Step: 8, Dir: "output/step_00000008", From: "gpu0"}
			e.Message = "replica of checkpoint output/step_00000008 from gpu0 in 0.1 s"
		}),
	)
	scr := await(false, "step 8/100", "loss 3.5000", "ranks: 2 running", "checkpoint step 8", "[train] step 7 as rank 0 logged it")
	if strings.Contains(scr, "saving step") {
		t.Errorf("the save in flight outlived its checkpoint:\n%s", scr)
	}
	if c := m.dash.ckpt; c.dir != "output/step_00000008" || c.node != "gpu0" {
		t.Errorf("the dashboard's checkpoint: %+v", c)
	}
	await(true, "replica: replica of checkpoint output/step_00000008 from gpu0 in 0.1 s")
	// Samples come as they are written: memory, health, progress.
	write(
		mk(event.KindMemory, "gpu0", 0, "", func(e *event.Event) { e.Device, e.Used, e.Total = -1, 123<<20, 32<<30 }),
		mk(event.KindHealth, "gpu0", -1, "", func(e *event.Event) {
			e.Health = &event.Health{CPUPercent: 55, Cores: 8, MemUsed: 4 << 30, MemTotal: 32 << 30, WorkersRSS: 123 << 20}
		}),
		mk(event.KindProgress, "gpu1", 1, "", func(e *event.Event) {
			e.Progress = &event.Progress{Step: 8, Ops: 41, InFlight: []event.Op{{Group: "dp", Op: "AllReduce", Seq: 42, WaitS: 1}}}
		}),
	)
	await(false, "0.1/32.0 GiB", "gpu0  cpu 55%", "AllReduce #42 (dp)")

	// A hang, a restart and a re-plan, a node back, a node lost and the
	// job's failure.
	write(mk(event.KindJob, "gpu1", 1, event.JobHung, func(e *event.Event) {
		e.Message = "rank 1 on gpu1 stuck: no progress report for 4 s"
	}))
	await(false, "1 hung")
	write(
		mk(event.KindJob, "", -1, event.JobRestarting, func(e *event.Event) {
			e.Restart = &event.Restart{Count: 1, Max: 3, Cause: "job hung: rank 1 on gpu1 stuck", Step: 8}
		}),
		mk(event.KindJob, "", -1, event.JobReplanned, func(e *event.Event) { e.Message = "re-planned dp2 → dp1 for the nodes left" }),
		mk(event.KindNode, "gpu1", -1, event.NodeBack, func(e *event.Event) { e.Message = "reachable again" }),
	)
	await(false, "restart 1/3 from step 8", ": job hung: rank 1 on gpu1 stuck", "re-planned dp2 → dp1 for the nodes left")
	await(true, "back: reachable again")
	write(mk(event.KindJob, "", -1, event.JobStarted, nil))
	for r := range 2 {
		write(mk(event.KindWorker, nodeOf[r], r, event.WorkerRunning, nil))
	}
	write(
		mk(event.KindNode, "gpu1", -1, event.NodeLost, func(e *event.Event) { e.Message = "its agent has been silent for 10 s" }),
		mk(event.KindWorker, "gpu0", 0, event.WorkerStopped, func(e *event.Event) {
			e.Code, e.Signal, e.Exit = -1, "SIGTERM", &event.Exit{Code: 143, Error: "stopped before step 9"}
		}),
		mk(event.KindJob, "gpu1", -1, event.JobFailed, func(e *event.Event) {
			e.Code, e.Message = -1, "node gpu1 lost: its agent has been silent for 10 s"
		}),
	)
	await(false, "1 lost", "1 stopped", "node gpu1 lost: its agent has been silent for 10 s")

	// The supervisor gone after the end: the stream ends, the job is over.
	log.Close()
	gone := jobdir.Self("")
	gone.PID = 1 << 30 // no process of this machine
	jobdir.WriteSupervisor(dir, gone)
	deadline := time.After(20 * time.Second)
	for m.runner != nil {
		select {
		case e, ok := <-runner.Events():
			var evs []event.Event
			if ok {
				evs = append(evs, e)
			}
			m.Update(eventsMsg{stream: m.jobN, events: evs, closed: !ok})
		case <-deadline:
			t.Fatal("the stream did not end after the job's end")
		}
	}
	if scr := m.Render(); !strings.Contains(scr, "job failed") {
		t.Errorf("after the stream's end:\n%s", scr)
	}
}
