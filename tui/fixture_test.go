package tui

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/sshexec"
)

// t0 is the clock of the fixtures' events: nothing in a golden file may
// depend on the time the test runs.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// keyMsg returns the key press that s names: "enter", "ctrl+c", "G", ...
func keyMsg(s string) tea.KeyPressMsg {
	switch s {
	case "enter":
		return tea.KeyPressMsg{Code: tea.KeyEnter}
	case "esc":
		return tea.KeyPressMsg{Code: tea.KeyEscape}
	case "tab":
		return tea.KeyPressMsg{Code: tea.KeyTab}
	case "shift+tab":
		return tea.KeyPressMsg{Code: tea.KeyTab, Mod: tea.ModShift}
	case "up":
		return tea.KeyPressMsg{Code: tea.KeyUp}
	case "down":
		return tea.KeyPressMsg{Code: tea.KeyDown}
	case "backspace":
		return tea.KeyPressMsg{Code: tea.KeyBackspace}
	case "ctrl+c":
		return tea.KeyPressMsg{Code: 'c', Mod: tea.ModCtrl}
	}
	r := []rune(s)[0]
	return tea.KeyPressMsg{Code: r, Text: s}
}

// press sends keys to m; each string is one key, except that a string
// starting with "'" types its remaining characters one by one. After each
// key the planner answers (settle), as the command Update returned would;
// press returns the last key's command.
func press(m *Model, keys ...string) tea.Cmd {
	var last tea.Cmd
	for _, k := range keys {
		if len(k) > 1 && k[0] == '\'' {
			for _, r := range k[1:] {
				_, last = m.Update(keyMsg(string(r)))
				settle(m)
			}
			continue
		}
		_, last = m.Update(keyMsg(k))
		settle(m)
	}
	return last
}

// feed sends events to m as the current job's stream would.
func feed(m *Model, evs ...event.Event) {
	m.Update(eventsMsg{stream: m.jobN, events: evs})
}

// ev makes an event at t0 plus sec seconds.
func ev(kind string, sec float64, f func(*event.Event)) event.Event {
	e := event.New(kind)
	e.Time = t0.Add(time.Duration(sec * float64(time.Second)))
	if f != nil {
		f(&e)
	}
	return e
}

// inventory returns n nodes named gpu0, gpu1, ... with 8 devices each.
func inventory(n int) []sshexec.Node {
	var nodes []sshexec.Node
	for i := range n {
		nodes = append(nodes, sshexec.Node{
			Name: fmt.Sprintf("gpu%d", i), Host: fmt.Sprintf("10.0.0.%d", 10+i), Port: 22,
			Devices: sshexec.Devices{IDs: []int{0, 1, 2, 3, 4, 5, 6, 7}}, Workdir: "~/.gptui", Line: i + 2,
		})
	}
	return nodes
}

// h100 is a probe of a node with eight H100s.
func h100(host string) *event.Probe {
	p := &event.Probe{Hostname: host, OS: "linux/amd64", Cores: 96, MemBytes: 2 << 40}
	for i := range 8 {
		p.Devices = append(p.Devices, event.Device{Index: i, Name: "NVIDIA H100 80GB HBM3", MemTotal: 80 << 30, MemFree: 79 << 30,
			PCIBusID: fmt.Sprintf("00000000:%02X:00.0", 0x18+i)})
	}
	return p
}

// probedNodes returns a model of four nodes in the states a probe leaves
// them: one ready, one connecting, one with an unknown host key, one
// unreachable.
func probedNodes(t testing.TB, w, h int) *Model {
	t.Helper()
	t.Chdir(t.TempDir()) // the rank table is written here, and its path shown
	m := New(Options{Nodes: inventory(4), Config: "13b-4node", Plan: fixturePlanner, Launcher: &testLauncher{}})
	m.Update(tea.WindowSizeMsg{Width: w, Height: h})
	m.Update(eventsMsg{stream: probeStream, events: []event.Event{
		ev(event.KindNode, 0, func(e *event.Event) { e.Node, e.State = "gpu0", event.NodeConnecting }),
		ev(event.KindNode, 0, func(e *event.Event) { e.Node, e.State = "gpu1", event.NodeConnecting }),
		ev(event.KindProbe, 1, func(e *event.Event) { e.Node, e.Probe = "gpu0", h100("gpu0") }),
		ev(event.KindNode, 1, func(e *event.Event) { e.Node, e.State = "gpu0", event.NodeReady }),
		ev(event.KindNode, 1, func(e *event.Event) {
			e.Node, e.State = "gpu2", event.NodeFailed
			e.Message = "unknown host key for 10.0.0.12:22 (SHA256:q3mC1Yv0m2dcrV8Zp0YQzWw4a3JvT9cK6k1eX7qzZ0A); verify it and rerun with --accept-new-host-keys"
			e.HostKey = &event.HostKey{Kind: "unknown", Fingerprint: "SHA256:q3mC1Yv0m2dcrV8Zp0YQzWw4a3JvT9cK6k1eX7qzZ0A"}
		}),
		ev(event.KindNode, 2, func(e *event.Event) {
			e.Node, e.State = "gpu3", event.NodeFailed
			e.Message = "dial tcp 10.0.0.13:22: connect: connection refused"
		}),
	}})
	settle(m)
	return m
}

// readyNodes returns a model of four nodes of eight H100s, all ready.
func readyNodes(t testing.TB, w, h int) *Model {
	t.Helper()
	t.Chdir(t.TempDir())
	m := New(Options{Nodes: inventory(4), Config: "13b-4node", Plan: fixturePlanner, Launcher: &testLauncher{}})
	m.Update(tea.WindowSizeMsg{Width: w, Height: h})
	var evs []event.Event
	for i := range 4 {
		name := fmt.Sprintf("gpu%d", i)
		evs = append(evs, ev(event.KindNode, 1, func(e *event.Event) { e.Node, e.State, e.Probe = name, event.NodeProbed, h100(name) }),
			ev(event.KindNode, 2, func(e *event.Event) { e.Node, e.State = name, event.NodeReady }))
	}
	m.Update(eventsMsg{stream: probeStream, events: evs})
	settle(m)
	return m
}

// settle runs the planner for the request the model asked about last, as
// the command Update returned would, so that the Job screen has its plans.
func settle(m *Model) {
	if !m.plan.pending() {
		return
	}
	req, key, _ := m.planRequest()
	if key != m.plan.asked {
		panic("settle: the request changed since it was asked")
	}
	r, err := m.opt.Plan(req)
	m.Update(planMsg{key: key, report: r, err: err})
}

// launchedJob returns a model of a local job of the tiny preset with
// overrides over on ranks CPU ranks, launched from the Job screen, at
// clock t0+now; its events are fed by the test.
func launchedJob(t testing.TB, ranks int, over []string, now time.Duration, w, h int) *Model {
	t.Helper()
	nodes := []sshexec.Node{{Name: "localhost", Host: "127.0.0.1", Local: true, Devices: sshexec.Devices{CPU: ranks}}}
	m := New(Options{Launcher: &testLauncher{}, Nodes: nodes, Config: "tiny", Overrides: over, LogLines: 500})
	m.Update(tea.WindowSizeMsg{Width: w, Height: h})
	m.Update(tickMsg(t0.Add(now)))
	m.Update(eventsMsg{stream: probeStream, events: []event.Event{
		ev(event.KindProbe, 0, func(e *event.Event) {
			e.Node = "localhost"
			e.Probe = &event.Probe{Hostname: "build1", OS: "linux/amd64", Cores: 16, MemBytes: 64 << 30, NoGPU: "no NVML"}
		}),
		ev(event.KindNode, 0, func(e *event.Event) { e.Node, e.State = "localhost", event.NodeReady }),
	}})
	cmd := press(m, "enter") // the Launch row is selected at first
	if cmd == nil {
		t.Fatalf("enter on Launch did nothing: %q", m.status)
	}
	m.Update(cmd())
	return m
}

// trainingJob returns a model of a 2-rank local job 120 steps into a
// 200-step run, with evaluations, memory and logs.
func trainingJob(t testing.TB, ranks, points, w, h int) *Model {
	t.Helper()
	return trainingJobOn(t, ranks, points, w, h, func(int) string { return "localhost" })
}

// twoNodes puts ranks 0–1 on node1 and the others on node2.
func twoNodes(r int) string { return []string{"node1", "node2"}[min(r/2, 1)] }

// trainingJobOn is trainingJob with the ranks on the nodes nodeOf says;
// pids 4200+rank.
func trainingJobOn(t testing.TB, ranks, points, w, h int, nodeOf func(rank int) string) *Model {
	t.Helper()
	over := []string{fmt.Sprintf("Distributed.dp_degree=%d", ranks), "Global.local_batch_size=1", "Global.micro_batch_size=1",
		fmt.Sprintf("Global.global_batch_size=%d", ranks), fmt.Sprintf("Engine.max_steps=%d", points*5/3)}
	t.Chdir(t.TempDir())
	m := launchedJob(t, ranks, over, time.Duration(points+1)*time.Second, w, h)
	var evs []event.Event
	evs = append(evs, ev(event.KindJob, 0, func(e *event.Event) { e.State = event.JobStarted }))
	for r := range ranks {
		evs = append(evs, ev(event.KindWorker, 0.5, func(e *event.Event) {
			e.Node, e.Rank, e.State = nodeOf(r), r, event.WorkerRunning
			e.Proc = &event.Proc{PID: 4200 + r}
		}))
	}
	for i := 1; i <= points; i++ {
		step := i
		loss := 4 + 6.8*math.Exp(-float64(step)/25) + 0.05*math.Sin(float64(step))
		for r := range ranks {
			if r >= 2 && step <= points-recentSteps {
				continue // the first two ranks log every step, the others only the last ones
			}
			// Rank 1 is the straggler: the others wait for it in their
			// collectives.
			comm := 0.10 + 0.002*float64((r*7+step)%5)
			if r == 1 {
				comm = 0.01
			}
			evs = append(evs, ev(event.KindMetrics, float64(step), func(e *event.Event) {
				e.Node, e.Rank = nodeOf(r), r
				e.Metrics = &event.Metrics{Step: step, Loss: loss, LR: 1e-3, GradNorm: 0.5, TokensPerS: 12345, StepTimeS: 0.25, CommS: comm, MFU: 0.0123}
			}))
		}
		if step%25 == 0 {
			evs = append(evs, ev(event.KindMetrics, float64(step), func(e *event.Event) {
				e.Node, e.Rank = nodeOf(0), 0
				e.Metrics = &event.Metrics{Step: step, Loss: loss, EvalLoss: loss + 0.2}
			}))
		}
	}
	var nodes []string
	for r := range ranks {
		if !slices.Contains(nodes, nodeOf(r)) {
			nodes = append(nodes, nodeOf(r))
		}
	}
	for _, n := range nodes {
		evs = append(evs, ev(event.KindHealth, 60, func(e *event.Event) {
			e.Node = n
			e.Health = &event.Health{CPUPercent: 87, Cores: 16, MemUsed: 12 << 30, MemTotal: 64 << 30, WorkersRSS: int64(ranks*300/len(nodes)) << 20}
		}))
	}
	for r := range ranks {
		evs = append(evs, ev(event.KindMemory, 60, func(e *event.Event) {
			e.Node, e.Rank, e.Device, e.Used, e.Total = nodeOf(r), r, -1, int64(300+10*r)<<20, 64<<30
			e.Proc = &event.Proc{PID: 4200 + r, CPUPercent: float64(95 + r)}
		}), ev(event.KindProgress, float64(points), func(e *event.Event) {
			e.Node, e.Rank = nodeOf(r), r
			e.Progress = &event.Progress{Step: points + 1, Ops: int64(2 * points), InFlight: []event.Op{{Group: "dp", Op: "AllReduce", Seq: int64(2*points + 1), WaitS: 0.2}}}
			if r == 1 {
				e.Progress.InFlight = nil
				e.Progress.Last = &event.Op{Group: "dp", Op: "AllReduce", Seq: int64(2 * points)}
			}
		}))
		for i := range 30 {
			evs = append(evs, ev(event.KindLog, 60, func(e *event.Event) {
				e.Node, e.Rank = nodeOf(r), r
				e.Line = fmt.Sprintf("[train] rank %d step %d loss %.4f lr 1.0e-03 tokens/s 12345", r, i*4, 10-float64(i)/10)
			}))
		}
	}
	feed(m, evs...)
	return m
}

// progress is rank's progress report on node at sec, in step, waiting
// in its all-reduce.
func progress(sec float64, node string, rank, step int) event.Event {
	return ev(event.KindProgress, sec, func(e *event.Event) {
		e.Node, e.Rank = node, rank
		e.Progress = &event.Progress{Step: step, Ops: int64(2 * step), InFlight: []event.Op{{Group: "dp", Op: "AllReduce", Seq: int64(2*step + 1), WaitS: 0.2}}}
	})
}

// silentRank is a 4-rank job 60 steps in whose rank 2 has sent no
// progress report for 5 s, at the clock of t0+66 s: the others report
// every second, waiting for it in their all-reduce.
func silentRank(t testing.TB, w, h int) *Model {
	m := trainingJobOn(t, 4, 60, w, h, twoNodes)
	var evs []event.Event
	for s := 61; s <= 66; s++ {
		for r := range 4 {
			if r != 2 || s <= 61 {
				evs = append(evs, progress(float64(s), twoNodes(r), r, 61))
			}
		}
	}
	feed(m, evs...)
	m.Update(tickMsg(t0.Add(66 * time.Second)))
	return m
}

// lostNode is a 4-rank job on node1 and node2 whose node2 was lost at
// step 60; the launcher's restart could not set it up again and, with
// --min-nodes 2, the job failed; its processes are gone.
func lostNode(t testing.TB, w, h int) *Model {
	m := trainingJobOn(t, 4, 60, w, h, twoNodes)
	silent := "its agent has been silent for 3 s (no heartbeat; the agent is stopped, frozen or cut off)"
	feed(m,
		ev(event.KindNode, 63, func(e *event.Event) { e.Node, e.State, e.Message = "node2", event.NodeLost, silent }),
		worker(63.2, "node1", 0, event.WorkerStopped, 143, ""),
		worker(63.2, "node1", 1, event.WorkerStopped, 143, ""),
		ev(event.KindJob, 63.5, func(e *event.Event) {
			e.State = event.JobRestarting
			e.Restart = &event.Restart{Count: 1, Max: 1, Cause: "node node2 lost: " + silent, Step: 55}
		}),
		ev(event.KindNode, 64, func(e *event.Event) { e.Node, e.State = "node1", event.NodeConnecting }),
		ev(event.KindNode, 64, func(e *event.Event) { e.Node, e.State = "node2", event.NodeConnecting }),
		ev(event.KindNode, 64.5, func(e *event.Event) { e.Node, e.State = "node1", event.NodeReady }),
		ev(event.KindNode, 64.5, func(e *event.Event) {
			e.Node, e.State, e.Message = "node2", event.NodeFailed, "dial tcp 10.0.0.12:22: connect: connection refused"
		}),
		ev(event.KindJob, 68, func(e *event.Event) {
			e.State, e.Rank = event.JobFailed, -1
			e.Message = "cluster: restart 1: node node2: dial tcp 10.0.0.12:22: connect: connection refused (3 tries; 1 node(s) would be left, --min-nodes 2)"
		}))
	m.Update(eventsMsg{stream: m.jobN, closed: true})
	m.Update(tickMsg(t0.Add(69 * time.Second)))
	return m
}

// restartedJob is a 4-rank job killed at step 60 (rank 3, SIGKILL),
// restarted by the launcher from step 55 (55 steps done) and 8 steps into
// its second attempt, its agents having sent the records of steps 0–54
// again at its start; the attempt's first step is step 55 (a record's
// step is 0-based, as the engine's: the record of step k is the (k+1)-th).
func restartedJob(t testing.TB, w, h int) *Model {
	m := trainingJobOn(t, 4, 60, w, h, twoNodes)
	feed(m,
		worker(60.5, "node2", 3, event.WorkerFailed, -1, "SIGKILL"),
		worker(60.6, "node2", 2, event.WorkerStopped, -1, "SIGTERM"),
		worker(60.7, "node1", 0, event.WorkerStopped, 143, ""),
		worker(60.7, "node1", 1, event.WorkerStopped, 143, ""),
		ev(event.KindJob, 61, func(e *event.Event) {
			e.State = event.JobRestarting
			e.Restart = &event.Restart{Count: 1, Max: 3, Cause: "rank 3 on node2 was killed by SIGKILL", Step: 55}
		}),
		ev(event.KindJob, 64, func(e *event.Event) {
			e.State, e.Message = event.JobStarted, "job 20260301-120000-1234-r1: 4 ranks on 2 nodes, MASTER_ADDR=10.0.0.10 MASTER_PORT=29500"
		}))
	var evs []event.Event
	for r := range 4 {
		evs = append(evs, worker(64.2, twoNodes(r), r, event.WorkerStarting, 0, ""))
	}
	for r := range 4 {
		evs = append(evs, ev(event.KindWorker, 64.5, func(e *event.Event) {
			e.Node, e.Rank, e.State, e.Proc = twoNodes(r), r, event.WorkerRunning, &event.Proc{PID: 4300 + r}
		}))
	}
	for r := range 4 { // the resumed run's metrics files, read again from the start
		for s := 0; s < 55; s++ {
			evs = append(evs, ev(event.KindMetrics, 66, func(e *event.Event) {
				e.Node, e.Rank = twoNodes(r), r
				e.Metrics = &event.Metrics{Step: s, Loss: 9, LR: 1e-3, StepTimeS: 0.25, CommS: 0.1, TokensPerS: 12345}
			}))
		}
	}
	for s := 55; s < 63; s++ {
		for r := range 4 {
			evs = append(evs, ev(event.KindMetrics, 68+2*float64(s-55), func(e *event.Event) {
				e.Node, e.Rank = twoNodes(r), r
				e.Metrics = &event.Metrics{Step: s, Loss: 4.5, LR: 1e-3, GradNorm: 0.4, StepTimeS: 1.9, CommS: 1.7, TokensPerS: 1620, MFU: 0.002}
			}), progress(68+2*float64(s-55), twoNodes(r), r, s+1))
		}
		if s == 59 {
			for r := range 4 {
				evs = append(evs, ev(event.KindMemory, 78, func(e *event.Event) {
					e.Node, e.Rank, e.Device, e.Used, e.Total = twoNodes(r), r, -1, int64(300+10*r)<<20, 64<<30
					e.Proc = &event.Proc{PID: 4300 + r, CPUPercent: float64(95 + r)}
				}))
			}
		}
	}
	feed(m, evs...)
	m.Update(tickMsg(t0.Add(83 * time.Second)))
	return m
}

// testLauncher is a Launcher whose jobs are fed by the test.
type testLauncher struct {
	mu     sync.Mutex
	jobs   []Job
	probes []ProbeRequest
	runner *testRunner
}

func (l *testLauncher) Probe(ctx context.Context, req ProbeRequest) <-chan event.Event {
	l.mu.Lock()
	l.probes = append(l.probes, req)
	l.mu.Unlock()
	ch := make(chan event.Event)
	close(ch)
	return ch
}

func (l *testLauncher) Start(ctx context.Context, job Job) (Runner, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.jobs = append(l.jobs, job)
	l.runner = &testRunner{ch: make(chan event.Event, 16)}
	return l.runner, nil
}

// testRunner records Stop; the test closes its channel to end the job.
type testRunner struct {
	ch      chan event.Event
	mu      sync.Mutex
	stopped int
}

func (r *testRunner) Events() <-chan event.Event { return r.ch }
func (r *testRunner) Stop() {
	r.mu.Lock()
	r.stopped++
	r.mu.Unlock()
}

// fixturePlans are the ranked plans of fixturePlanner: 13b-4node on 32
// H100s, in the figures 'gptui plan' prints, each with the overrides that
// select it (the config's own, dp4 mp2 pp4 mb1 full, needs none).
var fixturePlans = []PlanRow{
	{Strategy: "sharding8/s1 mp4 mb2 only_attn", MemBytes: 61.41e9, StepS: 4.214, TokensPerS: 46655, MFU: 0.283, Bubble: -1, CommS: 0.618,
		Overrides: []string{"Distributed.dp_degree=1", "Distributed.mp_degree=4", "Distributed.pp_degree=1", "Distributed.sharding.sharding_degree=8",
			"Global.local_batch_size=12", "Global.micro_batch_size=2", "Engine.recompute_granularity=only_attn"}},
	{Strategy: "sharding4/s1 mp8 mb2", MemBytes: 58.02e9, StepS: 4.301, TokensPerS: 45712, MFU: 0.277, Bubble: -1, CommS: 0.267,
		Overrides: []string{"Distributed.dp_degree=1", "Distributed.mp_degree=8", "Distributed.pp_degree=1", "Distributed.sharding.sharding_degree=4",
			"Global.local_batch_size=24", "Global.micro_batch_size=2", "Engine.use_recompute=false"}},
	{Strategy: "dp4 mp2 pp4 mb1 full", MemBytes: 30.12e9, StepS: 4.877, TokensPerS: 40314, MFU: 0.244, Bubble: 0.125, CommS: 0.410, Overrides: []string{}},
	{Strategy: "dp2 mp4 pp4 mb1 full", MemBytes: 19.77e9, StepS: 5.012, TokensPerS: 39228, MFU: 0.238, Bubble: 0.0625, CommS: 0.702,
		Overrides: []string{"Distributed.dp_degree=2", "Distributed.mp_degree=4", "Global.local_batch_size=48"}},
	{Strategy: "dp8 mp4 mb1 full", MemBytes: 40.66e9, StepS: 5.093, TokensPerS: 38604, MFU: 0.234, Bubble: -1, CommS: 0.851,
		Overrides: []string{"Distributed.dp_degree=8", "Distributed.mp_degree=4", "Distributed.pp_degree=1", "Global.local_batch_size=12"}},
	{Strategy: "dp4 mp8 mb1 full", MemBytes: 29.31e9, StepS: 5.270, TokensPerS: 37308, MFU: 0.226, Bubble: -1, CommS: 1.034,
		Overrides: []string{"Distributed.mp_degree=8", "Distributed.pp_degree=1"}},
	{Strategy: "dp2 mp2 pp8 mb1 full", MemBytes: 16.40e9, StepS: 5.618, TokensPerS: 34998, MFU: 0.212, Bubble: 0.146, CommS: 0.355,
		Overrides: []string{"Distributed.dp_degree=2", "Distributed.pp_degree=8", "Global.local_batch_size=48"}},
	{Strategy: "dp4 pp8 mb1 full", MemBytes: 25.95e9, StepS: 6.145, TokensPerS: 31997, MFU: 0.194, Bubble: 0.292, CommS: 0.201,
		Overrides: []string{"Distributed.mp_degree=1", "Distributed.pp_degree=8"}},
	{Strategy: "mp8 pp4 mb1 full", MemBytes: 12.88e9, StepS: 6.730, TokensPerS: 29214, MFU: 0.177, Bubble: 0.031, CommS: 1.390,
		Overrides: []string{"Distributed.dp_degree=1", "Distributed.mp_degree=8", "Global.local_batch_size=96"}},
}

// fixturePlanner answers as cmd/gptui's planner would for 13b-4node on 32
// H100s, marking the plan whose overrides the job has as the config's.
func fixturePlanner(req PlanRequest) (*PlanReport, error) {
	r := &PlanReport{
		Fits:     true,
		Rejected: 3023,
		Reasons:  "2950 out of memory, 73 pipeline never fills",
		Command:  "gptui plan -c 13b-4node --nodes 4 --devices-per-node 8 --device h100-80g --top 0",
		Note:     "links: 350.00 GB/s inside a node (built-in), 40.00 GB/s between nodes (built-in)",
	}
	place := "not among the plans"
	for i, p := range fixturePlans {
		p.Current = slices.Equal(p.Overrides, req.Overrides) || (len(p.Overrides) == 0 && len(req.Overrides) == 0)
		if p.Current {
			place = fmt.Sprintf("plan %d of %d", i+1, len(fixturePlans))
		}
		r.Plans = append(r.Plans, p)
	}
	d := req.Resolved.Distributed
	r.Estimate = []string{
		fmt.Sprintf("config's strategy dp%d mp%d pp%d: 29.3/80.0 GiB per device, step 4.877 s, %s", d.DPDegree, d.MPDegree, d.PPDegree, place),
		"on 4 node(s) × 8 H100-80G, per device: params 6.0 GiB, grads 6.0 GiB, optimizer 4.5 GiB, activations 11.1 GiB, scratch 1.2 GiB, other 515 MiB",
	}
	return r, nil
}
