package tui

import (
	"cmp"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/report"
	"github.com/gptui/gptui/sshexec"
	"github.com/gptui/gptui/units"
)

// Panes of the dashboard, in tab order.
const (
	paneChart = iota
	paneNodes
	paneRanks
	paneEvents
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
	text        string // used of total as shown: units.BytesOf
}

// nodeHealth is a node's load as its agent last reported it.
type nodeHealth struct {
	event.Health
	at time.Time
	// The memory figures as shown: used of total (units.BytesOf) and the
	// workers' (units.Bytes). The dashboard writes them once, not in each
	// frame.
	memText, workersRSS string
}

// newNodeHealth returns h, received at at, as the dashboard keeps it.
func newNodeHealth(h event.Health, at time.Time) nodeHealth {
	return nodeHealth{Health: h, at: at,
		memText: units.BytesOf(h.MemUsed, h.MemTotal), workersRSS: units.Bytes(h.WorkersRSS)}
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
	hist    map[int]*rankHist // every rank's steps across the attempts, for the report
	sel     int               // the rank whose log is shown
	rankTop int               // first row of the ranks pane shown
	bySlow  bool              // the ranks pane lists the slowest first
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

	state   string // the job's state: "", started, stopping, done, failed, stopped
	message string
	failure *event.Event // the job's failed event, shown as a banner
	banner  bool         // the banner is shown (esc hides it)
	hung    string       // the launcher's hang diagnosis, if it made one
	start   time.Time    // when the job started, by the launcher's clock
	end     time.Time    // when it ended (zero while it runs)
	// attempt is when the current attempt began (its restart, or the
	// job's start); idle is the time the job lay ended before restarts
	// (gptui restart after a stop), which its elapsed time leaves out.
	attempt  time.Time
	idle     time.Duration
	closed   bool           // its events ended: its processes are gone (or the UI detached)
	restart  *event.Restart // the launcher's latest automatic restart, if any
	replan   string         // how the job was re-planned at it, if it was
	ckpt     ckptState
	logDir   string // the job's Engine.log_dir
	reported string // what the last w wrote, or why it could not

	// from is the step the job's current attempt resumed from (0: from
	// the start): its agents send the metrics records up to it again, as
	// they read the resumed run's metrics files from the start, and those
	// are history, not this attempt's pace.
	from int
	lost map[string]string // the nodes lost during the job and not ready since, with why
	// agentSilent holds the nodes whose agent is silent (their ranks may
	// train on), with what is known of their ranks.
	agentSilent map[string]string
	blame       string        // what ended the current attempt ("rank 3 failed"), once known
	marks       report.Marker // the restarts, failures, hangs and lost nodes, for the report
	events      eventLog      // the events pane's rows
	evOff       int           // rows between the bottom of the events pane and the newest row
	settled     time.Time     // the clock of the last settle
	pace        paceIndex     // what settle keeps of the ranks
}

// rankHist is one rank's steps for the report: every step, thinned out
// as it grows, and the evaluations.
type rankHist struct {
	train, evals *series[sample]
}

// history returns rank r's history, making it on first use.
func (m *dashModel) history(r int) *rankHist {
	h := m.hist[r]
	if h == nil {
		h = &rankHist{train: newSeries[sample](histPoints), evals: newSeries[sample](histPoints)}
		m.hist[r] = h
	}
	return h
}

// addNew appends p to s unless s already reaches p's step: a record sent
// again (a resumed attempt's history) neither cuts nor repeats the
// series.
func addNew[T stepped](s *series[T], p T, again bool) {
	if last, ok := s.last(); again && ok && last.stepOf() >= p.stepOf() {
		return
	}
	s.add(p)
}

func newDashModel(logCap, points int) dashModel {
	return dashModel{
		memIdx:      make(map[memKey]int),
		health:      make(map[string]nodeHealth),
		train:       newSeries[point](points),
		eval:        newSeries[point](points),
		logs:        make(map[int]*ring),
		logCap:      max(logCap, 10),
		follow:      true,
		charted:     -1,
		focus:       paneLog,
		slow:        slowest{rank: -1},
		hist:        make(map[int]*rankHist),
		lost:        make(map[string]string),
		agentSilent: make(map[string]string),
		events:      newEventLog(eventRows),
	}
}

// reset prepares for a new job of cfg; a resumed job keeps the loss
// curve, which it continues, the ranks' history and marks for the report,
// the events, and the newest checkpoint, from which it resumes.
func (m *dashModel) reset(cfg *presets.Config, keepCurve bool) {
	fresh := newDashModel(m.logCap, m.train.cap)
	if keepCurve {
		fresh.train, fresh.eval = m.train, m.eval
		fresh.hist, fresh.marks, fresh.events, fresh.ckpt = m.hist, m.marks, m.events, m.ckpt
		fresh.ckpt.saving = 0
		fresh.from = m.ckpt.step
		fresh.marks.Resume(m.ckpt.step)
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
		m.ranks = append(m.ranks, rankState{cpu: -1})
	}
	return &m.ranks[r]
}

// running reports whether the job is under way.
func (m *dashModel) running() bool { return m.state == event.JobStarted || m.state == "stopping" }

// apply records one event of the job, which arrived at at (the
// launcher's clock; zero: the event's own time).
func (m *dashModel) apply(ev event.Event, at time.Time) {
	if at.IsZero() {
		at = ev.Time
	}
	if r := m.rank(ev.Rank); r != nil && ev.Kind != event.KindJob && ev.Node != "" {
		r.node = ev.Node
	}
	// What the next settle must look at again: the event's rank, or
	// every rank for the job's and the nodes' events.
	if ev.Kind == event.KindJob || ev.Kind == event.KindNode {
		m.touchAll()
	} else if m.rank(ev.Rank) != nil {
		m.touch(ev.Rank)
	}
	m.events.add(ev)
	m.marks.Add(ev)
	switch ev.Kind {
	case event.KindWorker:
		if r := m.rank(ev.Rank); r != nil {
			if ev.State == event.WorkerFailed && m.blame == "" {
				m.blame = fmt.Sprintf("rank %d failed", ev.Rank)
			}
			r.onWorker(ev, m.stopBlame())
			if ended(r.state) {
				m.dropMem(ev.Rank)
			}
		}
	case event.KindMetrics:
		m.onMetrics(ev)
	case event.KindProgress:
		if r := m.rank(ev.Rank); r != nil && ev.Progress != nil {
			r.onProgress(*ev.Progress, at)
		}
	case event.KindMemory:
		m.onMemory(ev)
	case event.KindHealth:
		if ev.Health != nil && ev.Node != "" && m.running() {
			m.health[ev.Node] = newNodeHealth(*ev.Health, ev.Time)
		}
	case event.KindLog:
		m.onLog(ev)
	case event.KindCheckpoint:
		m.onCheckpoint(ev)
	case event.KindNode:
		m.onNode(ev)
	case event.KindJob:
		m.onJob(ev)
	}
}

// onMetrics keeps a metrics record: the rank's history and, unless it is
// a record of an earlier attempt sent again (at or before the step the
// attempt resumed from), the rank's pace and figures.
func (m *dashModel) onMetrics(ev event.Event) {
	r := m.rank(ev.Rank)
	if r == nil || ev.Metrics == nil {
		return
	}
	mt := *ev.Metrics
	again := m.from > 0 && mt.Step < m.from
	h := m.history(ev.Rank)
	if mt.EvalLoss != 0 {
		addNew(h.evals, sampleOf(mt, ev.Time), again)
	} else {
		addNew(h.train, sampleOf(mt, ev.Time), again)
	}
	if m.charted < 0 || ev.Rank < m.charted {
		m.charted = ev.Rank
	}
	if ev.Rank == m.charted {
		if mt.EvalLoss != 0 {
			addNew(m.eval, point{mt.Step, mt.EvalLoss}, again)
		} else {
			addNew(m.train, point{mt.Step, mt.Loss}, again)
		}
	}
	if again || mt.EvalLoss != 0 {
		return
	}
	if r.state == rankWaiting || r.state == rankStarting || r.state == rankRestarting {
		r.state = rankRunning
	}
	r.add(mt, ev.Time)
}

// onNode applies a node event: a lost node's ranks are lost, and stay so
// (through a restart) until the node is ready again; its figures go.
func (m *dashModel) onNode(ev event.Event) {
	switch ev.State {
	case event.NodeAgentSilent:
		m.agentSilent[ev.Node] = "agent silent: its ranks' state unknown"
		if strings.Contains(ev.Message, "train on") {
			m.agentSilent[ev.Node] = "agent silent: its ranks train on"
		}
		m.setAgentSilent(ev.Node, true)
		return
	case event.NodeAgentBack:
		delete(m.agentSilent, ev.Node)
		m.setAgentSilent(ev.Node, false)
		return
	}
	if _, ok := m.agentSilent[ev.Node]; ok && (ev.State == event.NodeLost || ev.State == event.NodeReady) {
		delete(m.agentSilent, ev.Node)
		m.setAgentSilent(ev.Node, false)
	}
	switch ev.State {
	case event.NodeLost:
		why := "node lost: " + clean(ev.Message)
		m.lost[ev.Node] = why
		if m.blame == "" {
			m.blame = "node " + ev.Node + " was lost"
		}
		for i := range m.ranks {
			if r := &m.ranks[i]; r.node == ev.Node && (!ended(r.state) || r.state == rankStopped) {
				r.state, r.why = rankLost, why
				r.gone()
			}
		}
		m.dropNode(ev.Node)
	case event.NodeReady:
		delete(m.lost, ev.Node)
	}
}

// setAgentSilent marks the ranks of node as those of a silent agent, or
// not.
func (m *dashModel) setAgentSilent(node string, on bool) {
	for i := range m.ranks {
		if r := &m.ranks[i]; r.node == node {
			r.agentSilent = on
		}
	}
}

// agentSilentNodes returns the names of the nodes whose agent is silent.
func (m *dashModel) agentSilentNodes() []string {
	if len(m.agentSilent) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(m.agentSilent))
}

// lostNodes returns the names of the nodes lost and not ready since.
func (m *dashModel) lostNodes() []string {
	if len(m.lost) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(m.lost))
}

// nodesLeft is the number of the job's nodes (those of its ranks) that
// are not lost.
func (m *dashModel) nodesLeft() int {
	var left []string
	for _, r := range m.ranks {
		if _, lost := m.lost[r.node]; !lost && r.node != "" && !slices.Contains(left, r.node) {
			left = append(left, r.node)
		}
	}
	return len(left)
}

// stopBlame is what ended the attempt, for a rank its stop ends: "rank 3
// failed"; "" when the user stopped it or nothing is known.
func (m *dashModel) stopBlame() string {
	if m.state == "stopping" {
		return ""
	}
	return m.blame
}

// dropMem removes the memory bar of a CPU worker that has ended: no
// figure of a process that is gone stays on the screen.
func (m *dashModel) dropMem(rank int) {
	m.mem = slices.DeleteFunc(m.mem, func(r memRow) bool { return r.device < 0 && r.rank == rank })
	m.indexMem()
}

// dropNode removes a node's health and memory bars.
func (m *dashModel) dropNode(node string) {
	delete(m.health, node)
	m.mem = slices.DeleteFunc(m.mem, func(r memRow) bool { return r.node == node })
	m.indexMem()
}

// indexMem rebuilds memIdx after m.mem changed.
func (m *dashModel) indexMem() {
	clear(m.memIdx)
	for j, r := range m.mem {
		m.memIdx[r.memKey] = j
	}
}

// onMemory keeps a memory report: the rank's own figure and the bar of its
// device.
func (m *dashModel) onMemory(ev event.Event) {
	r := m.rank(ev.Rank)
	if ev.Device < 0 && ev.Used <= 0 || r == nil || ended(r.state) {
		return // a worker that has just exited
	}
	if r.memText == "" || r.mem != ev.Used {
		r.memText = units.Bytes(ev.Used)
	}
	r.mem, r.memTotal = ev.Used, ev.Total
	if ev.Proc != nil {
		r.pid, r.cpu = ev.Proc.PID, ev.Proc.CPUPercent
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
		m.indexMem()
		i = m.memIdx[k]
	}
	row := &m.mem[i]
	if row.text == "" || row.used != ev.Used || row.total != ev.Total {
		row.text = units.BytesOf(ev.Used, ev.Total)
	}
	row.used, row.total = ev.Used, ev.Total
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
		if !m.end.IsZero() && ev.Time.After(m.end) {
			m.idle += ev.Time.Sub(m.end) // restarted after its end
		}
		m.end, m.attempt = time.Time{}, ev.Time
		if ev.Restart != nil {
			r := *ev.Restart
			r.Cause = clean(r.Cause)
			m.restart, m.replan = &r, ""
			m.from = r.Step
		}
		// The next attempt starts afresh: nothing of this one's figures
		// may pass for its. A lost node's ranks stay lost until it is
		// back.
		for i := range m.ranks {
			r := &m.ranks[i]
			r.forget()
			r.state = rankRestarting
			if why, ok := m.lost[r.node]; ok {
				r.state, r.why = rankLost, why
			}
		}
		m.mem, m.memIdx, m.health = nil, make(map[memKey]int), make(map[string]nodeHealth)
		m.ckpt.saving, m.hung, m.failure, m.banner, m.slow, m.blame = 0, "", nil, false, slowest{rank: -1}, ""
		return
	case event.JobReplanned:
		m.replan = clean(ev.Message)
		if ev.Restart != nil && m.restart != nil {
			m.restart.Step, m.from = ev.Restart.Step, ev.Restart.Step
		}
		return
	case event.JobHung:
		m.hung = clean(ev.Message)
		if r := m.rank(ev.Rank); r != nil && !ended(r.state) {
			r.state, r.why = rankHung, "hung: no progress"
			r.gone()
		}
		if ev.Rank >= 0 {
			m.blame = fmt.Sprintf("rank %d hung", ev.Rank)
		}
		return // the job's failure, which follows, stops it
	}
	m.state, m.message = ev.State, clean(ev.Message)
	switch ev.State {
	case event.JobStarted:
		if m.start.IsZero() {
			m.start, m.attempt = ev.Time, ev.Time // a restarted job's time counts from its first start
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
			if !strings.HasPrefix(m.blame, fmt.Sprintf("rank %d ", ev.Rank)) && r.state == rankFailed {
				m.blame = fmt.Sprintf("rank %d failed", ev.Rank)
			}
			m.sel, m.logOff, m.follow = ev.Rank, 0, true
		}
		m.stopRest()
		m.ended()
	case event.JobStopped, event.JobDone:
		m.end = ev.Time
		if ev.State == event.JobStopped {
			m.stopRest()
		}
		m.ended()
	default:
		m.end = ev.Time
	}
}

// ended clears what only a running job has: its nodes' load and its
// processes' memory.
func (m *dashModel) ended() {
	m.mem, m.memIdx, m.health = nil, make(map[memKey]int), make(map[string]nodeHealth)
	for i := range m.ranks {
		if r := &m.ranks[i]; ended(r.state) || r.state == rankRestarting {
			r.gone()
		}
	}
}

// stopRest marks the ranks that still run as stopped: the job has ended,
// and the stop ended them. Ranks the stop ended before the job's failure
// named its cause are told it now.
func (m *dashModel) stopRest() {
	blame := m.stopBlame()
	for i := range m.ranks {
		r := &m.ranks[i]
		switch {
		case r.state == rankRestarting:
			r.state, r.why = rankStopped, "stopped: the restart failed"
			if m.state != event.JobFailed {
				r.why = "stopped with the job before its restart"
			}
		case !ended(r.state):
			r.state = rankStopped
			if r.why == "" || blame != "" {
				r.why = "stopped with the job"
				if blame != "" {
					r.why += " because " + blame
				}
			}
		case r.state == rankStopped && !r.cause && blame != "":
			r.why = stoppedWhy(blame, r.code, r.signal)
		}
	}
}

// over notes that the job's stream has ended: its workers are gone.
func (m *dashModel) over() {
	m.closed = true
	if m.state == event.JobStarted || m.state == "stopping" || m.state == "" {
		m.state = event.JobStopped
	}
	if m.state != event.JobDone {
		m.stopRest()
	}
	m.ended()
	m.touchAll()
	m.settle(m.settled)
}

// update handles a key of the dashboard; it reports whether it used it,
// and what follows.
func (m *dashModel) update(msg tea.KeyPressMsg, k keyMap, page int, h host) (bool, tea.Cmd) {
	switch {
	case is(msg, k.Filter):
		return true, h.openPrompt(promptSearch, "search the log: ", m.search, "")
	case is(msg, k.Report):
		return true, m.writeReport(h)
	case is(msg, k.Drop):
		return true, h.askDrop()
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
		m.settle(m.settled)
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
	case paneEvents:
		m.evOff = min(max(m.evOff-d, 0), max(len(m.events.rows)-1, 0))
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
	switch {
	case m.ckpt.step > 0:
		out = append(out, fmt.Sprintf("gptui: the newest checkpoint: %s (step %d)", on(m.ckpt.node, m.ckpt.dir), m.ckpt.step))
	case m.running():
		out = append(out, "gptui: no checkpoint saved yet (the job runs on)")
	default:
		out = append(out, "gptui: no checkpoint was saved")
	}
	return out
}
