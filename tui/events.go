package tui

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gptui/gptui/event"
)

// The events pane lists what happened to the job, its nodes and its
// workers, one row per event — time, event, rank or node, cause — from
// the job's event stream itself. Every kind of event is listed but the
// figures that come many times a second (telemetry), so a kind the
// stream gains is listed too, without a change here. Consecutive events
// that differ only in their rank (the workers of a node starting) share a
// row: "ranks 0–7".

// eventRows is how many rows the events pane keeps.
const eventRows = 1000

// telemetry are the kinds of event the events pane leaves out: the
// figures and lines other panes show.
var telemetry = map[string]bool{
	event.KindMetrics: true, event.KindMemory: true, event.KindLog: true, event.KindProgress: true,
	event.KindHealth: true, event.KindHeartbeat: true, event.KindProbe: true,
}

// eventRow is one row of the events pane.
type eventRow struct {
	at    time.Time
	what  string // the kind and state: "worker failed", "job restarting"
	node  string
	ranks []int  // the ranks it is about, in order; none for a node's or the job's
	who   string // names(), kept as the row grows
	cause string
	bad   bool // a failure, a loss, a hang
	warn  bool // a stop, a restart
}

// eventLog is the events pane's rows, the last eventRows of them.
type eventLog struct {
	rows  []eventRow
	limit int
}

func newEventLog(n int) eventLog { return eventLog{limit: max(n, 1)} }

// add lists ev, unless it is telemetry.
func (l *eventLog) add(ev event.Event) {
	if telemetry[ev.Kind] {
		return
	}
	row := rowOf(ev)
	if n := len(l.rows); n > 0 && len(row.ranks) == 1 {
		last := &l.rows[n-1]
		if len(last.ranks) > 0 && last.what == row.what && last.node == row.node && last.cause == row.cause &&
			!slices.Contains(last.ranks, row.ranks[0]) && row.at.Sub(last.at) < time.Second {
			last.ranks = append(last.ranks, row.ranks[0])
			slices.Sort(last.ranks)
			last.who = last.names()
			return
		}
	}
	row.who = row.names()
	l.rows = append(l.rows, row)
	if len(l.rows) > l.limit {
		l.rows = slices.Delete(l.rows, 0, len(l.rows)-l.limit)
	}
}

// rowOf is ev as a row: its kind and state, its rank or node, and its
// cause: how a worker ended, a restart's cause, the event's message.
func rowOf(ev event.Event) eventRow {
	row := eventRow{at: ev.Time, what: strings.TrimSpace(ev.Kind + " " + ev.State), node: ev.Node, cause: clean(ev.Message)}
	if ev.Rank >= 0 {
		row.ranks = []int{ev.Rank}
	}
	switch ev.State { // failed and stopped, of a worker, a node or the job
	case event.WorkerFailed, event.NodeLost, event.JobHung:
		row.bad = true
	case event.WorkerStopped, event.JobRestarting, event.JobReplanned:
		row.warn = true
	}
	switch ev.Kind {
	case event.KindWorker:
		switch ev.State {
		case event.WorkerRunning, event.WorkerStarting:
			row.cause = "" // the pid is in the ranks pane
		case event.WorkerExited, event.WorkerFailed, event.WorkerStopped:
			if ev.State != event.WorkerExited || ev.Code != 0 || ev.Signal != "" {
				row.cause = how(ev.Code, ev.Signal)
			}
			if ev.Exit != nil && ev.Exit.Error != "" {
				row.cause = strings.TrimPrefix(row.cause+": "+clean(ev.Exit.Error), ": ")
			}
		}
	case event.KindCheckpoint:
		if c := ev.Checkpoint; c != nil && row.cause == "" {
			row.cause = fmt.Sprintf("step %d", c.Step)
			if c.Dir != "" {
				row.cause += " in " + clean(c.Dir)
			}
		}
	case event.KindJob:
		if ev.Restart != nil {
			row.cause = clean(ev.Restart.String())
		}
		if ev.State == event.JobFailed && row.cause == "" {
			row.cause = how(ev.Code, ev.Signal)
		}
	}
	if row.cause == "" && (ev.Code != 0 || ev.Signal != "") {
		row.cause = how(ev.Code, ev.Signal)
	}
	return row
}

// names names the row's ranks and node: "rank 3@node2", "ranks 0–3,
// 6@localhost", "node2".
func (r eventRow) names() string {
	s := ranksText(r.ranks)
	switch {
	case s != "" && r.node != "":
		return s + "@" + r.node
	case s != "":
		return s
	}
	return r.node
}

// ranksText is a list of ranks in runs: "rank 3", "ranks 0–3, 6".
func ranksText(rs []int) string {
	if len(rs) == 0 {
		return ""
	}
	if len(rs) == 1 {
		return fmt.Sprintf("rank %d", rs[0])
	}
	var parts []string
	for i := 0; i < len(rs); {
		j := i
		for j+1 < len(rs) && rs[j+1] == rs[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d–%d", rs[i], rs[j]))
		} else {
			parts = append(parts, fmt.Sprint(rs[i]))
		}
		i = j + 1
	}
	return "ranks " + strings.Join(parts, ", ")
}

// eventsLines draws the events pane in w×h cells: the newest row at the
// bottom, or where scrolling left them (evOff rows up).
func (m *dashModel) eventsLines(c *canvas, st styles, w, h int) block {
	first := c.lines()
	rows := m.events.rows
	focused := m.focus == paneEvents
	from := c.ruleBegin(focused)
	c.str("Events  ")
	c.num(len(rows))
	if m.evOff > 0 {
		c.str(" · ")
		c.num(m.evOff)
		c.str(" up (G: newest)")
	}
	c.ruleEnd(st, from, w, focused)
	c.endLine()
	if len(rows) == 0 {
		c.fitLine("  no events yet", w)
		return c.since(first)
	}
	n := h - 1
	end := len(rows) - min(m.evOff, len(rows)-1)
	start := max(end-n, 0)
	// time (8), event, who; the cause takes the rest.
	whatW, whoW := 18, 16
	for _, r := range rows[start:end] {
		whatW = max(whatW, len(r.what))
		whoW = max(whoW, utf8.RuneCountInString(r.who))
	}
	whatW, whoW = min(whatW, 20), min(whoW, max(16, w/3))
	if w < 70 {
		whatW, whoW = min(whatW, 14), min(whoW, 16)
	}
	for _, r := range rows[start:end] {
		from := len(c.b)
		switch {
		case r.bad:
			c.styled(st.Bad, "✗")
		case r.warn:
			c.styled(st.Warn, "!")
		default:
			c.byte(' ')
		}
		at := len(c.b)
		c.b = r.at.AppendFormat(c.b, "15:04:05")
		c.paint(st.Dim, at)
		c.byte(' ')
		at = len(c.b)
		c.str(r.what)
		c.fit(at, whatW)
		c.byte(' ')
		at = len(c.b)
		c.str(r.who)
		c.fit(at, whoW)
		c.byte(' ')
		c.str(r.cause)
		c.fit(from, w)
		c.endLine()
	}
	return c.since(first)
}
