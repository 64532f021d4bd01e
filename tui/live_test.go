package tui

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/sshexec"
)

// The dashboard's live truth: what it shows in the seconds that matter,
// against a fake clock (the events' times and the ticks).

// liveJob is a launched 4-rank local job of maxSteps steps on node1 and
// node2 that has started, with nothing logged yet.
func liveJob(t *testing.T, maxSteps int) *Model {
	t.Helper()
	t.Chdir(t.TempDir())
	over := []string{"Distributed.dp_degree=4", "Global.local_batch_size=1", "Global.micro_batch_size=1",
		"Global.global_batch_size=4", fmt.Sprintf("Engine.max_steps=%d", maxSteps)}
	m := launchedJob(t, 4, over, 0, 140, 40)
	evs := []event.Event{ev(event.KindJob, 0, func(e *event.Event) { e.State = event.JobStarted })}
	for r := range 4 {
		evs = append(evs, ev(event.KindWorker, 0.5, func(e *event.Event) {
			e.Node, e.Rank, e.State, e.Proc = twoNodes(r), r, event.WorkerRunning, &event.Proc{PID: 4200 + r}
		}))
	}
	feed(m, evs...)
	return m
}

// clock moves the model's clock to t0+sec.
func clock(m *Model, sec float64) {
	m.Update(tickMsg(t0.Add(time.Duration(sec * float64(time.Second)))))
}

// stepOf is one step of every rank, logged at sec: compute seconds of
// work each (by rank), the rest of step seconds in collectives.
func stepOf(sec float64, s int, step float64, compute func(r int) float64) []event.Event {
	var evs []event.Event
	for r := range 4 {
		evs = append(evs, ev(event.KindMetrics, sec, func(e *event.Event) {
			e.Node, e.Rank = twoNodes(r), r
			e.Metrics = &event.Metrics{Step: s, Loss: 5 - float64(s)/100, LR: 1e-3, GradNorm: 0.5, StepTimeS: step, CommS: step - compute(r), TokensPerS: 1000}
		}))
	}
	return evs
}

var etaRE = regexp.MustCompile(`ETA (?:(\d+)m)?(\d+)s`)

// eta returns the ETA the header shows, in seconds; -1 if none.
func eta(m *Model) float64 {
	mm := etaRE.FindStringSubmatch(m.Render())
	if mm == nil {
		return -1
	}
	min, _ := strconv.Atoi(mm[1])
	sec, _ := strconv.Atoi(mm[2])
	return float64(60*min + sec)
}

// TestETAAfterRestart: a 200-step job at a second a step is killed at step
// 40 and restarted from the checkpoint of step 35; the new attempt's
// agents send the records of steps 0–34 again at its start, in one burst
// (a record's step is 0-based, as the engine's), and its first step is
// step 35. The header
// stays at step 35 (it never goes back to step 1), and from the new
// attempt's first step on its ETA is within 25% of the time actually left
// (the old dashboard said 5 s at step 36, with 163 s left); the
// checkpoint resumed from is named, not "no checkpoint yet".
func TestETAAfterRestart(t *testing.T) {
	m := liveJob(t, 200)
	one := func(int) float64 { return 0.3 }
	for s := 1; s <= 40; s++ {
		feed(m, stepOf(float64(s), s, 1, one)...)
	}
	clock(m, 40)
	if got := eta(m); math.Abs(got-159) > 0.25*159 {
		t.Errorf("before the kill, at step 40: ETA %v s, want about 159", got)
	}
	feed(m,
		worker(40.5, "node2", 3, event.WorkerFailed, -1, "SIGKILL"),
		ev(event.KindJob, 41, func(e *event.Event) {
			e.State = event.JobRestarting
			e.Restart = &event.Restart{Count: 1, Max: 1, Cause: "rank 3 on node2 was killed by SIGKILL", Step: 35}
		}),
		ev(event.KindJob, 45, func(e *event.Event) { e.State = event.JobStarted }))
	var replay []event.Event
	for s := 0; s < 35; s++ {
		replay = append(replay, stepOf(46, s, 1, one)...)
	}
	feed(m, replay...)
	clock(m, 46)
	if out := m.Render(); !strings.Contains(out, "step 35/200 (resuming)") || headerStepOf(out) != 35 ||
		strings.Contains(out, "no checkpoint yet") || !strings.Contains(out, "checkpoint step 35") {
		t.Errorf("after the burst of old records, the header is not at step 35, resumed from its checkpoint:\n%s", out)
	}
	const end = 46 + 199 - 34 // the last step (199), at a second a step from the new attempt's start
	for s := 35; s < 60; s++ {
		sec := 46 + float64(s-34)
		feed(m, stepOf(sec, s, 1, one)...)
		clock(m, sec)
		left := end - sec
		if got := eta(m); math.Abs(got-left) > 0.25*left {
			t.Fatalf("step %d, %v s before the end: ETA %v s\n%s", s, left, got, m.Render())
		}
		if got := headerStepOf(m.Render()); got != s+1 {
			t.Fatalf("step %d: the header shows %d steps done, want %d", s, got, s+1)
		}
	}
}

// The header's elapsed time, and the current attempt's in its restart
// field.
var (
	elapsedRE = regexp.MustCompile(`elapsed (?:(\d+)m)?(\d+)s`)
	attemptRE = regexp.MustCompile(`this attempt (?:(\d+)m)?(\d+)s`)
)

// elapsedOf returns the job's and the attempt's elapsed seconds the
// header shows; -1 for one not shown.
func elapsedOf(scr string) (total, attempt float64) {
	secs := func(re *regexp.Regexp) float64 {
		mm := re.FindStringSubmatch(scr)
		if mm == nil {
			return -1
		}
		a, _ := strconv.Atoi(mm[1])
		b, _ := strconv.Atoi(mm[2])
		return float64(60*a + b)
	}
	return secs(elapsedRE), secs(attemptRE)
}

// TestClockAfterCLIRestart: a 200-step job at a second a step is stopped
// by its user at step 40 and lies stopped for a minute; then 'gptui
// restart' gives it a new supervisor, which writes a requested restart
// from the checkpoint of step 40 and starts the job again. While it is
// stopped its elapsed time stands and it has no ETA; after the restart the
// header names a manual restart (not "1/0"), its elapsed time is the
// time it ran — the minute it lay stopped left out — with the new
// attempt's own, and its ETA is within 25% of the time left.
func TestClockAfterCLIRestart(t *testing.T) {
	m := liveJob(t, 200)
	one := func(int) float64 { return 0.3 }
	for s := 1; s <= 40; s++ {
		feed(m, stepOf(float64(s), s, 1, one)...)
	}
	feed(m,
		ev(event.KindCheckpoint, 40.2, func(e *event.Event) {
			e.Node, e.Rank, e.State = "node1", 0, event.CheckpointSaved
			e.Checkpoint = &event.Checkpoint{Step: 40, Dir: "output/step_00000040"}
		}),
		ev(event.KindJob, 40.5, func(e *event.Event) { e.State, e.Message = event.JobStopped, "stopped by gptui stop" }))
	for _, at := range []float64{41, 70, 100} {
		clock(m, at)
		out := m.Render()
		if tot, att := elapsedOf(out); tot != 40 && tot != 41 || att != -1 {
			t.Errorf("stopped, at %vs: elapsed %v (attempt %v), want 40 s standing:\n%s", at, tot, att, out)
		}
		if eta(m) >= 0 || !strings.Contains(out, "job stopped") {
			t.Errorf("stopped, at %vs: an ETA, or not stopped:\n%s", at, out)
		}
	}
	// gptui restart at 100 s: the new supervisor's first events.
	feed(m,
		ev(event.KindJob, 100, func(e *event.Event) {
			e.State = event.JobRestarting
			e.Restart = &event.Restart{Count: 1, Requested: true, Cause: "restarted after its end (gptui restart)", Step: 40}
		}),
		ev(event.KindJob, 102, func(e *event.Event) { e.State = event.JobStarted }))
	var replay []event.Event
	for s := 1; s <= 40; s++ {
		replay = append(replay, stepOf(102.5, s, 1, one)...)
	}
	feed(m, replay...)
	clock(m, 103)
	out := m.Render()
	if !strings.Contains(out, "restart (manual) from step 40, this attempt 3s: restarted after its end (gptui restart)") || strings.Contains(out, "1/0") {
		t.Errorf("after gptui restart, the header does not name a manual restart:\n%s", out)
	}
	if tot, att := elapsedOf(out); math.Abs(tot-43.5) > 1 || math.Abs(att-3) > 1 {
		t.Errorf("at 103 s, 3 s after the restart: elapsed %v s (attempt %v s), want 43.5 (3):\n%s", tot, att, out)
	}
	const end = 102 + 200 - 40 // the last step, a second a step from the attempt's start
	for s := 41; s <= 60; s++ {
		sec := 102 + float64(s-40)
		feed(m, stepOf(sec, s, 1, one)...)
		clock(m, sec)
		out := m.Render()
		if tot, att := elapsedOf(out); math.Abs(tot-(sec-100+40.5)) > 1 || math.Abs(att-(sec-100)) > 1 {
			t.Fatalf("step %d at %v s: elapsed %v s (attempt %v s), want %v (%v):\n%s", s, sec, tot, att, sec-100+40.5, sec-100, out)
		}
		if left, got := end-sec, eta(m); math.Abs(got-left) > 0.25*left {
			t.Fatalf("step %d, %v s before the end: ETA %v s\n%s", s, left, got, out)
		}
	}
}

// headerStepOf returns the step the header shows, -1 if none.
func headerStepOf(scr string) int {
	mm := regexp.MustCompile(`step (\d+)/\d+`).FindStringSubmatch(scr)
	if mm == nil {
		return -1
	}
	n, _ := strconv.Atoi(mm[1])
	return n
}

// TestSilentAndStalled: rank 2 of a job stepping every 0.2 s is stopped
// for 3 s (SIGSTOP, then SIGCONT) while in a collective, so that no rank's
// compute time grows; its progress reports stop, the others' go on. Past
// two missed reports it is shown silent, in its row and in the header,
// and no other rank is named the slowest meanwhile; once it reports
// again, the header names it the slowest by its stall within 3 steps, and
// the ranks' states are running again.
func TestSilentAndStalled(t *testing.T) {
	m := liveJob(t, 1000)
	// Ranks within 10% of each other: none is named, never "×1.0".
	noise := func(s int) func(int) float64 {
		return func(r int) float64 { return 0.05 + 0.005*float64((r*7+s)%3) }
	}
	sec, s := 1.0, 0
	run := func(until float64, silent int) {
		for ; sec < until; sec += 0.2 {
			s++
			evs := stepOf(sec, s, 0.2, noise(s))
			if math.Abs(sec-math.Round(sec)) < 0.01 {
				for r := range 4 {
					if r != silent {
						evs = append(evs, progress(sec, twoNodes(r), r, s+1))
					}
				}
			}
			feed(m, evs...)
			clock(m, sec)
		}
	}
	run(10, -1)
	if out := m.Render(); strings.Contains(out, "slowest") || strings.Contains(out, "silent") {
		t.Fatalf("equal ranks: a slowest or silent rank named:\n%s", out)
	}
	// Stopped at 10.1 in the step's collective: no step is logged until
	// it goes on at 13.1; the others report their progress every second.
	stopped := s
	for _, tick := range []float64{11, 11.5, 12.5, 13} {
		var evs []event.Event
		if tick == math.Round(tick) {
			for _, r := range []int{0, 1, 3} {
				evs = append(evs, progress(tick, twoNodes(r), r, s+1))
			}
		}
		feed(m, evs...)
		clock(m, tick)
		out := m.Render()
		silent := tick-10 > 2
		if silent != strings.Contains(out, "rank 2 silent") || silent != strings.Contains(out, "ranks: 3 running · 1 silent") {
			t.Errorf("at %vs, %v s after rank 2's last report: silent %v?\n%s", tick, tick-10, silent, out)
		}
		if regexp.MustCompile(`slowest rank [013]`).MatchString(out) {
			t.Errorf("at %vs a healthy rank is named the slowest:\n%s", tick, out)
		}
		if paused := strings.Contains(out, "ETA paused"); silent != paused || silent && etaRE.MatchString(out) {
			t.Errorf("at %vs, rank 2 silent %v: the ETA is not paused just while it is:\n%s", tick, silent, out)
		}
	}
	if row := rankRowOf(m.Render(), 2); !strings.Contains(row, "silent 3s") {
		t.Errorf("rank 2's row %q, want silent 3s", row)
	}
	// It goes on: its report, then the step that waited for it, in which
	// every rank spent 3 s in the collective.
	feed(m, progress(13.1, twoNodes(2), 2, s+1))
	sec = 13.2
	s++
	feed(m, stepOf(sec, s, 3.2, noise(s))...)
	clock(m, sec)
	named := regexp.MustCompile(`slowest rank 2: stalled (\d+\.\d) s in step (\d+)`)
	for k := 0; ; k++ {
		out := m.Render()
		if mm := named.FindStringSubmatch(out); mm != nil {
			t.Logf("named %d steps after the stop: %s", s-stopped, mm[0])
			if d, _ := strconv.ParseFloat(mm[1], 64); d < 2 || d > 3.2 {
				t.Errorf("stalled %s s, want about 2–3 s (3 s less the report interval)", mm[1])
			}
			break
		}
		if s-stopped >= 3 {
			t.Fatalf("rank 2 not named 3 steps after its stop:\n%s", out)
		}
		run(sec+0.2, -1)
	}
	if out := m.Render(); !strings.Contains(out, "ranks: 4 running") || strings.Contains(out, "silent") {
		t.Errorf("after the stop, every rank runs again:\n%s", out)
	}
	// The stall is held stallHold; then ranks within noise name no one.
	run(13.2+stallHold.Seconds()+1, -1)
	if out := m.Render(); strings.Contains(out, "slowest") {
		t.Errorf("%v after the stall, a slowest rank is still named:\n%s", stallHold, out)
	}
}

// rankRowOf returns the ranks pane's row of rank r.
func rankRowOf(scr string, r int) string {
	return regexp.MustCompile(fmt.Sprintf(`(?m)^[ ›]%d +\S.*$`, r)).FindString(scr)
}

// TestLostThroughRestart: a lost node's ranks are lost, and stay lost
// through the restart that follows (not restarting, not stopped with the
// job) until the node is ready again; the other ranks stopped by the
// gang say why; the lost node's figures leave the nodes pane at once,
// and every figure once the job has ended.
func TestLostThroughRestart(t *testing.T) {
	m := liveJob(t, 100)
	for s := 1; s <= 20; s++ {
		feed(m, stepOf(float64(s), s, 1, func(int) float64 { return 0.3 })...)
	}
	onNodes := func(sec float64) {
		var evs []event.Event
		for r := range 4 {
			evs = append(evs, ev(event.KindMemory, sec, func(e *event.Event) {
				e.Node, e.Rank, e.Device, e.Used, e.Total = twoNodes(r), r, -1, 300<<20, 64<<30
				e.Proc = &event.Proc{PID: 4200 + r, CPUPercent: 99}
			}))
		}
		for _, n := range []string{"node1", "node2"} {
			evs = append(evs, ev(event.KindHealth, sec, func(e *event.Event) {
				e.Node, e.Health = n, &event.Health{CPUPercent: 50, Cores: 16, MemUsed: 1 << 30, MemTotal: 64 << 30}
			}))
		}
		feed(m, evs...)
	}
	onNodes(20)
	feed(m,
		ev(event.KindNode, 21, func(e *event.Event) {
			e.Node, e.State, e.Message = "node2", event.NodeLost, "its agent has been silent for 3 s"
		}),
		worker(21.2, "node1", 0, event.WorkerStopped, 1, ""),
		worker(21.2, "node1", 1, event.WorkerStopped, 1, ""))
	out := m.Render()
	if got := fmt.Sprint(states(m)); got != "[stopped stopped lost lost]" {
		t.Errorf("states %s", got)
	}
	if !strings.Contains(rankRowOf(out, 0), "stopped with the job because node node2 was lost") {
		t.Errorf("rank 0's row %q", rankRowOf(out, 0))
	}
	if strings.Contains(out, "node2  cpu") || strings.Contains(out, "r2 ") || !strings.Contains(out, "node2  lost: no reports") {
		t.Errorf("the lost node's figures stay:\n%s", out)
	}
	feed(m, ev(event.KindJob, 21.5, func(e *event.Event) {
		e.State = event.JobRestarting
		e.Restart = &event.Restart{Count: 1, Max: 1, Cause: "node node2 lost", Step: 20}
	}))
	if got := fmt.Sprint(states(m)); got != "[restarting restarting lost lost]" {
		t.Errorf("after the restart: states %s", got)
	}
	feed(m,
		ev(event.KindNode, 22, func(e *event.Event) { e.Node, e.State = "node2", event.NodeConnecting }),
		ev(event.KindNode, 23, func(e *event.Event) { e.Node, e.State, e.Message = "node2", event.NodeFailed, "connection refused" }),
		ev(event.KindJob, 26, func(e *event.Event) {
			e.State, e.Rank, e.Message = event.JobFailed, -1, "cluster: restart 1: node2: connection refused (3 tries; 1 node(s) would be left, --min-nodes 2)"
		}))
	out = m.Render()
	if got := fmt.Sprint(states(m)); got != "[stopped stopped lost lost]" {
		t.Errorf("after the restart failed: states %s", got)
	}
	// D is offered once the job's processes are gone, when it works.
	if !strings.Contains(rankRowOf(out, 0), "stopped: the restart failed") || strings.Contains(out, "D drops") {
		t.Errorf("after the restart failed, before the job's end:\n%s", out)
	}
	m.Update(eventsMsg{stream: m.jobN, closed: true})
	out = m.Render()
	if !strings.Contains(strings.Join(strings.Fields(out), " "), "D drops node2 and resumes on the nodes left") {
		t.Errorf("after the job's end:\n%s", out)
	}
	if strings.Contains(out, "cpu 50%") || strings.Contains(out, "300 MiB") || strings.Contains(out, "0.3/64.0 GiB") || strings.Contains(out, "99%") {
		t.Errorf("figures of processes that are gone:\n%s", out)
	}
	// Back (a probe's event, after the job's end): ready again, its
	// ranks start with the next attempt.
	m.dash.apply(ev(event.KindNode, 30, func(e *event.Event) { e.Node, e.State = "node2", event.NodeReady }), t0.Add(30*time.Second))
	if m.dash.nodesLeft() != 2 || len(m.dash.lostNodes()) != 0 {
		t.Errorf("node2 ready, still lost: %v", m.dash.lostNodes())
	}
}

// TestWideColumns: at 200 columns the collective column shows a stopped
// rank's whole reason, and at 80 columns the pane still fits.
func TestWideColumns(t *testing.T) {
	m := liveJob(t, 100)
	for s := 1; s <= 5; s++ {
		feed(m, stepOf(float64(s), s, 1, func(int) float64 { return 0.3 })...)
	}
	feed(m,
		ev(event.KindWorker, 6, func(e *event.Event) {
			e.Node, e.Rank, e.State, e.Code = "node2", 3, event.WorkerFailed, 2
			e.Exit = &event.Exit{Code: 2, Error: "fatal error: out of memory allocating 1.2 GB"}
		}),
		worker(6.1, "node1", 0, event.WorkerStopped, 1, ""))
	m.Update(tea.WindowSizeMsg{Width: 200, Height: 60})
	out := m.Render()
	for r, want := range map[int]string{0: "stopped with the job because rank 3 failed", 3: "exit code 2: fatal error: out of memory allocating 1.2 GB"} {
		if !strings.Contains(rankRowOf(out, r), want) {
			t.Errorf("at 200 columns, rank %d's row %q lacks %q", r, rankRowOf(out, r), want)
		}
	}
	m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
	if row := rankRowOf(m.Render(), 0); !strings.Contains(row, "stopped with the j") {
		t.Errorf("at 80 columns, rank 0's row %q", row)
	}
}

// TestJobRestartsAndDropNode: the Job screen's Restarts and Min nodes
// fields go with the job (--max-restarts, --min-nodes; a job that may
// shrink takes its ranks from its nodes at each attempt); after node2 is
// lost and the job fails, the UI's exit status would say so, D asks to
// drop node2, and yes resumes the job from its checkpoint on node1 alone,
// re-planned dp4 → dp2 with the global batch kept by accumulation, as a
// restart with --min-nodes 1 would.
func TestJobRestartsAndDropNode(t *testing.T) {
	t.Chdir(t.TempDir())
	l := &testLauncher{}
	var nodes []sshexec.Node
	for i, n := range []string{"node1", "node2"} {
		nodes = append(nodes, sshexec.Node{Name: n, Host: fmt.Sprintf("10.0.0.%d", 10+i), Devices: sshexec.Devices{CPU: 2}, Workdir: "w", Line: i + 1})
	}
	over := []string{"Distributed.dp_degree=4", "Global.global_batch_size=4", "Global.local_batch_size=1", "Global.micro_batch_size=1", "Engine.max_steps=100"}
	m := New(Options{Launcher: l, Nodes: nodes, Config: "tiny", Overrides: over})
	m.Update(tea.WindowSizeMsg{Width: 120, Height: 40})
	var evs []event.Event
	for _, n := range []string{"node1", "node2"} {
		evs = append(evs, ev(event.KindNode, 1, func(e *event.Event) {
			e.Node, e.State, e.Probe = n, event.NodeReady, &event.Probe{Hostname: n, OS: "linux/amd64", Cores: 4, MemBytes: 8 << 30}
		}))
	}
	m.Update(eventsMsg{stream: probeStream, events: evs})
	press(m, "3", "g", "j", "enter", "backspace", "'2", "enter", "j", "enter", "backspace", "'x", "enter")
	if !strings.Contains(m.status, "--min-nodes \"x\"") {
		t.Errorf("a bad --min-nodes: status %q", m.status)
	}
	press(m, "enter", "backspace", "'1", "enter")
	if scr := m.Render(); !strings.Contains(scr, "Restarts   2   --max-restarts: up to 2") || !strings.Contains(scr, "Min nodes  1   --min-nodes: 1: a restart leaves out") {
		t.Errorf("the Job screen's restart fields:\n%s", scr)
	}
	press(m, "G")
	cmd := press(m, "enter")
	if cmd == nil {
		t.Fatalf("launch: %q", m.status)
	}
	m.Update(cmd())
	j := l.jobs[0]
	if j.Restarts != (cluster.Restarts{Max: 2, MinNodes: 1}) || !j.Elastic || fmt.Sprint(j.Nodes) != "[node1 node2]" {
		t.Errorf("the job's restarts %+v, elastic %v, nodes %v", j.Restarts, j.Elastic, j.Nodes)
	}
	// The job loses node2, and cannot go on.
	evs = []event.Event{ev(event.KindJob, 2, func(e *event.Event) { e.State = event.JobStarted })}
	for r := range 4 {
		evs = append(evs, ev(event.KindWorker, 2, func(e *event.Event) {
			e.Node, e.Rank, e.State = []string{"node1", "node2"}[r/2], r, event.WorkerRunning
		}))
	}
	feed(m, evs...)
	press(m, "D")
	if !strings.Contains(m.status, "no node was lost") {
		t.Errorf("D with no node lost: %q", m.status)
	}
	feed(m, ev(event.KindNode, 10, func(e *event.Event) {
		e.Node, e.State, e.Message = "node2", event.NodeLost, "its agent has been silent for 3 s"
	}))
	press(m, "D")
	if !strings.Contains(m.status, "the job still runs") {
		t.Errorf("D while the job runs: %q", m.status)
	}
	feed(m,
		ev(event.KindNode, 14, func(e *event.Event) {
			e.Node, e.State, e.Message = "node1", event.NodeStopped, "setup stopped: node node2 failed"
		}),
		ev(event.KindJob, 15, func(e *event.Event) {
			e.State, e.Rank, e.Message = event.JobFailed, -1, "cluster: restart 2: node2: connection refused (3 tries; 0 node(s) would be left, --min-nodes 1)"
		}))
	m.Update(eventsMsg{stream: m.jobN, closed: true})
	if err := m.Err(); err == nil || !strings.Contains(err.Error(), "the job failed: restart 2: node2: connection refused") {
		t.Errorf("Err after the failed job: %v", err)
	}
	press(m, "D")
	q := ""
	if m.confirm != nil {
		q = m.confirm.question
	}
	if want := "Drop node2 and resume from the newest checkpoint on the nodes left (1 node, 2 ranks: dp4 mb1 → dp2 mb1, accumulate 2 (global batch 4 kept))?"; q != want {
		t.Fatalf("D asks %q, want %q (status %q)", q, want, m.status)
	}
	// node1's setup was stopped by the failed restart: it is set up
	// again for the job that continues the failed one (whose workdir
	// locks, kept for a restart that did not come, are then its own),
	// and then the job resumes; a try that fails is tried again.
	first := l.jobs[0].JobID
	clock(m, 16)
	press(m, "y")
	for try, state := range []string{event.NodeFailed, event.NodeReady} {
		if len(l.probes) != try+1 || fmt.Sprint(l.probes[try].Nodes) != "[node1]" || l.probes[try].Continues != first || m.drop.probe == 0 {
			t.Fatalf("try %d: probes %+v, status %q", try, l.probes, m.status)
		}
		m.Update(eventsMsg{stream: m.drop.probe, events: []event.Event{ev(event.KindNode, 20, func(e *event.Event) { e.Node, e.State = "node1", state })}})
		_, cmd = m.Update(eventsMsg{stream: m.drop.probe, closed: true})
		if cmd == nil {
			t.Fatalf("try %d: after the probe: %q", try, m.status)
		}
		if try == 0 {
			if !strings.Contains(m.status, "node1 failed: setting it up again in a moment") || len(l.jobs) != 1 {
				t.Errorf("after a failed try: status %q, %d jobs", m.status, len(l.jobs))
			}
			m.Update(dropRetryMsg{}) // the tick's
		}
	}
	m.Update(cmd())
	if len(l.jobs) != 2 {
		t.Fatalf("%d jobs started", len(l.jobs))
	}
	j = l.jobs[1]
	if j.Continues != first || j.JobID == first {
		t.Errorf("the resumed job %s continues %q, want the failed job %s", j.JobID, j.Continues, first)
	}
	if !j.Resume || fmt.Sprint(j.Nodes) != "[node1]" || j.Table.RankSize() != 2 || j.Resolved.Distributed.DPDegree != 2 ||
		j.Resolved.Global.GlobalBatchSize != 4 || j.Resolved.Global.LocalBatchSize != 2 || !slices.Contains(j.Overrides, "Distributed.dp_degree=2") {
		t.Errorf("the resumed job: resume %v nodes %v ranks %d dp %d batch %d/%d overrides %v", j.Resume, j.Nodes, j.Table.RankSize(),
			j.Resolved.Distributed.DPDegree, j.Resolved.Global.GlobalBatchSize, j.Resolved.Global.LocalBatchSize, j.Overrides)
	}
	if scr := m.Render(); !strings.Contains(scr, "job running") {
		t.Errorf("after the drop:\n%s", scr)
	}
	press(m, "1")
	if scr := m.Render(); !regexp.MustCompile(`node2 .* dropped`).MatchString(scr) {
		t.Errorf("the Nodes screen does not show node2 dropped:\n%s", scr)
	}
}
