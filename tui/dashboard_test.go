package tui

import (
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/presets"
)

// states returns the ranks' states, by rank.
func states(m *Model) []string {
	var out []string
	for _, r := range m.dash.ranks {
		out = append(out, stateName(r.state))
	}
	return out
}

// worker returns a worker event of rank on node.
func worker(sec float64, node string, rank int, state string, code int, signal string) event.Event {
	return ev(event.KindWorker, sec, func(e *event.Event) {
		e.Node, e.Rank, e.State, e.Code, e.Signal = node, rank, state, code, signal
	})
}

// TestRankStates: every rank's state comes from the facts of the job: the
// culprit of a failure is failed (with its signal or code) and marked as
// the cause, the ranks the gang stop ended are stopped, a lost node's
// ranks are lost, a hung rank is hung, a user stop leaves every rank
// stopped and none failed, and a restart marks them all restarting; the
// header counts them.
func TestRankStates(t *testing.T) {
	running := func(t *testing.T) *Model {
		m := trainingJob(t, 4, 20, 140, 40)
		for r := range 4 {
			m.dash.ranks[r].node = []string{"node1", "node1", "node2", "node2"}[r]
		}
		return m
	}
	t.Run("kill -9", func(t *testing.T) {
		m := running(t)
		feed(m,
			worker(30, "node2", 3, event.WorkerFailed, -1, "SIGKILL"),
			worker(30.1, "node2", 2, event.WorkerStopped, -1, "SIGTERM"),
			worker(30.2, "node1", 0, event.WorkerStopped, 143, ""),
			worker(30.2, "node1", 1, event.WorkerStopped, -1, "SIGKILL"),
			ev(event.KindJob, 31, func(e *event.Event) {
				e.State, e.Rank, e.Node, e.Code, e.Signal = event.JobFailed, 3, "node2", -1, "SIGKILL"
				e.Message = "rank 3 on node2 was killed by SIGKILL"
			}))
		if got := fmt.Sprint(states(m)); got != "[stopped stopped stopped failed]" || !m.dash.ranks[3].cause {
			t.Errorf("states %s, cause %v", got, m.dash.ranks[3].cause)
		}
		out := m.Render()
		for _, s := range []string{"ranks: 3 stopped · 1 failed (cause)", "✗ rank 3 on node2 failed: killed by SIGKILL", "failed ✗", "stopped with the job because rank 3 failed"} {
			if !strings.Contains(out, s) {
				t.Errorf("the screen lacks %q:\n%s", s, out)
			}
		}
	})
	t.Run("hang", func(t *testing.T) {
		m := running(t)
		diag := "rank 2 on node2 stuck: no progress report for 4 s (the process is stopped or frozen); ranks 0–1, 3 waiting in AllReduce #41 (dp) for 4 s"
		feed(m,
			ev(event.KindJob, 30, func(e *event.Event) { e.State, e.Rank, e.Node, e.Message = event.JobHung, 2, "node2", diag }),
			worker(31, "node2", 2, event.WorkerStopped, -1, "SIGKILL"),
			worker(31, "node2", 3, event.WorkerStopped, -1, "SIGTERM"),
			worker(31, "node1", 0, event.WorkerStopped, -1, "SIGTERM"),
			worker(31, "node1", 1, event.WorkerStopped, -1, "SIGTERM"),
			ev(event.KindJob, 32, func(e *event.Event) {
				e.State, e.Rank, e.Node, e.Code = event.JobFailed, 2, "node2", -1
				e.Message = "job hung: " + diag
			}))
		if got := fmt.Sprint(states(m)); got != "[stopped stopped hung stopped]" {
			t.Errorf("states %s", got)
		}
		m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
		out := m.Render()
		// The whole diagnosis, wrapped, at 80 columns.
		flat := strings.Join(strings.Fields(strings.ReplaceAll(out, "\n", " ")), " ")
		for _, s := range []string{"ranks: 3 stopped · 1 hung (cause)", "✗ the job hung: " + diag} {
			if !strings.Contains(flat, s) {
				t.Errorf("the screen lacks %q:\n%s", s, out)
			}
		}
	})
	t.Run("node lost", func(t *testing.T) {
		m := running(t)
		feed(m,
			ev(event.KindNode, 30, func(e *event.Event) {
				e.Node, e.State, e.Message = "node2", event.NodeLost, "its agent has been silent for 3 s (no heartbeat; the agent is stopped, frozen or cut off)"
			}),
			worker(31, "node1", 0, event.WorkerStopped, -1, "SIGTERM"),
			worker(31, "node1", 1, event.WorkerStopped, -1, "SIGTERM"),
			ev(event.KindJob, 32, func(e *event.Event) {
				e.State, e.Rank, e.Node, e.Code = event.JobFailed, -1, "node2", -1
				e.Message = "node node2 lost: its agent has been silent for 3 s (no heartbeat; the agent is stopped, frozen or cut off)"
			}))
		if got := fmt.Sprint(states(m)); got != "[stopped stopped lost lost]" {
			t.Errorf("states %s", got)
		}
		if out := m.Render(); !strings.Contains(out, "ranks: 2 stopped · 2 lost") || !strings.Contains(out, "✗ node node2 lost: its agent has been silent for 3 s") {
			t.Errorf("the screen:\n%s", out)
		}
	})
	t.Run("user stop", func(t *testing.T) {
		m := running(t)
		press(m, "s")
		press(m, "y")()
		feed(m,
			worker(30, "node1", 0, event.WorkerStopped, 130, ""),
			worker(30, "node1", 1, event.WorkerStopped, 130, ""),
			worker(30, "node2", 2, event.WorkerStopped, -1, "SIGTERM"),
			worker(30, "node2", 3, event.WorkerStopped, -1, "SIGTERM"),
			ev(event.KindJob, 31, func(e *event.Event) { e.State, e.Message = event.JobStopped, "context canceled" }))
		m.Update(eventsMsg{stream: m.jobN, closed: true})
		out := m.Render()
		if got := fmt.Sprint(states(m)); got != "[stopped stopped stopped stopped]" || strings.Contains(out, "failed") || !strings.Contains(out, "ranks: 4 stopped") {
			t.Errorf("states %s:\n%s", got, out)
		}
	})
	t.Run("restart", func(t *testing.T) {
		m := running(t)
		feed(m,
			worker(30, "node2", 3, event.WorkerFailed, -1, "SIGKILL"),
			ev(event.KindJob, 31, func(e *event.Event) {
				e.State = event.JobRestarting
				e.Restart = &event.Restart{Count: 1, Max: 2, Cause: "rank 3 on node2 was killed by SIGKILL", Step: 10}
			}))
		if got := fmt.Sprint(states(m)); got != "[restarting restarting restarting restarting]" {
			t.Errorf("states %s", got)
		}
		// Nothing of the attempt before passes for this one's.
		d := &m.dash
		if d.lead() != nil || d.slow.rank >= 0 || len(d.mem) != 0 || len(d.health) != 0 || d.ranks[0].prog != nil {
			t.Errorf("stale figures after the restart: lead %v, slowest %d, %d memory bars, %d nodes' health", d.lead(), d.slow.rank, len(d.mem), len(d.health))
		}
		out := m.Render()
		if strings.Contains(out, "12.3k tok/s") || strings.Contains(out, "MFU") || !strings.Contains(out, "ranks: 4 restarting") || !strings.Contains(out, "restart 1/2 from step 10") {
			t.Errorf("after the restart:\n%s", out)
		}
		// The replan resumes from an older step than the restart named.
		feed(m, ev(event.KindJob, 35, func(e *event.Event) {
			e.State = event.JobReplanned
			e.Message = "resuming from step 5, not 10: no newer checkpoint can be held by every node"
			e.Restart = &event.Restart{Count: 1, Max: 2, Cause: "rank 3 on node2 was killed by SIGKILL", Step: 5}
		}))
		if out := m.Render(); m.dash.from != 5 || !strings.Contains(out, "restart 1/2 from step 5") {
			t.Errorf("after the replan from step 5 (from %d):\n%s", m.dash.from, out)
		}
		feed(m, worker(40, "node1", 0, event.WorkerStarting, 0, ""), worker(41, "node1", 0, event.WorkerRunning, 0, ""))
		if got := fmt.Sprint(states(m)); got != "[running restarting restarting restarting]" {
			t.Errorf("states %s", got)
		}
	})
}

// TestStraggler: the rank the others wait for is named in the header
// within 5 of its slow steps, though every rank's step takes as long.
func TestStraggler(t *testing.T) {
	m := trainingJob(t, 4, 1, 140, 40)
	step := func(s int, slow int) {
		var evs []event.Event
		for r := range 4 {
			comm := 0.15
			if r == slow {
				comm = 0.01
			}
			evs = append(evs, ev(event.KindMetrics, float64(s), func(e *event.Event) {
				e.Node, e.Rank = "localhost", r
				e.Metrics = &event.Metrics{Step: s, Loss: 5, StepTimeS: 0.3, CommS: comm, TokensPerS: 1000}
			}))
		}
		feed(m, evs...)
	}
	for s := 2; s <= 20; s++ {
		step(s, -1)
	}
	if m.dash.slow.ratio() > 1.01 {
		t.Fatalf("equal ranks: slowest %+v", m.dash.slow)
	}
	named := regexp.MustCompile(`slowest rank 2 ×(\d+\.\d)`)
	for k := 1; k <= 5; k++ {
		step(20+k, 2)
		if mm := named.FindStringSubmatch(m.Render()); mm != nil && mm[1] >= "1.5" {
			t.Logf("named after %d slow steps: %s", k, mm[0])
			break
		}
		if k == 5 {
			t.Fatalf("rank 2 not named after 5 slow steps:\n%s", m.Render())
		}
	}
	// Slowest first: rank 2 heads the ranks pane.
	press(m, "o")
	if m.dash.order[0] != 2 || !strings.Contains(m.Render(), "slowest first (o)") {
		t.Errorf("order %v", m.dash.order)
	}
}

// TestPlannerNotCalledFromView: drawing the Job screen 100 times calls
// the planner 0 times; a change of the job asks it once, in the command
// Update returns, whose answer is kept in the model.
func TestPlannerNotCalledFromView(t *testing.T) {
	calls := 0
	m := readyNodes(t, 140, 40)
	m.opt.Plan = func(r PlanRequest) (*PlanReport, error) { calls++; return fixturePlanner(r) }
	press(m, "3")
	for range 100 {
		_ = m.View()
	}
	if calls != 0 {
		t.Fatalf("%d planner calls in 100 renders", calls)
	}
	m.job.sel = 0
	m.Update(keyMsg("a"))
	for _, r := range "Engine.max_steps=7" {
		m.Update(keyMsg(string(r)))
	}
	_, cmd := m.Update(keyMsg("enter"))
	if calls != 0 || cmd == nil || !m.plan.pending() {
		t.Fatalf("after an override: %d calls, command %v, pending %v", calls, cmd != nil, m.plan.pending())
	}
	msg := cmd()
	if _, ok := msg.(planMsg); !ok || calls != 1 {
		t.Fatalf("the command returned %T after %d calls, want a planMsg after 1", msg, calls)
	}
	m.Update(msg)
	for range 100 {
		_ = m.View()
	}
	if calls != 1 || m.plan.pending() || !strings.Contains(m.Render(), "9 feasible, 3023 rejected") {
		t.Errorf("%d calls; pending %v\n%s", calls, m.plan.pending(), m.Render())
	}
}

// TestLaunchNeedsReadyNodes: Launch is off, saying why, while a node is
// not ready; the rank table counts the ready nodes alone; a GPU config on
// CPU nodes is a red line naming them, and no plan.
func TestLaunchNeedsReadyNodes(t *testing.T) {
	m := probedNodes(t, 80, 24)
	l := m.opt.Launcher.(*testLauncher)
	press(m, "3", "G", "enter")
	if len(l.jobs) != 0 || !strings.Contains(m.status, "every node must be ready, and gpu1 connecting, gpu2 host key, gpu3 failed") {
		t.Errorf("launch with nodes not ready: %d jobs, status %q", len(l.jobs), m.status)
	}
	if n := m.rankTable.table(m.nodes.rows).RankSize(); n != 8 {
		t.Errorf("the rank table counts %d ranks, want gpu0's 8", n)
	}
	press(m, "2")
	if !strings.Contains(m.Render(), "world size 8 on the 1 ready node of 4") {
		t.Errorf("the rank table screen:\n%s", m.Render())
	}

	// Two CPU nodes, a GPU config.
	m = New(Options{Nodes: inventory(2), Config: "13b-4node", Plan: fixturePlanner, Launcher: &testLauncher{}})
	m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
	cpu := &event.Probe{Hostname: "c", Cores: 16, MemBytes: 64 << 30, NoGPU: "NVML: libnvidia-ml.so.1 not found"}
	m.Update(eventsMsg{stream: probeStream, events: []event.Event{
		ev(event.KindNode, 1, func(e *event.Event) { e.Node, e.State, e.Probe = "gpu0", event.NodeReady, cpu }),
		ev(event.KindNode, 1, func(e *event.Event) { e.Node, e.State, e.Probe = "gpu1", event.NodeReady, cpu }),
	}})
	settle(m)
	press(m, "3")
	out := strings.Join(strings.Fields(strings.ReplaceAll(m.Render(), "\n", " ")), " ")
	want := "✗ the config trains on GPUs (Global.device: gpu), but gpu0 (16 cores; NVML: libnvidia-ml.so.1 not found) and gpu1 (16 cores; NVML: libnvidia-ml.so.1 not found) have no GPU: set -o Global.device=cpu"
	if !strings.Contains(out, want) || strings.Contains(out, "feasible") {
		t.Errorf("GPU config on CPU nodes: want %q in\n%s", want, m.Render())
	}
	// Such nodes plan with the CPU profile once the config trains on the CPU.
	cfg, _ := presets.Load("tiny", nil)
	if dev, err := planDevice(cfg, []string{"gpu0"}, map[string]*event.Probe{"gpu0": cpu}); dev != "cpu" || err != nil {
		t.Errorf("cpu config: %q, %v", dev, err)
	}
	if dev, err := planDevice(m.job.cfg, []string{"gpu0"}, map[string]*event.Probe{"gpu0": h100("gpu0")}); dev != "H100-80G" || err != nil {
		t.Errorf("H100 nodes: %q, %v", dev, err)
	}
}

// TestRetryAndAcceptHostKey: R sets the selected node up again; a on a
// node with an unknown host key asks, naming the fingerprint, and on yes
// sets the node up accepting that key; a on another failure explains.
func TestRetryAndAcceptHostKey(t *testing.T) {
	m := probedNodes(t, 120, 30)
	l := m.opt.Launcher.(*testLauncher)
	press(m, "j", "j", "j", "R")
	if len(l.probes) != 1 || fmt.Sprint(l.probes[0].Nodes) != "[gpu3]" || l.probes[0].AcceptHostKey != "" {
		t.Fatalf("R on gpu3: probes %+v", l.probes)
	}
	press(m, "a")
	if m.confirm != nil || !strings.Contains(m.status, "gpu3 has no new host key to accept") {
		t.Errorf("a on a refused connection: status %q", m.status)
	}
	press(m, "k", "a")
	fp := "SHA256:q3mC1Yv0m2dcrV8Zp0YQzWw4a3JvT9cK6k1eX7qzZ0A"
	if m.confirm == nil || !strings.Contains(m.Render(), "Trust gpu2's host key "+fp) {
		t.Fatalf("a on the host-key node did not ask:\n%s", m.Render())
	}
	press(m, "n")
	if len(l.probes) != 1 {
		t.Fatal("no accepted the key")
	}
	press(m, "a", "y")
	if len(l.probes) != 2 || fmt.Sprint(l.probes[1].Nodes) != "[gpu2]" || l.probes[1].AcceptHostKey != fp {
		t.Errorf("yes: probes %+v", l.probes)
	}
	// The retried node's events arrive on the new stream.
	m.Update(eventsMsg{stream: m.probeN, events: []event.Event{
		ev(event.KindNode, 5, func(e *event.Event) { e.Node, e.State, e.Probe = "gpu2", event.NodeReady, h100("gpu2") }),
	}, closed: true})
	if s := m.nodes.rows[2].stateText(); s != "ready" || len(m.probes) != 1 {
		t.Errorf("gpu2 after the retry: %q, %d probes open (want gpu3's alone)", s, len(m.probes))
	}
}

// TestLogWrapAndZoom: a long line is cut in the pane, whole with W, and
// the log fills the screen with z.
func TestLogWrapAndZoom(t *testing.T) {
	m := trainingJob(t, 2, 30, 80, 24)
	long := "[comm] comm: rank 1: AllReduce #12 (dp): read tcp 127.0.0.1:40000->127.0.0.1:40001: connection reset by peer; the job's stop follows"
	feed(m, ev(event.KindLog, 40, func(e *event.Event) { e.Rank, e.Line = 0, long }))
	flat := func() string { return strings.Join(strings.Fields(strings.ReplaceAll(m.Render(), "\n", " ")), " ") }
	if strings.Contains(flat(), "the job's stop follows") {
		t.Fatalf("the line is not cut at 80 columns:\n%s", m.Render())
	}
	press(m, "W")
	bare := func(s string) string { return strings.NewReplacer(" ", "", "\n", "", "↪", "").Replace(s) }
	if !strings.Contains(bare(m.Render()), bare(long)) {
		t.Errorf("W does not show the whole line:\n%s", m.Render())
	}
	press(m, "z")
	lines := strings.Split(m.Render(), "\n")
	logRows := 0
	for _, l := range lines {
		if strings.Contains(l, "[train] rank 0 step") {
			logRows++
		}
	}
	if logRows < 12 || strings.Contains(m.Render(), "Loss") {
		t.Errorf("z: %d log lines on screen:\n%s", logRows, m.Render())
	}
	press(m, "esc")
	if m.dash.zoom {
		t.Error("esc did not leave the full screen")
	}
}

// TestCheckpointAndCharts: the header has the last checkpoint and a save
// in flight; the loss chart's window and EMA are in its title and change
// its y range; a fp16 run shows its loss scale.
func TestCheckpointAndCharts(t *testing.T) {
	m := trainingJob(t, 2, 120, 140, 40)
	feed(m,
		ckptEvent(100, event.CheckpointSaved, 100, "output/step_00000100"),
		ckptEvent(120, event.CheckpointSaving, 120, ""))
	if out := m.Render(); !strings.Contains(out, "checkpoint step 100 21s ago, saving step 120…") {
		t.Errorf("checkpoint status:\n%s", out)
	}
	yTop := func() string {
		for _, l := range strings.Split(m.Render(), "\n") {
			if i := strings.Index(l, "┤"); i > 0 {
				return strings.TrimSpace(l[:i])
			}
		}
		return ""
	}
	all := yTop()
	press(m, "l", "l") // the last 200, then the last 50 steps... 1000, 200: the second is 200
	press(m, "l")      // 50
	if last := yTop(); last == all || !strings.Contains(m.Render(), "Loss (last 50 steps)") {
		t.Errorf("window: y top %s, all %s\n%s", last, all, m.Render())
	}
	press(m, "e")
	if !strings.Contains(m.Render(), "Loss (last 50 steps) EMA") {
		t.Errorf("EMA not in the title:\n%s", m.Render())
	}
	feed(m, ev(event.KindMetrics, 121, func(e *event.Event) {
		e.Node, e.Rank = "localhost", 0
		e.Metrics = &event.Metrics{Step: 121, Loss: 4, LR: 1e-3, StepTimeS: 0.25, TokensPerS: 12345, LossScale: 32768, SkippedSteps: 3}
	}))
	if out := m.Render(); !strings.Contains(out, "loss scale 32768, 3 skipped") {
		t.Errorf("no loss scale:\n%s", out)
	}
}

// TestNodeHealth: the nodes pane shows each node's CPU, memory and
// workers' memory, and a GPU's utilisation, power and temperature with its
// memory bar.
func TestNodeHealth(t *testing.T) {
	m := trainingJob(t, 2, 10, 140, 40)
	feed(m,
		ev(event.KindHealth, 12, func(e *event.Event) {
			e.Node = "gpu0"
			e.Health = &event.Health{CPUPercent: 42, Cores: 96, MemUsed: 100 << 30, MemTotal: 2 << 40, WorkersRSS: 20 << 30,
				GPUs: []event.GPUHealth{{Index: 3, UtilPercent: 98, MemUsed: 70 << 30, MemTotal: 80 << 30, PowerW: 612, TempC: 71}}}
		}),
		ev(event.KindMemory, 12, func(e *event.Event) {
			e.Node, e.Rank, e.Device, e.Used, e.Total = "gpu0", 1, 3, 70<<30, 80<<30
		}))
	press(m, "tab", "tab", "z") // the nodes pane, full screen
	out := m.Render()
	for _, s := range []string{"gpu0  cpu 42% of 96  mem 0.1/2.0 TiB  workers 20.0 GiB", "gpu3", "70.0/80.0 GiB 98% 612W 71°C", "localhost  cpu 87% of 16"} {
		if !strings.Contains(out, s) {
			t.Errorf("the nodes pane lacks %q:\n%s", s, out)
		}
	}
}

// TestReportKey: w on the dashboard writes the report picture, from every
// rank's kept steps, as 'gptui report' draws it.
func TestReportKey(t *testing.T) {
	m := trainingJob(t, 2, 50, 80, 24)
	m.opt.ReportPath = filepath.Join(t.TempDir(), "r.png")
	cmd := press(m, "w")
	if cmd == nil {
		t.Fatalf("w did nothing: %q", m.status)
	}
	m.Update(cmd())
	if !strings.Contains(m.status, "wrote "+m.opt.ReportPath+": 1200×900 pixels, 2 ranks") {
		t.Errorf("status %q", m.status)
	}
	f, err := os.Open(m.opt.ReportPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil || img.Bounds().Dx() != 1200 || img.Bounds().Dy() != 900 {
		t.Errorf("the picture: %v, %v", err, img)
	}
}

// ckptEvent is rank 0's checkpoint event at sec: state, of step, in dir.
func ckptEvent(sec float64, state string, step int, dir string) event.Event {
	return ev(event.KindCheckpoint, sec, func(e *event.Event) {
		e.Node, e.Rank, e.State, e.Checkpoint = "localhost", 0, state, &event.Checkpoint{Step: step, Dir: dir}
	})
}

// TestSummary: after the job, where its logs and newest checkpoint are.
func TestSummary(t *testing.T) {
	m := trainingJob(t, 2, 10, 80, 24)
	feed(m, ckptEvent(11, event.CheckpointSaved, 10, "output/step_00000010"))
	got := strings.Join(m.Summary(), "\n")
	for _, s := range []string{"the job's logs (workerlog.<rank>, metrics.<rank>.jsonl): localhost:log", "the newest checkpoint: localhost:output/step_00000010 (step 10)"} {
		if !strings.Contains(got, s) {
			t.Errorf("summary lacks %q:\n%s", s, got)
		}
	}
	if New(Options{}).Summary() != nil {
		t.Error("a summary without a job")
	}
	// Left running without a checkpoint (the UI detached): none yet, not
	// none at all.
	m = trainingJob(t, 2, 10, 80, 24)
	if got := strings.Join(m.Summary(), "\n"); !strings.Contains(got, "no checkpoint saved yet (the job runs on)") || strings.Contains(got, "no checkpoint was saved") {
		t.Errorf("the summary of a running job without a checkpoint:\n%s", got)
	}
}

// TestFrozenAgentDashboard: node2's agent falls silent while its ranks
// train on (the launcher says so): its ranks are shown "agent silent",
// never "silent" or lost, the nodes pane says the agent is silent and its
// ranks train on, and all is as before once the agent answers.
func TestFrozenAgentDashboard(t *testing.T) {
	m := trainingJobOn(t, 4, 60, 140, 40, twoNodes)
	var evs []event.Event
	for s := 61; s <= 66; s++ {
		for r := range 4 {
			if twoNodes(r) == "node1" || s <= 61 {
				evs = append(evs, progress(float64(s), twoNodes(r), r, s))
			}
		}
	}
	evs = append(evs,
		ev(event.KindNode, 64.5, func(e *event.Event) {
			e.Node, e.State, e.Message = "node2", event.NodeAgentSilent, "its agent has been silent for 3 s (no heartbeat): its ranks' state is unknown until it answers"
		}),
		ev(event.KindNode, 65.5, func(e *event.Event) {
			e.Node, e.State, e.Message = "node2", event.NodeAgentSilent, "its agent has been silent for 4 s, but its ranks train on: the other nodes' ranks, which move in step with them, have reached step 65"
		}))
	feed(m, evs...)
	m.Update(tickMsg(t0.Add(66 * time.Second)))
	out := m.Render()
	for _, want := range []string{"agent silent: its ranks train on", "agent silent"} {
		if !strings.Contains(out, want) {
			t.Errorf("the screen lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "silent 5") || strings.Contains(out, "lost") {
		t.Errorf("node2's ranks shown silent or lost while its agent is the one silent:\n%s", out)
	}
	if got := fmt.Sprint(states(m)); got != "[running running running running]" {
		t.Errorf("states %s, want every rank running", got)
	}
	feed(m, ev(event.KindNode, 67, func(e *event.Event) {
		e.Node, e.State, e.Message = "node2", event.NodeAgentBack, "its agent answers again, after 6 s of silence"
	}), progress(67, "node2", 2, 67), progress(67, "node2", 3, 67))
	m.Update(tickMsg(t0.Add(67 * time.Second)))
	if out := m.Render(); strings.Contains(out, "agent silent: its ranks") {
		t.Errorf("the agent answered, and the screen still says it is silent:\n%s", out)
	}
}

// TestCheckpointEventRows: the events pane's row of a checkpoint gives its
// step and folder when the event has no message of its own.
func TestCheckpointEventRows(t *testing.T) {
	for _, tt := range []struct {
		state, msg string
		c          *event.Checkpoint
		want       string
	}{
		{event.CheckpointSaved, "", &event.Checkpoint{Step: 8, Dir: "output/step_00000008"}, "step 8 in output/step_00000008"},
		{event.CheckpointSaving, "", &event.Checkpoint{Step: 12}, "step 12"},
		{event.CheckpointReplicated, "replica of output/step_00000008 from gpu0 in 0.1 s", &event.Checkpoint{Step: 8, Dir: "output/step_00000008"}, "replica of output/step_00000008 from gpu0 in 0.1 s"},
	} {
		e := ev(event.KindCheckpoint, 1, func(e *event.Event) {
			e.Node, e.Rank, e.State, e.Message, e.Checkpoint = "gpu0", 0, tt.state, tt.msg, tt.c
		})
		if got := rowOf(e).cause; got != tt.want {
			t.Errorf("%s: %q, want %q", tt.state, got, tt.want)
		}
	}
}
