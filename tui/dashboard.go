package tui

import (
	"cmp"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/sshexec"
)

// Panes of the dashboard, in tab order.
const (
	paneChart = iota
	paneNodes
	paneRanks
	paneLog
	numPanes
)

// maxRanks bounds the rank numbers the dashboard accepts, so that a bogus
// event cannot make it allocate without end.
const maxRanks = 1 << 16

// histPoints is how many steps of each rank are kept for the report
// (thinned out as a run grows, as the loss curve is).
const histPoints = 512

// memKey names one memory bar: a device of a node, or a CPU worker's RSS.
type memKey struct {
	node   string
	device int // -1 for a CPU worker
	rank   int // the worker, for device -1
}

type memRow struct {
	memKey
	used, total int64
}

// nodeHealth is a node's load as its agent last reported it.
type nodeHealth struct {
	event.Health
	at time.Time
}

// ckptState is what the job's checkpoint events said about its
// checkpoints.
type ckptState struct {
	step   int // the newest saved step (steps done); 0 for none
	dir    string
	node   string    // where it was saved: the saving rank's node
	at     time.Time // when, by that node's clock
	saving int       // the step of a save in flight; 0 for none
}

// lossWindows are the loss chart's windows: all the steps, or the last N.
var lossWindows = []int{0, 1000, 200, 50}

// dashModel is the Dashboard: the figures of the job, the loss chart, the
// nodes' health and memory, every rank's state and pace, and the log of
// one of them.
type dashModel struct {
	focus int
	zoom  bool // the focused pane fills the dashboard

	ranks   []rankState
	sel     int  // the rank whose log is shown
	rankTop int  // first row of the ranks pane shown
	bySlow  bool // the ranks pane lists the slowest first
	order   []int
	slow    slowest

	mem    []memRow // sorted by node, device, rank
	memIdx map[memKey]int
	memTop int
	health map[string]nodeHealth

	train, eval *series[point]
	charted     int // the rank whose metrics are charted: the lowest that sends them
	window      int // index into lossWindows
	ema         bool
	maxSteps    int
	job         string // the config, and the job's id once started, for the report's title

	logs   map[int]*ring
	logCap int
	logOff int  // lines between the bottom of the log and the last line shown
	follow bool // keep the newest line in view
	wrap   bool // wrap long lines rather than cut them
	search string

	state    string // the job's state: "", started, stopping, done, failed, stopped
	message  string
	failure  *event.Event   // the job's failed event, shown as a banner
	banner   bool           // the banner is shown (esc hides it)
	hung     string         // the launcher's hang diagnosis, if it made one
	start    time.Time      // when the job started, by the launcher's clock
	end      time.Time      // when it ended
	restart  *event.Restart // the launcher's latest automatic restart, if any
	replan   string         // how the job was re-planned at it, if it was
	ckpt     ckptState
	logDir   string // the job's Engine.log_dir
	reported string // what the last w wrote, or why it could not
}

func newDashModel(logCap, points int) dashModel {
	return dashModel{
		memIdx:  make(map[memKey]int),
		health:  make(map[string]nodeHealth),
		train:   newSeries[point](points),
		eval:    newSeries[point](points),
		logs:    make(map[int]*ring),
		logCap:  max(logCap, 10),
		follow:  true,
		charted: -1,
		focus:   paneLog,
	}
}

// reset prepares for a new job of cfg; a resumed job keeps the loss curve,
// which it continues.
func (m *dashModel) reset(cfg *presets.Config, keepCurve bool) {
	fresh := newDashModel(m.logCap, m.train.cap)
	if keepCurve {
		fresh.train, fresh.eval = m.train, m.eval
	}
	fresh.focus, fresh.window, fresh.ema, fresh.wrap, fresh.bySlow = m.focus, m.window, m.ema, m.wrap, m.bySlow
	if cfg != nil {
		fresh.maxSteps, fresh.logDir = cfg.Engine.MaxSteps, cfg.Engine.LogDir
	}
	*m = fresh
}

// rank returns the state of rank r, growing the table as needed; nil for a
// rank out of bounds.
func (m *dashModel) rank(r int) *rankState {
	if r < 0 || r >= maxRanks {
		return nil
	}
	for len(m.ranks) <= r {
		m.ranks = append(m.ranks, rankState{})
	}
	return &m.ranks[r]
}

// running reports whether the job is under way.
func (m *dashModel) running() bool { return m.state == event.JobStarted || m.state == "stopping" }

// apply records one event of the job.
func (m *dashModel) apply(ev event.Event) {
	if r := m.rank(ev.Rank); r != nil && ev.Kind != event.KindJob {
		if ev.Node != "" {
			r.node = ev.Node
		}
		if ev.Time.After(r.heard) {
			r.heard = ev.Time
		}
	}
	switch ev.Kind {
	case event.KindWorker:
		if r := m.rank(ev.Rank); r != nil {
			r.onWorker(ev)
		}
	case event.KindMetrics:
		r := m.rank(ev.Rank)
		if r == nil || ev.Metrics == nil {
			return
		}
		if r.state == rankWaiting || r.state == rankStarting || r.state == rankRestarting {
			r.state = rankRunning
		}
		mt := *ev.Metrics
		r.add(mt, ev.Time, histPoints)
		if m.charted < 0 || ev.Rank < m.charted {
			m.charted = ev.Rank
		}
		if ev.Rank != m.charted {
			return
		}
		if mt.EvalLoss != 0 {
			m.eval.add(point{mt.Step, mt.EvalLoss})
			return
		}
		m.train.add(point{mt.Step, mt.Loss})
	case event.KindProgress:
		if r := m.rank(ev.Rank); r != nil && ev.Progress != nil {
			p := *ev.Progress
			r.prog = &p
		}
	case event.KindMemory:
		m.onMemory(ev)
	case event.KindHealth:
		if ev.Health != nil && ev.Node != "" {
			m.health[ev.Node] = nodeHealth{Health: *ev.Health, at: ev.Time}
		}
	case event.KindLog:
		m.onLog(ev)
	case event.KindCheckpoint:
		m.onCheckpoint(ev)
	case event.KindNode:
		if ev.State == event.NodeLost {
			for i := range m.ranks {
				if r := &m.ranks[i]; r.node == ev.Node && !ended(r.state) {
					r.state, r.why = rankLost, "node lost: "+clean(ev.Message)
				}
			}
		}
	case event.KindJob:
		m.onJob(ev)
	}
}

// onMemory keeps a memory report: the rank's own figure and the bar of its
// device.
func (m *dashModel) onMemory(ev event.Event) {
	if ev.Device < 0 && ev.Used <= 0 {
		return // a worker that has just exited: its last figure stands
	}
	if r := m.rank(ev.Rank); r != nil {
		r.mem, r.memTotal = ev.Used, ev.Total
	}
	k := memKey{node: ev.Node, device: ev.Device}
	if ev.Device < 0 {
		k.rank = ev.Rank
	}
	i, ok := m.memIdx[k]
	if !ok {
		m.mem = append(m.mem, memRow{memKey: k})
		slices.SortFunc(m.mem, func(x, y memRow) int {
			return cmp.Or(strings.Compare(x.node, y.node), cmp.Compare(x.device, y.device), cmp.Compare(x.rank, y.rank))
		})
		for j, r := range m.mem {
			m.memIdx[r.memKey] = j
		}
		i = m.memIdx[k]
	}
	m.mem[i].used, m.mem[i].total = ev.Used, ev.Total
}

// onLog keeps a line of a rank's output.
func (m *dashModel) onLog(ev event.Event) {
	if m.rank(ev.Rank) == nil {
		return
	}
	l := m.logs[ev.Rank]
	if l == nil {
		l = newRing(m.logCap)
		m.logs[ev.Rank] = l
	}
	l.add(clean(ev.Line))
	if ev.Rank == m.sel && !m.follow {
		// Keep the lines in view where they are.
		m.logOff = min(m.logOff+1, max(l.len()-1, 0))
	}
}

// onCheckpoint keeps what a worker's checkpoint event says: a save begun
// in the background, or a checkpoint saved.
func (m *dashModel) onCheckpoint(ev event.Event) {
	c := ev.Checkpoint
	if c == nil {
		return
	}
	switch ev.State {
	case event.CheckpointSaved:
		if c.Step >= m.ckpt.step {
			m.ckpt.step, m.ckpt.dir, m.ckpt.node, m.ckpt.at = c.Step, c.Dir, ev.Node, ev.Time
			if m.ckpt.saving <= c.Step {
				m.ckpt.saving = 0
			}
		}
	case event.CheckpointSaving:
		m.ckpt.saving = c.Step
	}
}

// onJob applies the job's own events: its start and end, a hang, a
// restart.
func (m *dashModel) onJob(ev event.Event) {
	switch ev.State {
	case event.JobRestarting:
		if ev.Restart != nil {
			r := *ev.Restart
			r.Cause = clean(r.Cause)
			m.restart, m.replan = &r, ""
		}
		// The next attempt starts afresh: nothing of this one's figures
		// may pass for its.
		for i := range m.ranks {
			m.ranks[i].forget()
			m.ranks[i].state = rankRestarting
		}
		m.mem, m.memIdx, m.health = nil, make(map[memKey]int), make(map[string]nodeHealth)
		m.ckpt.saving, m.hung, m.failure, m.banner, m.slow = 0, "", nil, false, slowest{rank: -1}
		return
	case event.JobReplanned:
		m.replan = clean(ev.Message)
		return
	case event.JobHung:
		m.hung = clean(ev.Message)
		if r := m.rank(ev.Rank); r != nil && !ended(r.state) {
			r.state, r.why = rankHung, "hung: no progress"
		}
		return // the job's failure, which follows, stops it
	}
	m.state, m.message = ev.State, clean(ev.Message)
	switch ev.State {
	case event.JobStarted:
		if m.restart == nil {
			m.start = ev.Time // a restarted job's time counts from its first start
		}
		if ev.Job != "" {
			m.job = ev.Job
		}
	case event.JobFailed:
		e := ev
		e.Tail = make([]string, len(ev.Tail))
		for i, t := range ev.Tail {
			e.Tail[i] = clean(t)
		}
		m.failure, m.banner, m.end = &e, true, ev.Time
		if r := m.rank(ev.Rank); r != nil {
			r.cause = true
			if !ended(r.state) || r.state == rankStopped {
				r.state, r.code, r.signal, r.why = rankFailed, ev.Code, ev.Signal, how(ev.Code, ev.Signal)
			}
			m.sel, m.logOff, m.follow = ev.Rank, 0, true
		}
		m.stopRest()
	case event.JobStopped:
		m.end = ev.Time
		m.stopRest()
	default:
		m.end = ev.Time
	}
}

// stopRest marks the ranks that still run as stopped: the job has ended,
// and the stop ended them.
func (m *dashModel) stopRest() {
	for i := range m.ranks {
		if r := &m.ranks[i]; !ended(r.state) {
			r.state = rankStopped
			if r.why == "" {
				r.why = "stopped with the job"
			}
		}
	}
}

// over notes that the job's stream has ended: its workers are gone.
func (m *dashModel) over() {
	if m.state == event.JobStarted || m.state == "stopping" || m.state == "" {
		m.state = event.JobStopped
	}
	if m.state != event.JobDone {
		m.stopRest()
	}
	m.settle()
}

// settle brings the figures drawn from many events up to date after a
// batch of them: the slowest rank and the order of the ranks pane.
func (m *dashModel) settle() {
	m.slow = findSlowest(m.ranks)
	if len(m.order) != len(m.ranks) {
		m.order = make([]int, len(m.ranks))
	}
	for i := range m.order {
		m.order[i] = i
	}
	if m.bySlow {
		key := func(i int) float64 {
			r := &m.ranks[i]
			if len(r.recent) == 0 {
				return -1
			}
			var cs []float64
			for _, s := range r.tail(slowWindow) {
				cs = append(cs, s.computeS)
			}
			return median(cs)
		}
		keys := make([]float64, len(m.ranks))
		for i := range keys {
			keys[i] = key(i)
		}
		sort.SliceStable(m.order, func(a, b int) bool { return keys[m.order[a]] > keys[m.order[b]] })
	}
}

// update handles a key of the dashboard; it reports whether it used it,
// and what follows.
func (m *dashModel) update(msg tea.KeyPressMsg, k keyMap, page int, h host) (bool, tea.Cmd) {
	switch {
	case is(msg, k.Filter):
		return true, h.openPrompt(promptSearch, "search the log: ", m.search, "")
	case is(msg, k.Report):
		return true, m.writeReport(h)
	case is(msg, k.Next):
		m.focus = (m.focus + 1) % numPanes
	case is(msg, k.Prev):
		m.focus = (m.focus + numPanes - 1) % numPanes
	case is(msg, k.Zoom):
		m.zoom = !m.zoom
	case is(msg, k.Wrap):
		m.wrap = !m.wrap
	case is(msg, k.Window):
		m.window = (m.window + 1) % len(lossWindows)
	case is(msg, k.EMA):
		m.ema = !m.ema
	case is(msg, k.Order):
		m.bySlow = !m.bySlow
		m.settle()
	case is(msg, k.Follow):
		m.follow = !m.follow
		if m.follow {
			m.logOff = 0
		}
	case is(msg, k.NextMatch) && m.search != "":
		m.findMatch(-1)
	case is(msg, k.PrevMatch) && m.search != "":
		m.findMatch(+1)
	case is(msg, k.Back) && m.zoom:
		m.zoom = false
	case is(msg, k.Back) && m.search != "":
		m.search = ""
	case is(msg, k.Back) && m.banner:
		m.banner = false
	case is(msg, k.Open) && m.focus == paneRanks:
		m.focus, m.logOff, m.follow = paneLog, 0, true
	case is(msg, k.Open) && m.focus == paneLog:
		m.zoom = !m.zoom // the log full screen
	default:
		return m.move(msg, k, page), nil
	}
	return true, nil
}

// move handles the movement keys in the focused pane.
func (m *dashModel) move(msg tea.KeyPressMsg, k keyMap, page int) bool {
	var d int
	switch {
	case is(msg, k.Up):
		d = -1
	case is(msg, k.Down):
		d = 1
	case is(msg, k.PageUp):
		d = -page
	case is(msg, k.PageDown):
		d = page
	case is(msg, k.Top):
		d = -1 << 30
	case is(msg, k.Bottom):
		d = 1 << 30
	default:
		return false
	}
	switch m.focus {
	case paneRanks:
		// Move through the ranks in the order they are listed.
		pos := 0
		for i, r := range m.order {
			if r == m.sel {
				pos = i
			}
		}
		if len(m.order) > 0 {
			pos = min(max(pos+d, 0), len(m.order)-1)
			if r := m.order[pos]; r != m.sel {
				m.sel, m.logOff, m.follow = r, 0, true
			}
		}
	case paneNodes:
		m.memTop = min(max(m.memTop+d, 0), max(len(m.mem)-1, 0))
	case paneLog:
		n := 0
		if l := m.logs[m.sel]; l != nil {
			n = l.len()
		}
		m.logOff = min(max(m.logOff-d, 0), max(n-1, 0))
		m.follow = m.logOff == 0 && d > 0
	case paneChart:
		return false
	}
	return true
}

// findMatch moves the log view to the next line holding the search text,
// older (dir -1) or newer (+1) than the line now at the bottom.
func (m *dashModel) findMatch(dir int) bool {
	l := m.logs[m.sel]
	if l == nil || m.search == "" {
		return false
	}
	n := l.len()
	for i := n - 1 - m.logOff + dir; i >= 0 && i < n; i += dir {
		if strings.Contains(l.at(i), m.search) {
			m.logOff, m.follow = n-1-i, false
			return true
		}
	}
	return false
}

// setSearch starts a search of the log, from the newest line back.
func (m *dashModel) setSearch(s string) bool {
	m.search = s
	m.logOff = 0
	if s == "" {
		return true
	}
	l := m.logs[m.sel]
	if l != nil && l.len() > 0 && strings.Contains(l.at(l.len()-1), s) {
		m.follow = false
		return true
	}
	return m.findMatch(-1)
}

// summary says where the job left its logs and its newest checkpoint,
// given the inventory's nodes (for their workdirs).
func (m *dashModel) summary(nodes []sshexec.Node) []string {
	workdir := func(name string) string {
		for _, n := range nodes {
			if n.Name == name {
				return n.Workdir
			}
		}
		return ""
	}
	on := func(node, p string) string {
		if !path.IsAbs(p) {
			if wd := workdir(node); wd != "" && wd != "." {
				p = path.Join(wd, p)
			}
		}
		return node + ":" + p
	}
	var seen []string
	for _, r := range m.ranks {
		if r.node != "" && !slices.Contains(seen, r.node) {
			seen = append(seen, r.node)
		}
	}
	if len(seen) == 0 {
		for _, n := range nodes {
			seen = append(seen, n.Name)
		}
	}
	var logs []string
	for _, n := range seen {
		logs = append(logs, on(n, m.logDir))
	}
	out := []string{"gptui: the job's logs (workerlog.<rank>, metrics.<rank>.jsonl): " + strings.Join(logs, " ")}
	if m.ckpt.step > 0 {
		out = append(out, fmt.Sprintf("gptui: the newest checkpoint: %s (step %d)", on(m.ckpt.node, m.ckpt.dir), m.ckpt.step))
	} else {
		out = append(out, "gptui: no checkpoint was saved")
	}
	return out
}
