package tui

import (
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// nodesLines draws the nodes pane in w×h cells: each node's health as its
// agent reports it (CPU, memory, the workers' resident memory), then the
// memory of each of its devices or CPU workers as a bar, with a GPU's
// utilisation, power and temperature; a lost node's line says so. The
// figures are those of the running job's processes: none stays once they
// have ended. Only the lines in view are drawn: a thousand ranks' bars
// are counted, not drawn.
func (m *dashModel) nodesLines(c *canvas, st styles, w, h int) block {
	first := c.lines()
	focused := m.focus == paneNodes
	from := c.ruleBegin(focused)
	c.str("Nodes  health, memory used/total")
	c.ruleEnd(st, from, w, focused)
	c.endLine()
	only := m.healthOnly()
	lost, quiet := m.lostNodes(), m.agentSilentNodes()
	total := len(m.mem) + len(lost) + len(quiet)
	m.eachNode(only, func(node string, _, _ int) { total += m.healthCount(c, st, node, w) })
	if total == 0 {
		switch {
		case m.running():
			c.fitLine("  no reports yet", w)
		case m.state != "":
			c.fitLine("  no process of the job runs", w)
		default:
			c.fitLine("  no job", w)
		}
		return c.since(first)
	}
	l := lister{c: c, w: w, room: h, out: 1, total: total, top: min(m.memTop, max(total-(h-1), 0))}
	m.eachNode(only, func(node string, a, b int) {
		if l.done {
			return
		}
		for j := range m.healthCount(c, st, node, w) {
			if l.want() {
				c.trim(m.healthLines(c, st, node, w), j, j+1)
			}
			l.i++
		}
		for k := a; k < b && !l.done; k++ {
			if l.want() {
				m.memLine(c, st, m.mem[k], w)
				c.endLine()
			}
			l.i++
		}
	})
	noted := func(n, note string, how style) {
		if l.want() {
			from := len(c.b)
			c.byte(' ')
			c.styled(st.Bold, n)
			c.str("  ")
			c.styled(how, note)
			c.fit(from, w)
			c.endLine()
		}
		l.i++
	}
	for _, n := range lost {
		noted(n, "lost: no reports", st.Bad)
	}
	for _, n := range quiet {
		noted(n, m.agentSilent[n], st.Warn)
	}
	return c.since(first)
}

// lister places the lines of a pane's body from line top on, as they
// come, below its title, in a pane of room lines: the last of them says
// how many more follow, when more do.
type lister struct {
	c              *canvas
	w, room, total int
	top            int
	i              int // the body line that comes next
	out            int // the pane's lines drawn
	done           bool
}

// want reports whether body line l.i is to be drawn: the caller draws it
// then, as one line, and counts it (l.i++) either way.
func (l *lister) want() bool {
	if l.done || l.i < l.top {
		return false
	}
	if l.out >= l.room {
		l.done = true
		return false
	}
	if l.out == l.room-1 && l.i < l.total-1 {
		c := l.c
		from := len(c.b)
		c.str("  … ")
		c.num(l.total - l.i)
		c.str(" more (tab here, j/k)")
		c.fit(from, l.w)
		c.endLine()
		l.out++
		l.done = true
		return false
	}
	l.out++
	return true
}

// eachNode calls f for each node with reports, in the nodes pane's
// order: those with memory bars (m.mem[a:b]), by name, then those with
// health reports alone (only, with no bars).
func (m *dashModel) eachNode(only []string, f func(node string, a, b int)) {
	for a := 0; a < len(m.mem); {
		node := m.mem[a].node
		b := a + 1
		for b < len(m.mem) && m.mem[b].node == node {
			b++
		}
		f(node, a, b)
		a = b
	}
	for _, n := range only {
		f(n, 0, 0)
	}
}

// healthOnly returns the nodes with a health report and no memory bar,
// by name; nil if none.
func (m *dashModel) healthOnly() []string {
	var only []string
	for n := range m.health {
		if _, found := slices.BinarySearchFunc(m.mem, n, func(r memRow, n string) int { return strings.Compare(r.node, n) }); !found {
			only = append(only, n)
		}
	}
	slices.Sort(only)
	return only
}

// healthCount returns the number of lines of node's health (healthLines).
func (m *dashModel) healthCount(c *canvas, st styles, node string, w int) int {
	p := c.here()
	n := m.healthLines(c, st, node, w).n
	c.back(p)
	return n
}

// healthLines draws a node's load: its name, CPU utilisation, memory in
// use and its workers' resident memory, in one line or, when narrow, two.
func (m *dashModel) healthLines(c *canvas, st styles, node string, w int) block {
	hl, ok := m.health[node]
	if !ok {
		first := c.lines()
		from := len(c.b)
		c.byte(' ')
		c.styled(st.Bold, node)
		c.fit(from, w)
		c.endLine()
		return c.since(first)
	}
	p := c.pack(w, 2)
	p.styled(st.Bold, node)
	p.begin()
	c.str("cpu ")
	c.fixed(hl.CPUPercent, 0)
	c.str("% of ")
	c.num(hl.Cores)
	p.end()
	p.begin()
	c.str("mem ")
	c.str(hl.memText)
	p.end()
	if hl.WorkersRSS > 0 {
		p.begin()
		c.str("workers ")
		c.str(hl.workersRSS)
		p.end()
	}
	return p.finish()
}

// memLine draws one memory bar: a GPU's (with its load) or a CPU
// worker's resident memory over the node's; the line stays open.
func (m *dashModel) memLine(c *canvas, st styles, r memRow, w int) {
	var buf [96]byte
	val := append(buf[:0], r.text...)
	if r.device >= 0 {
		for _, g := range m.health[r.node].GPUs {
			if g.Index != r.device {
				continue
			}
			if g.UtilPercent >= 0 {
				val = append(strconv.AppendInt(append(val, ' '), int64(g.UtilPercent), 10), '%')
			}
			if g.PowerW >= 0 {
				val = append(strconv.AppendFloat(append(val, ' '), g.PowerW, 'f', 0, 64), 'W')
			}
			if g.TempC >= 0 {
				val = append(strconv.AppendInt(append(val, ' '), int64(g.TempC), 10), "°C"...)
			}
		}
	}
	from := len(c.b)
	c.str("   ")
	dev := len(c.b)
	if r.device < 0 {
		c.byte('r')
		c.num(r.rank)
	} else {
		c.str("gpu")
		c.num(r.device)
	}
	c.padTo(dev, 5)
	c.byte(' ')
	barW := w - (len(c.b) - from) - utf8.RuneCount(val) - 1
	if barW < 3 {
		c.b = append(c.b, val...)
		c.fit(from, w)
		return
	}
	total := r.total
	if total <= 0 {
		total = r.used
	}
	c.bar(st, r.used, total, barW)
	c.byte(' ')
	c.b = append(c.b, val...)
}

// bar draws used/total as a bar of w cells.
func (c *canvas) bar(st styles, used, total int64, w int) {
	if w <= 0 {
		return
	}
	full := 0
	if total > 0 {
		full = int(float64(used) / float64(total) * float64(w))
	}
	full = min(max(full, 0), w)
	from := len(c.b)
	c.repeat("█", full)
	c.paint(st.Bar, from)
	from = len(c.b)
	c.repeat("░", w-full)
	c.paint(st.Dim, from)
}

// rankCol is a column of the ranks pane.
type rankCol struct {
	head string
	w    int // its width; the collective column's least
	prio int // columns of low priority go first when the pane is narrow
	cell func(c *canvas, r *rankState, now time.Time)
}

// collectiveHead heads the column of the collective in flight.
const collectiveHead = "collective / how it ended"

// heatMin is the fewest cells the heat strip keeps.
const heatMin = 10

// flexMax bounds how wide the node and collective columns grow when the
// pane has room.
const flexMax = 64

// rankCols are the ranks pane's columns, left to right.
var rankCols = [...]rankCol{
	{"state", 11, 9, func(c *canvas, r *rankState, _ time.Time) {
		switch {
		case r.silent > 0:
			c.str("silent ")
			c.b = appendDuration(c.b, r.silent.Seconds())
		case r.agentSilent && r.state == rankRunning:
			c.str("agent silent")
		default:
			c.str(stateName(r.state))
		}
		if r.cause {
			c.str(" ✗")
		}
	}},
	{"node", 12, 2, func(c *canvas, r *rankState, _ time.Time) { c.str(r.node) }},
	{"pid", 7, 0, func(c *canvas, r *rankState, _ time.Time) {
		if r.pid == 0 || ended(r.state) {
			c.byte('-')
			return
		}
		c.num(r.pid)
	}},
	{"step", 7, 8, func(c *canvas, r *rankState, _ time.Time) {
		if r.steps == 0 {
			c.byte('-')
			return
		}
		c.num(r.last.Step)
	}},
	{"step s", 7, 4, func(c *canvas, r *rankState, _ time.Time) { secs(c, r, r.last.StepTimeS) }},
	{"comp s", 7, 7, func(c *canvas, r *rankState, _ time.Time) { secs(c, r, r.last.ComputeS()) }},
	{"cpu", 5, 3, func(c *canvas, r *rankState, _ time.Time) {
		if r.cpu < 0 || ended(r.state) {
			c.byte('-')
			return
		}
		c.fixed(r.cpu, 0)
		c.byte('%')
	}},
	{"tok/s", 7, 1, func(c *canvas, r *rankState, _ time.Time) {
		if r.steps == 0 {
			c.byte('-')
			return
		}
		c.str(r.tokens)
	}},
	{"mem", 8, 3, func(c *canvas, r *rankState, _ time.Time) {
		if r.mem <= 0 {
			c.byte('-')
			return
		}
		c.str(r.memText)
	}},
	{collectiveHead, 26, 6, func(c *canvas, r *rankState, _ time.Time) { c.str(collective(r)) }},
	{"heard", 8, 5, func(c *canvas, r *rankState, now time.Time) {
		if ended(r.state) || r.heard.IsZero() || now.IsZero() {
			c.byte('-')
			return
		}
		c.b = appendDuration(c.b, max(now.Sub(r.heard).Seconds(), 0))
		c.str(" ago")
	}},
}

// ranksLines draws the ranks pane in w×h cells: a row per rank, in rank
// order or slowest first, with its state (or how long it has been
// silent), node, pid, step, step and compute time, CPU, throughput,
// memory, its collective in flight (or last, or how it ended) and the
// age of its last progress report; at the end of each row the heat
// strip, its compute time over its last steps against the median rank's.
// The columns of least use go first when the pane is narrow; when it is
// wide, the node and collective columns take what their text needs (the
// widest of every rank's, which settle measures) and the heat strip the
// rest. Only the rows in view are drawn.
func (m *dashModel) ranksLines(c *canvas, st styles, w, h int, now time.Time) block {
	first := c.lines()
	rows := h - 2
	if len(m.ranks) > 0 && rows > 0 {
		pos := 0
		for i, r := range m.order {
			if r == m.sel {
				pos = i
			}
		}
		if pos < m.rankTop {
			m.rankTop = pos
		}
		if pos >= m.rankTop+rows {
			m.rankTop = pos - rows + 1
		}
		m.rankTop = min(m.rankTop, max(len(m.order)-rows, 0))
	}
	focused := m.focus == paneRanks
	from := c.ruleBegin(focused)
	c.str("Ranks  ")
	m.stateCounts(c, st)
	if m.slow.rank >= 0 {
		c.str(" · ")
		c.b = m.slow.appendText(c.b, true)
	}
	if m.bySlow {
		c.str(" · slowest first (o)")
	} else {
		c.str(" · by number (o)")
	}
	if len(m.ranks) > 0 && rows > 0 && len(m.order) > rows {
		c.str(" · rows ")
		c.num(m.rankTop + 1)
		c.byte('-')
		c.num(min(m.rankTop+rows, len(m.order)))
		c.str(" of ")
		c.num(len(m.order))
	}
	c.ruleEnd(st, from, w, focused)
	c.endLine()
	if len(m.ranks) == 0 {
		c.fitLine("  no ranks yet", w)
		return c.since(first)
	}
	cols := rankCols
	n := len(cols)
	// Without a process, a rank has no pid, CPU, memory or word.
	if !m.anyProcess() {
		k := 0
		for _, col := range cols {
			if col.head != "pid" && col.head != "cpu" && col.head != "mem" && col.head != "heard" {
				cols[k] = col
				k++
			}
		}
		n = k
	}
	// Drop the columns of least priority until the strip has room.
	var digits [20]byte
	numW := max(len(strconv.AppendInt(digits[:0], int64(len(m.ranks)-1), 10)), 4) + 1
	used := func() int {
		u := 1 + numW
		for _, col := range cols[:n] {
			u += col.w + 1
		}
		return u
	}
	for w-used() < heatMin && n > 2 {
		low := 0
		for i, col := range cols[:n] {
			if col.prio < cols[low].prio {
				low = i
			}
		}
		copy(cols[low:n], cols[low+1:n])
		n--
	}
	// Room to spare goes to the node and collective columns, as much as
	// their text needs, then to the heat strip.
	for i := range cols[:n] {
		col := &cols[i]
		var widths *[flexMax + 1]int
		switch col.head {
		case "node":
			widths = &m.pace.nodeW
		case collectiveHead:
			widths = &m.pace.collW
		default:
			continue
		}
		need := max(col.w, widest(widths))
		col.w += max(min(min(need, flexMax)-col.w, w-used()-heatMin), 0)
	}
	from = len(c.b)
	c.byte(' ')
	at := len(c.b)
	c.str("rank")
	c.padTo(at, numW)
	for _, col := range cols[:n] {
		at := len(c.b)
		c.str(col.head)
		c.fit(at, col.w)
		c.byte(' ')
	}
	heatW := max(w-used(), 0)
	at = len(c.b)
	c.str("compute per step vs others (█ ≥3×)")
	c.fit(at, heatW)
	c.fit(from, w)
	c.paint(st.Dim, from)
	c.endLine()

	for i := m.rankTop; rows > 0 && i < len(m.order) && i < m.rankTop+rows; i++ {
		ri := m.order[i]
		r := &m.ranks[ri]
		from := len(c.b)
		if ri == m.sel {
			c.str("›")
		} else {
			c.byte(' ')
		}
		at := len(c.b)
		c.num(ri)
		c.padTo(at, numW)
		if ri == m.sel {
			c.paint(st.Sel, from)
		}
		for k, col := range cols[:n] {
			at := len(c.b)
			col.cell(c, r, now)
			c.fit(at, col.w)
			if k == 0 {
				s := r.state
				if r.silent > 0 {
					s = rankSilent
				}
				c.paint(st.state(s), at)
			}
			c.byte(' ')
		}
		m.heat(c, st, r, heatW)
		c.fit(from, w)
		c.endLine()
	}
	return c.since(first)
}

// anyProcess reports whether a rank runs or is starting: has a process.
func (m *dashModel) anyProcess() bool {
	for i := range m.ranks {
		if s := m.ranks[i].state; s == rankRunning || s == rankStarting {
			return true
		}
	}
	return false
}

// secs writes a time of the rank's last step.
func secs(c *canvas, r *rankState, s float64) {
	if r.steps == 0 {
		c.byte('-')
		return
	}
	c.fixed(s, 3)
}

// collective says what the rank is doing in its communicator: the
// operation in flight and for how long, or its last one (progressText);
// for a rank that has ended, how it ended.
func collective(r *rankState) string {
	if ended(r.state) || r.state == rankRestarting {
		return r.why
	}
	if r.prog == nil {
		return ""
	}
	return r.progText
}

// heatLevels shade a step's compute time against the median rank's.
var heatLevels = []struct {
	upTo float64
	r    rune
}{{1.15, '▁'}, {1.5, '▃'}, {2, '▅'}, {3, '▇'}, {1e300, '█'}}

// heat draws the rank's compute time over its last steps, newest at the
// right, in w cells.
func (m *dashModel) heat(c *canvas, st styles, r *rankState, w int) {
	if w <= 0 {
		return
	}
	t := r.tail(w)
	ref := m.slow.typical
	c.spaces(w - t.n)
	looks := [...]style{st.OK, st.Warn, st.Bad}
	run, look := -1, -1
	for i := range t.n {
		s := t.at(i)
		ratio := 1.0
		if ref > 0 {
			ratio = s.computeS / ref
		}
		lvl := 0
		for lvl < len(heatLevels)-1 && ratio > heatLevels[lvl].upTo {
			lvl++
		}
		k := 0
		switch {
		case lvl >= 3:
			k = 2
		case lvl >= 1:
			k = 1
		}
		if k != look {
			if run >= 0 {
				c.paint(looks[look], run)
			}
			run, look = len(c.b), k
		}
		c.char(heatLevels[lvl].r)
	}
	if run >= 0 {
		c.paint(looks[look], run)
	}
}

// logLines draws the log pane in w×h cells: the selected rank's lines,
// the newest at the bottom (or where the scrolling left them), long lines
// wrapped when wrap is on, else cut.
func (m *dashModel) logLines(c *canvas, st styles, w, h int) block {
	first := c.lines()
	l := m.logs[m.sel]
	focused := m.focus == paneLog
	from := c.ruleBegin(focused)
	c.str("Log  rank ")
	c.num(m.sel)
	if m.sel < len(m.ranks) && m.ranks[m.sel].node != "" {
		c.str(" on ")
		c.str(m.ranks[m.sel].node)
	}
	if m.follow {
		c.str(" · follow")
	} else {
		c.str(" · ")
		c.num(m.logOff)
		c.str(" lines up (G follows)")
	}
	if m.wrap {
		c.str(" · wrap (W)")
	} else {
		c.str(" · cut (W wraps)")
	}
	if m.search != "" {
		c.str(" · /")
		c.str(m.search)
		c.str(" (n/N)")
	}
	c.ruleEnd(st, from, w, focused)
	c.endLine()
	rows := h - 1
	n := 0
	if l != nil {
		n = l.len()
	}
	if n == 0 {
		c.fitLine("  no output from this rank yet", w)
		return c.since(first)
	}
	end := n - min(m.logOff, n-1)
	if !m.wrap {
		for i := max(end-rows, 0); i < end; i++ {
			from := len(c.b)
			s := l.at(i)
			if j := strings.Index(s, m.search); m.search != "" && j >= 0 {
				c.str("▸")
				c.str(s[:j])
				c.styled(st.Match, s[j:j+len(m.search)])
				c.str(s[j+len(m.search):])
			} else {
				c.byte(' ')
				c.str(s)
			}
			c.fit(from, w)
			c.endLine()
		}
		return c.since(first)
	}
	var shown []string // bottom up
	for i := end - 1; i >= 0 && len(shown) < rows; i-- {
		s := l.at(i)
		gutter := " "
		if m.search != "" {
			if j := strings.Index(s, m.search); j >= 0 {
				gutter = "▸"
				s = s[:j] + st.Match.r(s[j:j+len(m.search)]) + s[j+len(m.search):]
			}
		}
		parts := wrap(s, w-1)
		for k := len(parts) - 1; k >= 0 && len(shown) < rows; k-- {
			g := " "
			if k == 0 {
				g = gutter
			} else if k > 0 {
				g = st.Dim.r("↪")
			}
			shown = append(shown, fit(g+parts[k], w))
		}
	}
	for i := len(shown) - 1; i >= 0; i-- {
		c.textLine(shown[i])
	}
	return c.since(first)
}
