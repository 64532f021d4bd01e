package tui

import (
	"fmt"
	"github.com/gptui/gptui/internal/units"
	"slices"
	"strings"
	"time"

	"github.com/charmbracelet/x/ansi"
)

// nodesLines draws the nodes pane in w×h cells: each node's health as its
// agent reports it (CPU, memory, the workers' resident memory), then the
// memory of each of its devices or CPU workers as a bar, with a GPU's
// utilisation, power and temperature; a lost node's line says so. The
// figures are those of the running job's processes: none stays once they
// have ended.
func (m *dashModel) nodesLines(st styles, w, h int) []string {
	out := []string{rule(st, "Nodes  health, memory used/total", w, m.focus == paneNodes)}
	var body []string
	nodes := m.nodeNames()
	for _, n := range nodes {
		body = append(body, m.healthLines(st, n, w)...)
		for _, r := range m.mem {
			if r.node == n {
				body = append(body, m.memLine(st, r, w))
			}
		}
	}
	for _, n := range m.lostNodes() {
		body = append(body, fit(" "+st.Bold.r(n)+"  "+st.Bad.r("lost: no reports"), w))
	}
	if len(body) == 0 {
		switch {
		case m.running():
			return append(out, fit("  no reports yet", w))
		case m.state != "":
			return append(out, fit("  no process of the job runs", w))
		}
		return append(out, fit("  no job", w))
	}
	rows := h - 1
	top := min(m.memTop, max(len(body)-rows, 0))
	for i := top; i < len(body) && len(out) < h; i++ {
		if len(out) == h-1 && i < len(body)-1 {
			out = append(out, fit(fmt.Sprintf("  … %d more (tab here, j/k)", len(body)-i), w))
			break
		}
		out = append(out, body[i])
	}
	return out
}

// nodeNames returns the nodes with reports: those with memory bars in
// their order, then those with health reports alone, by name.
func (m *dashModel) nodeNames() []string {
	var names, only []string
	for _, r := range m.mem {
		if !slices.Contains(names, r.node) {
			names = append(names, r.node)
		}
	}
	for n := range m.health {
		if !slices.Contains(names, n) {
			only = append(only, n)
		}
	}
	slices.Sort(only)
	return append(names, only...)
}

// healthLines is a node's load: its name, CPU utilisation, memory in use
// and its workers' resident memory, in one line or, when narrow, two.
func (m *dashModel) healthLines(st styles, node string, w int) []string {
	hl, ok := m.health[node]
	if !ok {
		return []string{fit(" "+st.Bold.r(node), w)}
	}
	f := []string{st.Bold.r(node), fmt.Sprintf("cpu %.0f%% of %d", hl.CPUPercent, hl.Cores), fmt.Sprintf("mem %s/%s", units.BytesShort(hl.MemUsed), units.BytesShort(hl.MemTotal))}
	if hl.WorkersRSS > 0 {
		f = append(f, "workers "+units.BytesShort(hl.WorkersRSS))
	}
	return pack(f, w, 2)
}

// memLine draws one memory bar: a GPU's (with its load) or a CPU
// worker's resident memory over the node's.
func (m *dashModel) memLine(st styles, r memRow, w int) string {
	dev := fmt.Sprintf("gpu%d", r.device)
	if r.device < 0 {
		dev = fmt.Sprintf("r%d", r.rank)
	}
	val := units.BytesShort(r.used)
	if r.total > 0 {
		val += "/" + units.BytesShort(r.total)
	}
	if r.device >= 0 {
		for _, g := range m.health[r.node].GPUs {
			if g.Index != r.device {
				continue
			}
			if g.UtilPercent >= 0 {
				val += fmt.Sprintf(" %d%%", g.UtilPercent)
			}
			if g.PowerW >= 0 {
				val += fmt.Sprintf(" %.0fW", g.PowerW)
			}
			if g.TempC >= 0 {
				val += fmt.Sprintf(" %d°C", g.TempC)
			}
		}
	}
	label := fmt.Sprintf("   %-5s ", dev)
	barW := w - len(label) - len([]rune(val)) - 1
	if barW < 3 {
		return fit(label+val, w)
	}
	total := r.total
	if total <= 0 {
		total = r.used
	}
	return label + bar(st, r.used, total, barW) + " " + val
}

// rankCol is a column of the ranks pane.
type rankCol struct {
	head string
	w    int // its width; the collective column's least
	prio int // columns of low priority go first when the pane is narrow
	cell func(r *rankState) string
}

// collectiveHead heads the column of the collective in flight.
const collectiveHead = "collective / how it ended"

// heatMin is the fewest cells the heat strip keeps.
const heatMin = 10

// flexMax bounds how wide the node and collective columns grow when the
// pane has room.
const flexMax = 64

// ranksLines draws the ranks pane in w×h cells: a row per rank, in rank
// order or slowest first, with its state (or how long it has been
// silent), node, pid, step, step and compute time, CPU, throughput,
// memory, its collective in flight (or last, or how it ended) and the
// age of its last progress report; at the end of each row the heat
// strip, its compute time over its last steps against the median rank's.
// The columns of least use go first when the pane is narrow; when it is
// wide, the node and collective columns take what their text needs and
// the heat strip the rest.
func (m *dashModel) ranksLines(st styles, w, h int, now time.Time) []string {
	title := "Ranks  " + m.stateCounts(st)
	if m.slow.rank >= 0 {
		title += " · " + m.slow.text(true)
	}
	order := "by number"
	if m.bySlow {
		order = "slowest first"
	}
	title += " · " + order + " (o)"
	out := []string{rule(st, title, w, m.focus == paneRanks)}
	if len(m.ranks) == 0 {
		return append(out, fit("  no ranks yet", w))
	}
	cols := []rankCol{
		{"state", 11, 9, func(r *rankState) string {
			s := stateName(r.state)
			if r.silent > 0 {
				s = "silent " + duration(r.silent.Seconds())
			}
			if r.cause {
				s += " ✗"
			}
			return s
		}},
		{"node", 12, 2, func(r *rankState) string { return r.node }},
		{"pid", 7, 0, func(r *rankState) string {
			if r.pid == 0 || ended(r.state) {
				return "-"
			}
			return fmt.Sprint(r.pid)
		}},
		{"step", 7, 8, func(r *rankState) string {
			if r.steps == 0 {
				return "-"
			}
			return fmt.Sprint(r.last.Step)
		}},
		{"step s", 7, 4, func(r *rankState) string { return secs(r, r.last.StepTimeS) }},
		{"comp s", 7, 7, func(r *rankState) string { return secs(r, r.last.ComputeS()) }},
		{"cpu", 5, 3, func(r *rankState) string {
			if r.cpu < 0 || ended(r.state) {
				return "-"
			}
			return fmt.Sprintf("%.0f%%", r.cpu)
		}},
		{"tok/s", 7, 1, func(r *rankState) string {
			if r.steps == 0 {
				return "-"
			}
			return units.Metric(r.last.TokensPerS)
		}},
		{"mem", 7, 3, func(r *rankState) string {
			if r.mem <= 0 {
				return "-"
			}
			return units.BytesShort(r.mem)
		}},
		{collectiveHead, 26, 6, collective},
		{"heard", 8, 5, func(r *rankState) string {
			if ended(r.state) || r.heard.IsZero() || now.IsZero() {
				return "-"
			}
			return duration(max(now.Sub(r.heard).Seconds(), 0)) + " ago"
		}},
	}
	// Without a process, a rank has no pid, CPU, memory or word.
	if !slices.ContainsFunc(m.ranks, func(r rankState) bool { return r.state == rankRunning || r.state == rankStarting }) {
		cols = slices.DeleteFunc(cols, func(c rankCol) bool {
			return c.head == "pid" || c.head == "cpu" || c.head == "mem" || c.head == "heard"
		})
	}
	// Drop the columns of least priority until the strip has room.
	numW := max(len(fmt.Sprint(len(m.ranks)-1)), 4) + 1
	used := func() int {
		n := 1 + numW
		for _, c := range cols {
			n += c.w + 1
		}
		return n
	}
	for w-used() < heatMin && len(cols) > 2 {
		low := 0
		for i, c := range cols {
			if c.prio < cols[low].prio {
				low = i
			}
		}
		cols = append(cols[:low], cols[low+1:]...)
	}
	// Room to spare goes to the node and collective columns, as much as
	// their text needs, then to the heat strip.
	for i := range cols {
		c := &cols[i]
		if c.head != "node" && c.head != collectiveHead {
			continue
		}
		need := c.w
		for k := range m.ranks {
			need = max(need, ansi.StringWidth(c.cell(&m.ranks[k])))
		}
		c.w += max(min(min(need, flexMax)-c.w, w-used()-heatMin), 0)
	}
	var head strings.Builder
	head.WriteString(" " + fmt.Sprintf("%-*s", numW, "rank"))
	for _, c := range cols {
		head.WriteString(fit(c.head, c.w) + " ")
	}
	heatW := max(w-used(), 0)
	head.WriteString(fit("compute per step vs others (█ ≥3×)", heatW))
	out = append(out, st.Dim.r(fit(head.String(), w)))

	rows := h - 2
	if rows <= 0 {
		return out
	}
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
	var b strings.Builder
	for i := m.rankTop; i < len(m.order) && i < m.rankTop+rows; i++ {
		ri := m.order[i]
		r := &m.ranks[ri]
		b.Reset()
		num := fmt.Sprintf("%-*d", numW, ri)
		if ri == m.sel {
			b.WriteString(st.Sel.r("›" + num))
		} else {
			b.WriteString(" " + num)
		}
		for k, c := range cols {
			cell := fit(c.cell(r), c.w)
			if k == 0 {
				s := r.state
				if r.silent > 0 {
					s = rankSilent
				}
				cell = st.state(s).r(cell)
			}
			b.WriteString(cell + " ")
		}
		b.WriteString(m.heat(st, r, heatW))
		out = append(out, fit(b.String(), w))
	}
	if len(m.order) > rows {
		out[0] = rule(st, title+fmt.Sprintf(" · rows %d-%d of %d", m.rankTop+1, min(m.rankTop+rows, len(m.order)), len(m.order)), w, m.focus == paneRanks)
	}
	return out
}

// secs formats a time of the rank's last step.
func secs(r *rankState, s float64) string {
	if r.steps == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", s)
}

// collective says what the rank is doing in its communicator: the
// operation in flight and for how long, or its last one; for a rank that
// has ended, how it ended.
func collective(r *rankState) string {
	if ended(r.state) || r.state == rankRestarting {
		return r.why
	}
	p := r.prog
	if p == nil {
		return ""
	}
	if len(p.InFlight) > 0 {
		op := p.InFlight[0]
		return fmt.Sprintf("in %s %.0fs", op, op.WaitS)
	}
	if p.Last != nil {
		return "after " + p.Last.String()
	}
	return fmt.Sprintf("computing step %d", p.Step)
}

// heatLevels shade a step's compute time against the median rank's.
var heatLevels = []struct {
	upTo float64
	r    rune
}{{1.15, '▁'}, {1.5, '▃'}, {2, '▅'}, {3, '▇'}, {1e300, '█'}}

// heat draws the rank's compute time over its last steps, newest at the
// right, in w cells.
func (m *dashModel) heat(st styles, r *rankState, w int) string {
	if w <= 0 {
		return ""
	}
	t := r.tail(w)
	ref := m.slow.typical
	var b strings.Builder
	b.WriteString(strings.Repeat(" ", w-len(t)))
	var run strings.Builder
	runStyle := -1
	flush := func() {
		if run.Len() == 0 {
			return
		}
		s := []style{st.OK, st.Warn, st.Bad}[runStyle]
		b.WriteString(s.r(run.String()))
		run.Reset()
	}
	for _, s := range t {
		ratio := 1.0
		if ref > 0 {
			ratio = s.computeS / ref
		}
		lvl := 0
		for lvl < len(heatLevels)-1 && ratio > heatLevels[lvl].upTo {
			lvl++
		}
		sty := 0
		switch {
		case lvl >= 3:
			sty = 2
		case lvl >= 1:
			sty = 1
		}
		if sty != runStyle {
			flush()
			runStyle = sty
		}
		run.WriteRune(heatLevels[lvl].r)
	}
	flush()
	return b.String()
}

// logLines draws the log pane in w×h cells: the selected rank's lines,
// the newest at the bottom (or where the scrolling left them), long lines
// wrapped when wrap is on, else cut.
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
	if m.wrap {
		title += " · wrap (W)"
	} else {
		title += " · cut (W wraps)"
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
		if !m.wrap {
			shown = append(shown, fit(gutter+s, w))
			continue
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
		out = append(out, shown[i])
	}
	return out
}
