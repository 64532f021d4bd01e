package tui

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/ranktable"
)

// isQuit reports whether cmd quits the program.
func isQuit(cmd tea.Cmd) bool {
	if cmd == nil {
		return false
	}
	_, ok := cmd().(tea.QuitMsg)
	return ok
}

func TestNodesProbe(t *testing.T) {
	m := probedNodes(t, 80, 24)
	want := map[string]string{"gpu0": "ready", "gpu1": "connecting", "gpu2": "host key", "gpu3": "failed"}
	for _, r := range m.nodes.rows {
		if got := r.stateText(); got != want[r.node.Name] {
			t.Errorf("%s: state %q, want %q", r.node.Name, got, want[r.node.Name])
		}
	}
	if got := m.nodes.rows[0].devicesText(); got != "8× NVIDIA H100 80GB HBM3 80.0 GiB" {
		t.Errorf("gpu0 devices %q", got)
	}
	// A node the inventory does not list still gets a row.
	m.Update(eventsMsg{stream: probeStream, events: []event.Event{
		ev(event.KindNode, 3, func(e *event.Event) { e.Node, e.State, e.Message = "extra", event.NodeLost, "connection reset" }),
	}})
	// The cluster runner sends the probe on its node event.
	m.Update(eventsMsg{stream: probeStream, events: []event.Event{
		ev(event.KindNode, 3, func(e *event.Event) { e.Node, e.State, e.Probe = "gpu1", event.NodeProbed, h100("gpu1") }),
		ev(event.KindJob, 3, func(e *event.Event) { e.State, e.Message = event.JobFailed, "hosts.txt:3: node gpu1 has no data/train" }),
		ev(event.KindNode, 4, func(e *event.Event) { e.Node, e.State = "gpu1", event.NodeReady }),
	}, closed: true})
	if m.nodes.rows[1].probe == nil || !strings.Contains(m.status, "probe: hosts.txt:3: node gpu1 has no data/train") {
		t.Errorf("probe on a node event: %v, status %q", m.nodes.rows[1].probe, m.status)
	}
	if s := m.nodes.rows[1].stateText(); s != "ready" {
		t.Errorf("gpu1 after ready: %q", s)
	}
	if n := len(m.nodes.rows); n != 5 || m.nodes.rows[4].state != event.NodeLost {
		t.Errorf("rows %d, want the unlisted node added as lost", n)
	}

	// The host-key row opens to its fingerprint and what to do.
	press(m, "j", "j", "enter")
	out := m.Render()
	for _, s := range []string{"SHA256:q3mC1Yv0m2dcrV8Zp0YQzWw4a3JvT9cK6k1eX7qzZ0A", "ssh-keyscan 10.0.0.12 >> ~/.ssh/known_hosts"} {
		if !strings.Contains(out, s) {
			t.Errorf("host-key detail lacks %q:\n%s", s, out)
		}
	}
	press(m, "esc")
	if m.nodes.detail {
		t.Error("esc did not close the detail")
	}

	// '/' filters.
	press(m, "/", "'refused", "enter")
	if v := m.nodes.visible(); len(v) != 1 || m.nodes.rows[v[0]].node.Name != "gpu3" {
		t.Errorf("filter 'refused' shows %v", v)
	}
	press(m, "esc")
	if m.nodes.filter != "" {
		t.Error("esc did not clear the filter")
	}
}

func TestHostKeyChanged(t *testing.T) {
	r := nodeRow{msg: "host key for 10.0.0.12:22 changed: known SHA256:old, offered SHA256:new; if the node was reinstalled, remove its line from /root/.ssh/known_hosts (line 3)",
		hostKey: &event.HostKey{Kind: "changed", Fingerprint: "SHA256:new", Known: "SHA256:old"}}
	r.node.Host, r.node.Port, r.state = "10.0.0.12", 2222, event.NodeFailed
	adv := strings.Join(r.hostKeyAdvice(), "\n")
	if !strings.Contains(adv, "SHA256:new") || !strings.Contains(adv, "ssh-keygen -R [10.0.0.12]:2222") {
		t.Errorf("advice for a changed key:\n%s", adv)
	}
}

func TestRankTableEditAndWrite(t *testing.T) {
	m := readyNodes(t, 80, 24)
	press(m, "2")
	if n := m.rankTable.table(m.nodes.rows).RankSize(); n != 32 {
		t.Fatalf("world size %d, want 32", n)
	}
	// Bad input is one line naming the node, and changes nothing.
	press(m, "j", "enter", "backspace", "backspace", "backspace", "'0-x", "enter")
	if !strings.Contains(m.status, "devices for gpu1") {
		t.Errorf("status after a bad range: %q", m.status)
	}
	press(m, "enter", "backspace", "backspace", "backspace", "'0-3", "enter")
	tab := m.rankTable.table(m.nodes.rows)
	if n := tab.RankSize(); n != 28 {
		t.Errorf("world size %d after gpu1 0-3, want 28", n)
	}
	if lo, hi := tab.DeviceRange(2); lo != 12 || hi != 20 {
		t.Errorf("gpu2 ranks [%d,%d), want [12,20)", lo, hi)
	}
	press(m, "w")
	got, err := ranktable.Read(m.rankTable.at)
	if err != nil {
		t.Fatal(err)
	}
	if got.RankSize() != 28 || got.Servers[1].ServerID != "10.0.0.11" || len(got.Servers[1].Devices) != 4 {
		t.Errorf("written table: %+v", got)
	}
	if errs := ranktable.Check(got); len(errs) > 0 {
		t.Errorf("written table does not check: %v", errs)
	}
	if !strings.Contains(m.Render(), "saved in rank_table.json") {
		t.Error("the screen does not say the table is saved")
	}
}

func TestJobOverridesAndLaunch(t *testing.T) {
	l := &testLauncher{}
	m := New(Options{Launcher: l, Nodes: inventory(1), Config: "tiny"})
	t.Chdir(t.TempDir())
	m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
	press(m, "3")
	// Nothing launches before the node is ready.
	press(m, "enter")
	if !strings.Contains(m.status, "every node must be ready, and gpu0 waiting") || len(l.jobs) != 0 {
		t.Fatalf("launch before the node is ready: status %q, %d jobs", m.status, len(l.jobs))
	}
	m.Update(eventsMsg{stream: probeStream, events: []event.Event{
		ev(event.KindNode, 1, func(e *event.Event) { e.Node, e.State, e.Probe = "gpu0", event.NodeReady, h100("gpu0") }),
	}})
	if got := m.job.ranks(); got != 1 {
		t.Fatalf("tiny: %d ranks", got)
	}
	// The table has 8 ranks: launching is refused until they agree.
	press(m, "enter")
	if !strings.Contains(m.status, "needs 1 ranks, the rank table has 8") || len(l.jobs) != 0 {
		t.Fatalf("launch with a mismatch: status %q, %d jobs", m.status, len(l.jobs))
	}
	for _, o := range []string{"Distributed.dp_degree=8", "Global.global_batch_size=8", "Global.local_batch_size=1", "Global.micro_batch_size=1"} {
		press(m, "a", "'"+o, "enter")
	}
	if m.job.err != nil || m.job.ranks() != 8 {
		t.Fatalf("after overrides: ranks %d, err %v", m.job.ranks(), m.job.err)
	}
	if !strings.Contains(m.Render(), "dp 8 × sharding 1 (stage 1) × mp 1 × pp 1 = 8 ranks · rank table: 8 ✓") {
		t.Errorf("strategy not shown:\n%s", m.Render())
	}
	// A bad override is named; deleting it restores the config.
	press(m, "a", "'Model.no_such_key=1", "enter")
	if m.job.err == nil || !strings.Contains(m.job.err.Error(), "no_such_key") {
		t.Errorf("bad key: %v", m.job.err)
	}
	press(m, "d") // the new override's row is selected
	if m.job.err != nil || len(m.job.overrides) != 4 {
		t.Errorf("after delete: %v, %v", m.job.overrides, m.job.err)
	}
	press(m, "a", "'nonsense", "enter")
	if !strings.Contains(m.status, "want Section.key=value") {
		t.Errorf("status %q", m.status)
	}

	press(m, "G")
	cmd := press(m, "enter")
	if cmd == nil || m.screen != screenDash || !m.launching {
		t.Fatalf("launch: screen %d launching %v status %q", m.screen, m.launching, m.status)
	}
	m.Update(cmd())
	if len(l.jobs) != 1 || m.runner == nil {
		t.Fatalf("Start called %d times", len(l.jobs))
	}
	j := l.jobs[0]
	if j.Config != "tiny" || len(j.Overrides) != 4 || j.Table.RankSize() != 8 || j.Resume || j.Resolved.Distributed.DPDegree != 8 {
		t.Errorf("job %+v", j)
	}
	if _, err := ranktable.Read(j.TablePath); err != nil {
		t.Errorf("launch did not write the rank table: %v", err)
	}
}

func TestDashboardEvents(t *testing.T) {
	m := trainingJob(t, 4, 120, 80, 24)
	d := &m.dash
	if d.lead().last.Step != 120 || d.charted != 0 || len(d.train.pts) != 120 || len(d.eval.pts) != 4 {
		t.Errorf("metrics: step %d rank %d train %d eval %d", d.lead().last.Step, d.charted, len(d.train.pts), len(d.eval.pts))
	}
	// Rank 1's metrics do not add points while rank 0 sends them.
	feed(m, ev(event.KindMetrics, 121, func(e *event.Event) {
		e.Rank, e.Metrics = 1, &event.Metrics{Step: 121, Loss: 99}
	}))
	if p, _ := d.train.last(); p.step != 120 || d.lead().last.Step != 120 {
		t.Errorf("rank 1's metrics charted")
	}
	if len(d.mem) != 4 || d.mem[3].used != 330<<20 {
		t.Errorf("memory rows %+v", d.mem)
	}
	m.Update(tea.WindowSizeMsg{Width: 140, Height: 40})
	out := m.Render()
	for _, s := range []string{"loss 4.0850", "12.3k tok/s", "MFU 1.2%", "ETA 1m19s", "step 121/200", "ranks: 4 running", "r3", "0.3/64.0 GiB", "300 MiB", "rank 0 step 116 loss"} {
		if !strings.Contains(out, s) {
			t.Errorf("dashboard lacks %q:\n%s", s, out)
		}
	}

	// Workers end; the job fails naming rank 2.
	feed(m,
		ev(event.KindWorker, 130, func(e *event.Event) {
			e.Node, e.Rank, e.State, e.Signal = "localhost", 2, event.WorkerFailed, "SIGSEGV"
		}),
		ev(event.KindJob, 131, func(e *event.Event) {
			e.State, e.Rank, e.Node, e.Tail = event.JobFailed, 2, "localhost", []string{"unexpected fault address 0x0"}
		}))
	out = m.Render()
	if !strings.Contains(out, "rank 2 on localhost failed: killed by SIGSEGV") || !strings.Contains(out, "unexpected fault address") {
		t.Errorf("no failure banner:\n%s", out)
	}
	if d.sel != 2 || !strings.Contains(out, "Log  rank 2") {
		t.Errorf("the failed rank's log is not shown (rank %d)", d.sel)
	}
	if !strings.Contains(out, "elapsed 2m11s") {
		t.Errorf("elapsed time from the events' clock missing:\n%s", out)
	}
	press(m, "esc")
	if strings.Contains(m.Render(), "failed: killed") {
		t.Error("esc did not hide the banner")
	}
	// The stream ends: the job is over, and quitting needs no question.
	m.Update(eventsMsg{stream: m.jobN, closed: true})
	if m.runner != nil {
		t.Error("runner kept after its stream closed")
	}
	if !isQuit(press(m, "q")) {
		t.Error("q after the job ended did not quit")
	}
}

func TestDashboardLogFollowAndSearch(t *testing.T) {
	m := trainingJob(t, 2, 50, 80, 24)
	d := &m.dash
	if !d.follow || d.focus != paneLog {
		t.Fatalf("follow %v focus %d", d.follow, d.focus)
	}
	press(m, "k", "k", "k")
	if d.follow || d.logOff != 3 {
		t.Errorf("after k×3: follow %v off %d", d.follow, d.logOff)
	}
	// New lines do not move a scrolled view.
	feed(m, ev(event.KindLog, 70, func(e *event.Event) { e.Rank, e.Line = 0, "a new line" }))
	if d.logOff != 4 || strings.Contains(m.Render(), "a new line") {
		t.Errorf("scrolled view moved: off %d", d.logOff)
	}
	press(m, "G")
	if !d.follow || d.logOff != 0 || !strings.Contains(m.Render(), "a new line") {
		t.Errorf("G: follow %v off %d", d.follow, d.logOff)
	}
	press(m, "/", "'step 40 ", "enter")
	if d.search != "step 40 " || d.follow || !strings.Contains(m.Render(), "▸[train] rank 0 step 40 loss") {
		t.Errorf("search: %q follow %v\n%s", d.search, d.follow, m.Render())
	}
	press(m, "/", "backspace", "backspace", "backspace", "backspace", "backspace", "backspace", "backspace", "backspace", "'step 1", "enter")
	first := d.logOff
	press(m, "n")
	if d.logOff <= first {
		t.Errorf("n did not go to an older match: %d then %d", first, d.logOff)
	}
	press(m, "N")
	if d.logOff != first {
		t.Errorf("N did not come back: %d, want %d", d.logOff, first)
	}
	press(m, "/", "'no such text", "enter")
	if !strings.Contains(m.status, "is not in rank 0's log") {
		t.Errorf("status %q", m.status)
	}
	// tab moves the focus; in the ranks pane, j picks rank 1's log.
	press(m, "esc", "tab", "tab", "tab")
	if d.focus != paneRanks {
		t.Fatalf("focus %d after 3 tabs", d.focus)
	}
	press(m, "j", "enter")
	if d.sel != 1 || d.focus != paneLog || !strings.Contains(m.Render(), "rank 1 step 116") {
		t.Errorf("rank 1's log not shown: sel %d focus %d", d.sel, d.focus)
	}
	press(m, "shift+tab")
	if d.focus != paneEvents {
		t.Errorf("shift+tab: focus %d, want the events pane", d.focus)
	}
	press(m, "shift+tab")
	if d.focus != paneRanks {
		t.Errorf("shift+tab twice: focus %d", d.focus)
	}
}

func TestResize(t *testing.T) {
	m := trainingJob(t, 8, 200, 80, 24)
	for _, sz := range [][2]int{{140, 40}, {80, 24}, {100, 30}, {60, 15}, {200, 60}} {
		m.Update(tea.WindowSizeMsg{Width: sz[0], Height: sz[1]})
		for _, s := range []int{screenNodes, screenRanks, screenJob, screenDash} {
			m.screen = s
			lines := strings.Split(m.Render(), "\n")
			if len(lines) != sz[1] {
				t.Errorf("%v screen %d: %d lines", sz, s, len(lines))
			}
			for i, l := range lines {
				if n := len([]rune(l)); n != sz[0] {
					t.Errorf("%v screen %d line %d: %d cells", sz, s, i, n)
					break
				}
			}
		}
	}
}

func TestQuitStopsTheJob(t *testing.T) {
	m := trainingJob(t, 2, 10, 80, 24)
	r := m.runner.(*testRunner)
	if isQuit(press(m, "q")) || m.confirm == nil {
		t.Fatal("q while a job runs quit without asking")
	}
	press(m, "n")
	if m.confirm != nil || r.stopped != 0 {
		t.Fatal("n did not cancel")
	}
	press(m, "q")
	cmd := press(m, "y")
	if cmd == nil {
		t.Fatal("y did nothing")
	}
	cmd()
	if r.stopped != 1 || !m.quitting || !strings.Contains(m.Render(), "job stopping") {
		t.Fatalf("stopped %d quitting %v", r.stopped, m.quitting)
	}
	// The workers are gone when the stream ends: then the UI quits.
	_, cmd = m.Update(eventsMsg{stream: m.jobN, events: []event.Event{ev(event.KindJob, 20, func(e *event.Event) { e.State = event.JobStopped })}, closed: true})
	if !isQuit(cmd) {
		t.Fatal("the UI did not quit once the job stopped")
	}
}

func TestCtrlC(t *testing.T) {
	m := trainingJob(t, 2, 10, 80, 24)
	r := m.runner.(*testRunner)
	press(m, "ctrl+c")
	if m.confirm == nil {
		t.Fatal("ctrl+c while a job runs quit without asking")
	}
	press(m, "ctrl+c")()
	if r.stopped != 1 || !m.quitting {
		t.Fatalf("a second ctrl+c did not stop the job: stopped %d", r.stopped)
	}
	// A third does not wait for the workers; the caller stops them.
	if !isQuit(press(m, "ctrl+c")) || m.Runner() == nil {
		t.Fatal("a third ctrl+c did not quit at once, leaving the runner to the caller")
	}
}

func TestStopAndRestart(t *testing.T) {
	m := trainingJob(t, 2, 30, 80, 24)
	l := m.opt.Launcher.(*testLauncher)
	r := l.runner
	press(m, "s")
	if m.confirm == nil || !strings.Contains(m.Render(), "Stop the job?") {
		t.Fatal("s did not ask")
	}
	press(m, "y")()
	if r.stopped != 1 {
		t.Fatal("Stop not called")
	}
	m.Update(eventsMsg{stream: m.jobN, closed: true})
	if m.dash.state != event.JobStopped {
		t.Errorf("state %q", m.dash.state)
	}
	press(m, "r")
	cmd := press(m, "y")
	if cmd == nil {
		t.Fatal("restart did nothing")
	}
	m.Update(cmd())
	if len(l.jobs) != 2 || !l.jobs[1].Resume {
		t.Fatalf("jobs %+v", l.jobs)
	}
	if len(m.dash.train.pts) != 30 {
		t.Errorf("the resumed job lost the curve: %d points", len(m.dash.train.pts))
	}
	// Steps from the checkpoint on replace the ones after it.
	feed(m, ev(event.KindMetrics, 200, func(e *event.Event) { e.Rank, e.Metrics = 0, &event.Metrics{Step: 21, Loss: 5} }))
	if p, _ := m.dash.train.last(); len(m.dash.train.pts) != 21 || p.step != 21 {
		t.Errorf("after resuming at 21: %d points, last %v", len(m.dash.train.pts), p)
	}
}

func TestBoundedHistory(t *testing.T) {
	s := newSeries[point](100)
	for i := 1; i <= 100000; i++ {
		s.add(point{i, float64(i)})
		if len(s.pts) > 100 {
			t.Fatalf("%d points held at step %d", len(s.pts), i)
		}
	}
	if s.pts[0].step != 1 || s.pts[len(s.pts)-1].step < 99000 {
		t.Errorf("the curve lost its ends: %v … %v", s.pts[0], s.pts[len(s.pts)-1])
	}
	r := newRing(3)
	for i := range 10 {
		r.add(fmt.Sprint(i))
	}
	if r.len() != 3 || r.at(0) != "7" || r.at(2) != "9" || r.total != 10 {
		t.Errorf("ring: %v", r.lines)
	}
	// The dashboard's logs stay within LogLines per rank.
	m := trainingJob(t, 1, 5, 80, 24)
	for i := range 2000 {
		feed(m, ev(event.KindLog, 9, func(e *event.Event) { e.Rank, e.Line = 0, fmt.Sprint("line ", i) }))
	}
	if n := m.dash.logs[0].len(); n != 500 {
		t.Errorf("rank 0 holds %d lines, want 500", n)
	}
	// A rank number out of bounds is ignored.
	feed(m, ev(event.KindLog, 9, func(e *event.Event) { e.Rank, e.Line = 1<<30, "x" }))
	if len(m.dash.ranks) > maxRanks {
		t.Error("a bogus rank grew the table")
	}
}

func TestOutsideText(t *testing.T) {
	m := trainingJob(t, 1, 5, 80, 24)
	feed(m, ev(event.KindLog, 9, func(e *event.Event) { e.Rank, e.Line = 0, "\x1b[31mred\x1b[0m\tand a tab\r" }))
	if got := m.dash.logs[0].at(m.dash.logs[0].len() - 1); got != "red    and a tab " {
		t.Errorf("cleaned line %q", got)
	}
	m.Update(eventsMsg{stream: probeStream, events: []event.Event{
		ev(event.KindNode, 1, func(e *event.Event) { e.Node, e.State, e.Message = "localhost", event.NodeFailed, "line one\nline two" }),
	}})
	press(m, "1")
	if !strings.Contains(m.Render(), "line one line two") {
		t.Errorf("the message is not on one line:\n%s", m.Render())
	}
	for i, l := range strings.Split(m.Render(), "\n") {
		if len([]rune(l)) != 80 {
			t.Errorf("line %d is %d cells: %q", i, len([]rune(l)), l)
		}
	}
}

func TestHelp(t *testing.T) {
	m := probedNodes(t, 80, 24)
	press(m, "?")
	if !m.help || !strings.Contains(m.Render(), "restart from checkpoint") {
		t.Fatal("? did not show the keys")
	}
	if isQuit(press(m, "q")) || m.help {
		t.Fatal("q in the help should close it, not quit")
	}
	if !isQuit(press(m, "q")) {
		t.Fatal("q without a job did not quit")
	}
}

func TestLaunchError(t *testing.T) {
	m := trainingJob(t, 1, 5, 80, 24)
	m.Update(eventsMsg{stream: m.jobN, closed: true})
	press(m, "3", "enter")
	m.Update(startedMsg{job: m.jobN, err: fmt.Errorf("no agent")})
	if m.busy() || !strings.Contains(m.Render(), "✗ the job failed: launch: no agent") {
		t.Errorf("a failed Start is not shown:\n%s", m.Render())
	}
}

func TestNoColour(t *testing.T) {
	// The input line is plain too: the cursor is the terminal's own.
	m := probedNodes(t, 80, 24)
	press(m, "/", "'gpu")
	if out := m.Render(); strings.Contains(out, "\x1b") || !strings.Contains(out, "filter nodes: gpu") {
		t.Errorf("input line: %q", out[strings.LastIndexByte(out, '\n')+1:])
	}
	if c := m.View().Cursor; c == nil || c.Y != 23 || c.X != len("filter nodes: gpu") {
		t.Errorf("cursor %+v, want at the end of the input line", c)
	}
	for _, colour := range []bool{false, true} {
		m := trainingJob(t, 2, 50, 80, 24)
		m.st = newStyles(colour)
		has := strings.Contains(m.Render(), "\x1b[")
		if has != colour {
			t.Errorf("colour %v: escape sequences present: %v", colour, has)
		}
	}
}

// TestJobPlans: the Job screen lists the planner's ranked plans below the
// launch row, the config's own marked; ↓ moves into them (scrolling the
// table), p or enter applies the selected one (its overrides replace the
// job's, the config resolves to its strategy and it becomes the marked
// one), G goes back to the launch row, and a planner error is shown.
func TestJobPlans(t *testing.T) {
	m := readyNodes(t, 80, 24)
	press(m, "3")
	scr := m.Render()
	for _, w := range []string{"strategy (*: config's)", "3 *dp4 mp2 pp4 mb1 full", "3023 rejected (2950 out of memory", "list them all: gptui plan -c 13b-4node",
		"✓ fits: config's strategy dp4 mp2 pp4"} {
		if !strings.Contains(scr, w) {
			t.Errorf("the Job screen lacks %q:\n%s", w, scr)
		}
	}
	if m.job.sel != m.job.launchRow() {
		t.Fatalf("selection %d, want the launch row", m.job.sel)
	}
	press(m, "p")
	if !strings.Contains(m.status, "select a plan first") || len(m.job.overrides) != 0 {
		t.Errorf("p on the launch row: status %q, overrides %q", m.status, m.job.overrides)
	}

	// Scroll to the last plan: the table follows the selection.
	for range len(fixturePlans) + 3 {
		press(m, "down")
	}
	if got := m.job.selectedPlan(); got != len(fixturePlans)-1 {
		t.Fatalf("selected plan %d, want the last, %d", got, len(fixturePlans)-1)
	}
	scr = m.Render()
	if !strings.Contains(scr, "›   9  mp8 pp4 mb1 full") || strings.Contains(scr, "1  sharding8/s1") {
		t.Errorf("the table did not scroll to plan 9:\n%s", scr)
	}

	// Apply plan 2 with p, then plan 4 with enter.
	press(m, "pgup", "down", "p")
	if m.job.err != nil || !slices.Equal(m.job.overrides, fixturePlans[1].Overrides) {
		t.Fatalf("after applying plan 2: overrides %q, err %v", m.job.overrides, m.job.err)
	}
	d := m.job.cfg.Distributed
	if d.DPDegree != 1 || d.MPDegree != 8 || d.PPDegree != 1 || d.Sharding.ShardingDegree != 4 || m.job.cfg.Global.MicroBatchSize != 2 || m.job.cfg.Engine.UseRecompute {
		t.Errorf("plan 2 resolved to %+v, micro %d, recompute %v", d, m.job.cfg.Global.MicroBatchSize, m.job.cfg.Engine.UseRecompute)
	}
	if m.job.selectedPlan() != 1 || !strings.Contains(m.status, "applied plan 2 (sharding4/s1 mp8 mb2): 7 override(s) set") {
		t.Errorf("after applying: selected plan %d, status %q", m.job.selectedPlan(), m.status)
	}
	scr = m.Render()
	if !strings.Contains(scr, "›   2 *sharding4/s1 mp8 mb2") || !strings.Contains(scr, "3  dp4 mp2 pp4 mb1 full") || !strings.Contains(scr, "32 ranks · rank table: 32 ✓") {
		t.Errorf("after applying plan 2:\n%s", scr)
	}
	press(m, "down", "down", "enter")
	if !slices.Equal(m.job.overrides, fixturePlans[3].Overrides) || m.job.cfg.Distributed.DPDegree != 2 || m.job.cfg.Distributed.MPDegree != 4 || m.job.cfg.Global.LocalBatchSize != 48 {
		t.Errorf("enter on plan 4: overrides %q, err %v", m.job.overrides, m.job.err)
	}
	press(m, "p")
	if !strings.Contains(m.status, "is the config's strategy already") {
		t.Errorf("applying the current plan again: %q", m.status)
	}
	press(m, "G")
	if m.job.sel != m.job.launchRow() {
		t.Errorf("G: selection %d, want the launch row %d", m.job.sel, m.job.launchRow())
	}

	// A planner that fails says why, and no plan can be applied.
	m = readyNodes(t, 80, 24)
	m.opt.Plan = func(PlanRequest) (*PlanReport, error) { return nil, fmt.Errorf("no valid layout for 32 devices") }
	m.plan.asked = ""
	m.Update(m.replan()())
	press(m, "3", "down", "p")
	if scr := m.Render(); !strings.Contains(scr, "✗ no valid layout for 32 devices") || m.job.sel != m.job.launchRow() {
		t.Errorf("planner error (selection %d):\n%s", m.job.sel, scr)
	}
}

// TestDashboardRestart: the launcher's automatic restart shows in the
// header with its count, cause and step; the job stays running, its
// elapsed time counted from the first start.
func TestDashboardRestart(t *testing.T) {
	m := trainingJob(t, 4, 120, 200, 24)
	d := &m.dash
	start := d.start
	feed(m,
		ev(event.KindWorker, 130, func(e *event.Event) {
			e.Node, e.Rank, e.State, e.Signal = "node2", 3, event.WorkerFailed, "SIGKILL"
		}),
		ev(event.KindJob, 131, func(e *event.Event) {
			e.State = event.JobRestarting
			e.Restart = &event.Restart{Count: 1, Max: 3, Cause: "rank 3 on node2 was killed by SIGKILL", Step: 10}
		}),
		ev(event.KindJob, 131, func(e *event.Event) { e.State, e.Message = event.JobReplanned, "node2 unreachable: 1 node left" }),
		ev(event.KindJob, 140, func(e *event.Event) { e.State = event.JobStarted }))
	out := m.Render()
	if !strings.Contains(out, "restart 1/3 from step 10: rank 3 on node2 was killed by SIGKILL  node2 unreachable: 1 node left") {
		t.Errorf("no restart in the header:\n%s", out)
	}
	if !d.running() || !d.start.Equal(start) || d.failure != nil {
		t.Errorf("state %q, start %v (was %v), failure %v: want running since the first start", d.state, d.start, start, d.failure)
	}
}

func TestWrap(t *testing.T) {
	for _, tc := range []struct {
		s    string
		w    int
		want []string
	}{
		{"unknown host key for 10.0.0.12:22 (SHA256:q3mC1Yv0m2dcrV8Zp0YQzWw4a3JvT9cK6k1eX7qzZ0A); verify it", 40,
			[]string{"unknown host key for 10.0.0.12:22", "(SHA256:q3mC1Yv0m2dcrV8Zp0YQzWw4a3JvT9cK", "6k1eX7qzZ0A); verify it"}},
		{"a  b", 10, []string{"a b"}},
		{"", 10, []string{""}},
		{"0123456789abcdefghij0123456789 x", 10, []string{"0123456789", "abcdefghij", "0123456789", "x"}},
	} {
		got := wrap(tc.s, tc.w)
		if !slices.Equal(got, tc.want) {
			t.Errorf("wrap(%q, %d) = %q, want %q", tc.s, tc.w, got, tc.want)
		}
		for _, l := range got {
			if n := ansi.StringWidth(l); n > max(tc.w, 10) {
				t.Errorf("wrap(%q, %d): %q is %d cells", tc.s, tc.w, l, n)
			}
		}
	}
}

// TestJobStrategyWithContextParallel: the job screen counts a context-
// parallel ring's ranks and names its degree.
func TestJobStrategyWithContextParallel(t *testing.T) {
	cfg, err := presets.Load("tiny", []string{"Distributed.dp_degree=2", "Distributed.cp_degree=2", "Distributed.mp_degree=2",
		"Model.hidden_dropout_prob=0", "Model.attention_probs_dropout_prob=0", "Global.global_batch_size=8", "Global.local_batch_size=4", "Global.micro_batch_size=2"})
	if err != nil {
		t.Fatal(err)
	}
	m := &jobModel{cfg: cfg}
	if got := m.ranks(); got != 8 {
		t.Errorf("dp2 × cp2 × mp2: %d ranks, want 8", got)
	}
	if got := m.strategy(8, 1, 1); !strings.Contains(got, "dp 2 × sharding 1 (stage 1) × cp 2 × mp 2 × pp 1 = 8 ranks") {
		t.Errorf("strategy %q", got)
	}
}
