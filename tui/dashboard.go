package tui

import (
	"fmt"
	"sort"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/gptui/gptui/event"
)

// Panes of the dashboard, in tab order.
const (
	paneChart = iota
	paneMem
	paneRanks
	paneLog
	numPanes
)

// maxRanks bounds the rank numbers the dashboard accepts, so that a bogus
// event cannot make it allocate without end.
const maxRanks = 1 << 16

// rankState is what the dashboard knows of one rank.
type rankState struct {
	node   string
	state  string // an event.Worker* state; empty until reported
	code   int
	signal string
}

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

// dashModel is the Dashboard: memory bars, the loss chart, the figures of
// the latest step, the state of every rank and the log of one of them.
type dashModel struct {
	focus int

	ranks   []rankState
	sel     int // the rank whose log is shown
	rankTop int // first row of the ranks pane shown

	mem    []memRow // sorted by node, device, rank
	memIdx map[memKey]int
	memTop int

	train, eval *series
	last        event.Metrics // the latest training step
	lastEval    float64
	metricsRank int // the rank whose metrics are charted: the lowest that sends them
	maxSteps    int

	logs   map[int]*ring
	logCap int
	logOff int  // lines between the bottom of the log and the last line shown
	follow bool // keep the newest line in view
	search string

	state   string // the job's state: "", started, stopping, done, failed, stopped
	message string
	failure *event.Event   // the job's failed event, shown as a banner
	banner  bool           // the banner is shown (esc hides it)
	start   time.Time      // when the job started, by the launcher's clock
	end     time.Time      // when it ended
	restart *event.Restart // the launcher's latest automatic restart, if any
	replan  string         // how the job was re-planned at it, if it was
}

func newDashModel(logCap, points int) dashModel {
	return dashModel{
		memIdx:      make(map[memKey]int),
		train:       newSeries(points),
		eval:        newSeries(points),
		logs:        make(map[int]*ring),
		logCap:      max(logCap, 10),
		follow:      true,
		metricsRank: -1,
		focus:       paneLog,
	}
}

// reset prepares for a new job of the given length; a resumed job keeps the
// loss curve, which it continues.
func (m *dashModel) reset(maxSteps int, keepCurve bool) {
	fresh := newDashModel(m.logCap, m.train.cap)
	if keepCurve {
		fresh.train, fresh.eval, fresh.last, fresh.lastEval = m.train, m.eval, m.last, m.lastEval
	}
	fresh.focus = m.focus
	fresh.maxSteps = maxSteps
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
	switch ev.Kind {
	case event.KindWorker:
		if r := m.rank(ev.Rank); r != nil {
			r.node, r.state, r.code, r.signal = ev.Node, ev.State, ev.Code, ev.Signal
		}
	case event.KindMetrics:
		r := m.rank(ev.Rank)
		if r == nil || ev.Metrics == nil {
			return
		}
		if r.node == "" {
			r.node = ev.Node
		}
		if m.metricsRank < 0 || ev.Rank < m.metricsRank {
			m.metricsRank = ev.Rank
		}
		if ev.Rank != m.metricsRank {
			return
		}
		mt := *ev.Metrics
		if mt.EvalLoss != 0 {
			m.eval.add(point{mt.Step, mt.EvalLoss})
			m.lastEval = mt.EvalLoss
			return
		}
		m.train.add(point{mt.Step, mt.Loss})
		m.last = mt
	case event.KindMemory:
		k := memKey{node: ev.Node, device: ev.Device}
		if ev.Device < 0 {
			k.rank = ev.Rank
		}
		i, ok := m.memIdx[k]
		if !ok {
			m.mem = append(m.mem, memRow{memKey: k})
			sort.Slice(m.mem, func(a, b int) bool {
				x, y := m.mem[a], m.mem[b]
				if x.node != y.node {
					return x.node < y.node
				}
				if x.device != y.device {
					return x.device < y.device
				}
				return x.rank < y.rank
			})
			for j, r := range m.mem {
				m.memIdx[r.memKey] = j
			}
			i = m.memIdx[k]
		}
		m.mem[i].used, m.mem[i].total = ev.Used, ev.Total
	case event.KindLog:
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
	case event.KindJob:
		switch ev.State {
		case event.JobRestarting:
			if ev.Restart != nil {
				r := *ev.Restart
				r.Cause = clean(r.Cause)
				m.restart, m.replan = &r, ""
			}
			return
		case event.JobReplanned:
			m.replan = clean(ev.Message)
			return
		case event.JobHung:
			// The job's failure, which follows, carries the diagnosis.
			return
		}
		m.state, m.message = ev.State, clean(ev.Message)
		switch ev.State {
		case event.JobStarted:
			if m.restart == nil {
				m.start = ev.Time // a restarted job's time counts from its first start
			}
		case event.JobFailed:
			e := ev
			e.Tail = make([]string, len(ev.Tail))
			for i, t := range ev.Tail {
				e.Tail[i] = clean(t)
			}
			m.failure, m.banner, m.end = &e, true, ev.Time
			if ev.Rank >= 0 {
				m.sel, m.logOff, m.follow = ev.Rank, 0, true
			}
		default:
			m.end = ev.Time
		}
	}
}

// update handles a key; it reports whether it used it.
func (m *dashModel) update(msg tea.KeyPressMsg, k keyMap, page int) bool {
	switch {
	case is(msg, k.Next):
		m.focus = (m.focus + 1) % numPanes
	case is(msg, k.Prev):
		m.focus = (m.focus + numPanes - 1) % numPanes
	case is(msg, k.Follow):
		m.follow = !m.follow
		if m.follow {
			m.logOff = 0
		}
	case is(msg, k.NextMatch) && m.search != "":
		m.findMatch(-1)
	case is(msg, k.PrevMatch) && m.search != "":
		m.findMatch(+1)
	case is(msg, k.Back) && m.search != "":
		m.search = ""
	case is(msg, k.Back) && m.banner:
		m.banner = false
	case is(msg, k.Open) && m.focus == paneRanks:
		m.focus, m.logOff, m.follow = paneLog, 0, true
	default:
		return m.move(msg, k, page)
	}
	return true
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
		old := m.sel
		m.sel = min(max(m.sel+d, 0), max(len(m.ranks)-1, 0))
		if m.sel != old {
			m.logOff, m.follow = 0, true
		}
	case paneMem:
		m.memTop = min(max(m.memTop+d, 0), max(len(m.mem)-1, 0))
	case paneLog:
		n := 0
		if l := m.logs[m.sel]; l != nil {
			n = l.len()
		}
		m.logOff = min(max(m.logOff-d, 0), max(n-1, 0))
		m.follow = m.logOff == 0 && d > 0
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

// stats is the line of figures at the top.
func (m *dashModel) stats(st styles, now time.Time) string {
	var parts []string
	if m.state == "" && m.message != "" {
		parts = append(parts, m.message)
	}
	if mt := m.last; m.train != nil && len(m.train.pts) > 0 {
		step := fmt.Sprintf("step %d", mt.Step)
		if m.maxSteps > 0 {
			step += fmt.Sprintf("/%d", m.maxSteps)
		}
		parts = append(parts, step, st.Bold.r(fmt.Sprintf("loss %.4f", mt.Loss)))
		if m.lastEval != 0 {
			parts = append(parts, fmt.Sprintf("eval %.4f", m.lastEval))
		}
		parts = append(parts, si(mt.TokensPerS)+" tok/s", fmt.Sprintf("MFU %.1f%%", mt.MFU*100))
		if m.running() && m.maxSteps > mt.Step && mt.StepTimeS > 0 {
			parts = append(parts, "ETA "+duration(float64(m.maxSteps-mt.Step)*mt.StepTimeS))
		}
	}
	if r := m.restart; r != nil {
		from := "from the start"
		if r.Step > 0 {
			from = fmt.Sprintf("from step %d", r.Step)
		}
		parts = append(parts, st.Warn.r(fmt.Sprintf("restart %d/%d %s: %s", r.Count, r.Max, from, r.Cause)))
		if m.replan != "" {
			parts = append(parts, st.Warn.r(m.replan))
		}
	}
	if !m.start.IsZero() {
		end := m.end
		if end.IsZero() {
			end = now
		}
		if !end.IsZero() && end.After(m.start) {
			parts = append(parts, "elapsed "+duration(end.Sub(m.start).Seconds()))
		}
	}
	if len(parts) == 0 {
		return "no job yet: launch one from the Job screen (3)"
	}
	return strings.Join(parts, "  ")
}

// rankCounts summarises the ranks' states.
func (m *dashModel) rankCounts() string {
	counts := map[string]int{}
	for _, r := range m.ranks {
		s := r.state
		if s == "" {
			s = "waiting"
		}
		counts[s]++
	}
	var parts []string
	for _, s := range []string{"waiting", event.WorkerStarting, event.WorkerRunning, event.WorkerExited, event.WorkerFailed} {
		if counts[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[s], s))
		}
	}
	return strings.Join(parts, ", ")
}

// view draws the dashboard in w×h cells.
func (m *dashModel) view(st styles, w, h int, now time.Time) []string {
	lines := make([]string, 0, h)
	lines = append(lines, fit(" "+m.stats(st, now), w))
	if m.banner && m.failure != nil {
		lines = append(lines, m.bannerLines(st, w, h)...)
	}
	rest := h - len(lines)
	nr := max(len(m.ranks), 1)
	cellW := len(fmt.Sprint(nr-1)) + 8
	per := max((w-1)/cellW, 1)
	rankRows := (nr + per - 1) / per
	ranksH := 1 + min(rankRows, max(2, rest/8))
	topH := max(5, rest*2/5)
	logH := rest - topH - ranksH
	if logH < 4 {
		topH = max(3, topH-(4-logH))
		logH = rest - topH - ranksH
	}

	// Loss chart and memory bars side by side.
	chartW := w * 3 / 5
	memW := w - chartW - 1
	left := append([]string{rule(st, "Loss  ⣀ train  • eval", chartW, m.focus == paneChart)},
		lossChart(st, m.train.pts, m.eval.pts, 0, chartW, topH-1)...)
	right := append([]string{rule(st, "Memory  used/total", memW, m.focus == paneMem)}, m.memLines(st, memW, topH-1)...)
	at := func(s []string, i int) string {
		if i < len(s) {
			return s[i]
		}
		return ""
	}
	for i := range topH {
		lines = append(lines, fit(at(left, i), chartW)+" "+fit(at(right, i), memW))
	}

	// Ranks.
	visRows := ranksH - 1
	selRow := m.sel / per
	if selRow < m.rankTop {
		m.rankTop = selRow
	}
	if selRow >= m.rankTop+visRows {
		m.rankTop = selRow - visRows + 1
	}
	m.rankTop = min(m.rankTop, max(rankRows-visRows, 0))
	title := "Ranks  " + m.rankCounts()
	if rankRows > visRows {
		title += fmt.Sprintf("  (rows %d-%d of %d)", m.rankTop+1, min(m.rankTop+visRows, rankRows), rankRows)
	}
	lines = append(lines, rule(st, title, w, m.focus == paneRanks))
	var b strings.Builder
	for row := m.rankTop; row < m.rankTop+visRows; row++ {
		b.Reset()
		b.WriteByte(' ')
		for c := range per {
			r := row*per + c
			if r >= len(m.ranks) {
				break
			}
			b.WriteString(m.rankCell(st, r, cellW))
		}
		lines = append(lines, fit(b.String(), w))
	}

	// The selected rank's log.
	lines = append(lines, m.logLines(st, w, logH)...)
	for len(lines) < h {
		lines = append(lines, "")
	}
	return lines[:h]
}

// rankCell draws one rank in cellW cells: "›12 run   ".
func (m *dashModel) rankCell(st styles, r, cellW int) string {
	rs := m.ranks[r]
	abbr := map[string]string{"": "-", event.WorkerStarting: "start", event.WorkerRunning: "run", event.WorkerExited: "exit", event.WorkerFailed: "FAIL"}[rs.state]
	mark := " "
	if r == m.sel {
		mark = "›"
	}
	num := fmt.Sprintf("%*d", cellW-8, r)
	text := fmt.Sprintf("%-5s ", abbr)
	if r == m.sel {
		return st.Sel.r(mark+num) + " " + st.state(rs.state).r(text)
	}
	return mark + num + " " + st.state(rs.state).r(text)
}

// memLines draws the memory bars in w×h cells.
func (m *dashModel) memLines(st styles, w, h int) []string {
	out := make([]string, 0, h)
	if len(m.mem) == 0 {
		return append(out, fit("  no memory reports yet", w))
	}
	nodeW := 4
	for _, r := range m.mem {
		nodeW = max(nodeW, min(len(r.node), 12))
	}
	top := min(m.memTop, max(len(m.mem)-h, 0))
	for i := top; i < len(m.mem) && len(out) < h; i++ {
		r := m.mem[i]
		if len(out) == h-1 && i < len(m.mem)-1 {
			out = append(out, fit(fmt.Sprintf("  … %d more (tab here, j/k)", len(m.mem)-i), w))
			break
		}
		dev := fmt.Sprintf("gpu%d", r.device)
		if r.device < 0 {
			dev = fmt.Sprintf("r%d", r.rank)
		}
		val := bytesize(r.used)
		if r.total > 0 {
			val += "/" + bytesize(r.total)
		}
		label := fmt.Sprintf("%-*s %-5s ", nodeW, trunc(r.node, nodeW), dev)
		barW := w - len(label) - len(val) - 1
		if barW < 3 {
			out = append(out, fit(label+val, w))
			continue
		}
		total := r.total
		if total <= 0 {
			total = r.used
		}
		out = append(out, label+bar(st, r.used, total, barW)+" "+val)
	}
	return out
}

// logLines draws the log pane in w×h cells.
func (m *dashModel) logLines(st styles, w, h int) []string {
	l := m.logs[m.sel]
	node := ""
	if m.sel < len(m.ranks) && m.ranks[m.sel].node != "" {
		node = " on " + m.ranks[m.sel].node
	}
	title := fmt.Sprintf("Log  rank %d%s", m.sel, node)
	if m.follow {
		title += " · follow"
	} else {
		title += fmt.Sprintf(" · %d lines up (G follows)", m.logOff)
	}
	if m.search != "" {
		title += " · /" + m.search + " (n/N)"
	}
	out := []string{rule(st, title, w, m.focus == paneLog)}
	rows := h - 1
	n := 0
	if l != nil {
		n = l.len()
	}
	if n == 0 {
		return append(out, fit("  no output from this rank yet", w))
	}
	end := n - min(m.logOff, n-1)
	start := max(end-rows, 0)
	for i := start; i < end; i++ {
		s := l.at(i)
		gutter := " "
		if m.search != "" {
			if j := strings.Index(s, m.search); j >= 0 {
				gutter = "▸"
				s = s[:j] + st.Match.r(s[j:j+len(m.search)]) + s[j+len(m.search):]
			}
		}
		out = append(out, fit(gutter+s, w))
	}
	return out
}

// bannerLines draws the failure banner: the rank, how it ended and its
// last lines.
func (m *dashModel) bannerLines(st styles, w, h int) []string {
	f := m.failure
	how := f.Message
	if f.Rank >= 0 && f.Rank < len(m.ranks) {
		rs := m.ranks[f.Rank]
		switch {
		case rs.signal != "":
			how = "killed by " + rs.signal
		case rs.state == event.WorkerFailed:
			how = fmt.Sprintf("exit code %d", rs.code)
		}
	}
	who := "the job"
	if f.Rank >= 0 {
		who = fmt.Sprintf("rank %d", f.Rank)
		if f.Node != "" {
			who += " on " + f.Node
		}
	}
	head := fmt.Sprintf(" ✗ %s failed", who)
	if how != "" {
		head += ": " + how
	}
	if len(f.Tail) > 0 {
		head += " — its last lines (esc hides):"
	}
	out := []string{st.Banner.r(fit(head, w))}
	tail := f.Tail
	maxTail := 3
	if h >= 30 {
		maxTail = 6
	}
	if len(tail) > maxTail {
		tail = tail[len(tail)-maxTail:]
	}
	for _, t := range tail {
		out = append(out, fit(st.Bad.r(" │ ")+t, w))
	}
	return out
}
