package tui

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// view draws the dashboard in w×h cells at time now (the model's clock,
// which ages the heartbeats and the checkpoint) into c, and appends its
// h lines to rows: the header, the failure banner, then the loss chart
// beside the speed and the nodes, the ranks and the log; or, zoomed, the
// header and the focused pane alone.
func (m *dashModel) view(c *canvas, rows []int, st styles, w, h int, now time.Time) []int {
	top := len(rows)
	rows = appendBlock(rows, m.header(c, st, w, now))
	if m.banner && m.failure != nil {
		first := c.lines()
		for _, l := range m.bannerLines(st, w, max(3, h/3)) {
			c.textLine(l)
		}
		rows = appendBlock(rows, c.since(first))
	}
	rest := h - (len(rows) - top)
	if m.zoom {
		rows = appendBlock(rows, m.pane(c, st, m.focus, w, rest, now))
		return padRows(c, rows, top, h)
	}
	ranksH := 1 + min(max(len(m.ranks), 1)+1, max(3, rest/4))
	topH := max(5, rest*2/5)
	logH := rest - topH - ranksH
	if logH < 4 {
		topH = max(4, topH-(4-logH))
		logH = rest - topH - ranksH
	}

	// The loss chart beside the speed and the nodes.
	chartW := w * 3 / 5
	sideW := w - chartW - 1
	left := m.pane(c, st, paneChart, chartW, topH, now)
	speed := m.speedLines(c, st, sideW)
	nodes := m.pane(c, st, paneNodes, sideW, max(topH-speed.n, 2), now)
	right := block{speed.first, speed.n + nodes.n} // the nodes follow the speed
	for i := range topH {
		c.putFit(left.at(i), chartW)
		c.byte(' ')
		c.putFit(right.at(i), sideW)
		rows = append(rows, c.endLine())
	}
	rows = appendBlock(rows, m.pane(c, st, paneRanks, w, ranksH, now))
	// The log beside the events where there is room; else the events,
	// a few rows, above the log.
	if w >= wideEvents {
		logW := w * 11 / 20
		evW := w - logW - 1
		lg := m.pane(c, st, paneLog, logW, logH, now)
		es := m.pane(c, st, paneEvents, evW, logH, now)
		for i := range logH {
			c.putFit(lg.at(i), logW)
			c.byte(' ')
			c.putFit(es.at(i), evW)
			rows = append(rows, c.endLine())
		}
		return padRows(c, rows, top, h)
	}
	evH := min(4, logH-4)
	if evH >= 2 {
		rows = appendBlock(rows, m.pane(c, st, paneEvents, w, evH, now))
		logH -= evH
	}
	rows = appendBlock(rows, m.pane(c, st, paneLog, w, logH, now))
	return padRows(c, rows, top, h)
}

// appendBlock appends the lines of k to rows.
func appendBlock(rows []int, k block) []int {
	for i := range k.n {
		rows = append(rows, k.first+i)
	}
	return rows
}

// padRows makes the rows from top on exactly h: cut, or padded with empty
// lines.
func padRows(c *canvas, rows []int, top, h int) []int {
	if len(rows)-top > h {
		return rows[:top+h]
	}
	if len(rows)-top < h {
		empty := c.endLine()
		for len(rows)-top < h {
			rows = append(rows, empty)
		}
	}
	return rows
}

// wideEvents is the narrowest dashboard that shows the events pane beside
// the log rather than above it.
const wideEvents = 120

// pane draws one pane with its title rule in w×h cells.
func (m *dashModel) pane(c *canvas, st styles, p, w, h int, now time.Time) block {
	var k block
	switch p {
	case paneChart:
		k = m.chartLines(c, st, w, h)
	case paneNodes:
		k = m.nodesLines(c, st, w, h)
	case paneRanks:
		k = m.ranksLines(c, st, w, h, now)
	case paneEvents:
		k = m.eventsLines(c, st, w, h)
	default:
		k = m.logLines(c, st, w, h)
	}
	return k.cut(h)
}

// lead returns the charted rank, whose figures the header shows; nil
// before any.
func (m *dashModel) lead() *rankState {
	if m.charted < 0 || m.charted >= len(m.ranks) || m.ranks[m.charted].steps == 0 {
		return nil
	}
	return &m.ranks[m.charted]
}

// eta estimates the time to the last step from the pace of the charted
// rank's recent steps in this attempt: by their clock (so evaluations
// and saves count), smoother than the last step's time and right from
// the second record; but never faster than the steps' own times say (a
// burst of records read at once is no pace).
func (m *dashModel) eta(r *rankState) (float64, bool) {
	if !m.running() || m.maxSteps <= r.last.Step+1 {
		return 0, false
	}
	const window = 32
	t := r.tail(window)
	var own [window]float64
	n := 0
	for i := range t.n {
		if s := t.at(i); s.stepS > 0 {
			own[n] = s.stepS
			n++
		}
	}
	per := median(own[:n])
	if t.n >= 2 {
		if first, last := t.at(0), t.at(t.n-1); last.step > first.step {
			if d := last.at.Sub(first.at).Seconds(); d > 0 {
				per = max(per, d/float64(last.step-first.step))
			}
		}
	}
	if per <= 0 {
		return 0, false
	}
	return float64(m.maxSteps-1-r.last.Step) * per, true
}

// header draws the figures of the job, wrapped into at most three lines:
// the step and loss first, then the ranks' states and the slowest rank,
// the optimizer's figures, the checkpoint and the restarts.
func (m *dashModel) header(c *canvas, st styles, w int, now time.Time) block {
	p := c.pack(w, 3)
	if m.state == "" && m.message != "" {
		p.text(m.message)
	}
	if r := m.lead(); r != nil {
		mt := r.last
		p.begin()
		m.stepText(c, mt.Step+1) // steps done: the record of step k is the (k+1)-th
		p.end()
		p.begin()
		from := len(c.b)
		c.str("loss ")
		c.fixed(mt.Loss, 4)
		c.paint(st.Bold, from)
		p.end()
		if e, ok := m.eval.last(); ok {
			p.begin()
			c.str("eval ")
			c.fixed(e.v, 4)
			p.end()
		}
		p.begin()
		c.str(r.tokens)
		c.str(" tok/s")
		p.end()
		p.begin()
		c.str("MFU ")
		c.fixed(mt.MFU*100, 1)
		c.byte('%')
		p.end()
		if m.slow.rank >= 0 && m.slow.silent > 0 && m.running() {
			// A silent rank holds every step back: no time is honest.
			p.begin()
			c.str("ETA paused")
			p.end()
		} else if eta, ok := m.eta(r); ok {
			p.begin()
			c.str("ETA ")
			c.b = appendDuration(c.b, eta)
			p.end()
		}
	} else if m.from > 0 {
		// A resumed attempt before its first step: where it resumes, not
		// the steps its agents send again.
		p.begin()
		m.stepText(c, m.from)
		if m.running() {
			c.str(" (resuming)")
		}
		p.end()
		if pt, ok := m.train.last(); ok && pt.step <= m.from {
			p.begin()
			from := len(c.b)
			c.str("loss ")
			c.fixed(pt.v, 4)
			c.paint(st.Bold, from)
			p.end()
		}
	}
	if !m.start.IsZero() {
		end := m.end
		if end.IsZero() {
			end = now
		}
		if total := end.Sub(m.start) - m.idle; total > 0 {
			// The time the job was in hand, the time it lay stopped
			// before a restart left out (the restart's field gives the
			// current attempt's).
			p.begin()
			c.str("elapsed ")
			c.b = appendDuration(c.b, total.Seconds())
			p.end()
		}
	}
	if len(m.ranks) > 0 {
		p.begin()
		c.str("ranks: ")
		m.stateCounts(c, st)
		p.end()
	}
	if s := m.slow; s.rank >= 0 {
		p.begin()
		from := len(c.b)
		c.b = s.appendText(c.b, false)
		switch {
		case s.silent > 0:
			c.paint(st.Bad, from)
		case s.stall.secs > 0 || s.ratio() >= 1.5:
			c.paint(st.Warn, from)
		}
		p.end()
	}
	if r := m.lead(); r != nil {
		mt := r.last
		p.begin()
		c.str("lr ")
		c.float(mt.LR, 'e', 2)
		p.end()
		p.begin()
		c.str("grad norm ")
		c.float(mt.GradNorm, 'g', 3)
		p.end()
		if mt.LossScale > 0 {
			p.begin()
			c.b = fmt.Appendf(c.b, "loss scale %g, %d skipped", mt.LossScale, mt.SkippedSteps)
			p.end()
		}
	}
	if m.state != "" || m.ckpt.step > 0 {
		p.begin()
		c.b = m.appendCkpt(c.b, now)
		p.end()
	}
	if r := m.restart; r != nil {
		from := "from the start"
		if r.Step > 0 {
			from = fmt.Sprintf("from step %d", r.Step)
		}
		n := fmt.Sprintf("%d/%d", r.Count, r.Max) // n of the policy's N
		if r.Requested {
			n = "(manual)" // asked for: the policy's count does not apply
		}
		this := ""
		if end := m.end; !m.attempt.IsZero() {
			if end.IsZero() {
				end = now
			}
			if end.After(m.attempt) {
				this = ", this attempt " + string(appendDuration(nil, end.Sub(m.attempt).Seconds()))
			}
		}
		p.styled(st.Warn, fmt.Sprintf("restart %s %s%s: %s", n, from, this, r.Cause))
		if m.replan != "" {
			p.styled(st.Warn, m.replan)
		}
	}
	if p.fields == 0 {
		p.discard()
		first := c.lines()
		c.fitLine(" no job yet: launch one from the Job screen (3)", w)
		return c.since(first)
	}
	return p.finish()
}

// stepText writes "step 12/200": the steps done, of the job's steps if
// known — the units of a checkpoint's step and of `gptui jobs`
// (jobdir.Summary.Done).
func (m *dashModel) stepText(c *canvas, step int) {
	c.str("step ")
	c.num(step)
	if m.maxSteps > 0 {
		c.byte('/')
		c.num(m.maxSteps)
	}
}

// stateCounts writes the ranks' states counted, as the last settle
// counted them, each in its colour: "3 running · 1 silent", "3 stopped ·
// 1 failed (cause)".
func (m *dashModel) stateCounts(c *canvas, st styles) {
	first := true
	for k, s := range rankOrder {
		n := m.pace.counts[k]
		if n <= 0 {
			continue
		}
		if !first {
			c.str(" · ")
		}
		first = false
		from := len(c.b)
		c.num(n)
		c.byte(' ')
		c.str(stateName(s))
		if m.pace.causes[k] > 0 {
			c.str(" (cause)")
		}
		c.paint(st.state(stateName(s)), from)
	}
}

// appendCkpt appends where the checkpoints are: the last one saved and
// how long ago, a save in flight.
func (m *dashModel) appendCkpt(b []byte, now time.Time) []byte {
	c := m.ckpt
	switch {
	case c.step > 0:
		b = strconv.AppendInt(append(b, "checkpoint step "...), int64(c.step), 10)
		if !c.at.IsZero() && now.After(c.at) {
			b = append(appendDuration(append(b, ' '), now.Sub(c.at).Seconds()), " ago"...)
		}
	case c.step == 0 && m.from > 0:
		b = strconv.AppendInt(append(b, "checkpoint step "...), int64(m.from), 10) // the one the attempt resumed from
	default:
		b = append(b, "no checkpoint yet"...)
	}
	if c.saving > 0 {
		b = append(strconv.AppendInt(append(b, ", saving step "...), int64(c.saving), 10), "…"...)
	}
	return b
}

// packer lays fields out in lines of w cells of a canvas, two spaces
// apart, starting a new line where the next field does not fit; at most
// n lines, the last cut. A field wider than a line is cut. Each field is
// written into the canvas between begin and end.
type packer struct {
	c      *canvas
	w, n   int
	first  int // the first line
	start  int // where the open line starts
	lw     int // its width in cells
	sep    int // where the field being written starts, separator included
	field  int // where its text starts
	fields int // the fields written
	done   bool
}

// pack starts packing fields into lines of w cells, at most n.
func (c *canvas) pack(w, n int) packer {
	p := packer{c: c, w: w, n: n, first: c.lines(), start: len(c.b), lw: 1}
	c.byte(' ')
	return p
}

// begin starts a field.
func (p *packer) begin() {
	p.sep = len(p.c.b)
	if p.lw > 1 {
		p.c.str("  ")
	}
	p.field = len(p.c.b)
}

// end ends the field begun: it stays on the open line, or starts the
// next.
func (p *packer) end() {
	c := p.c
	p.fields++
	if p.done {
		c.b = c.b[:p.sep]
		return
	}
	fw := c.width(p.field)
	if p.lw == 1 || p.lw+2+fw <= p.w {
		p.lw += fw
		if p.sep != p.field {
			p.lw += 2
		}
		return
	}
	c.hold = append(c.hold[:0], c.b[p.field:]...)
	c.b = c.b[:p.sep]
	c.fit(p.start, p.w)
	if p.newLine() {
		c.b = append(c.b, c.hold...)
		p.lw = 1 + fw
	}
}

// newLine ends the open line and opens the next, if there is room for
// it.
func (p *packer) newLine() bool {
	p.c.endLine()
	if p.c.lines()-p.first >= p.n {
		p.done = true
		return false
	}
	p.start, p.lw = len(p.c.b), 1
	p.c.byte(' ')
	return true
}

// text writes a field of plain text.
func (p *packer) text(s string) {
	p.begin()
	p.c.str(s)
	p.end()
}

// styled writes a field of text in style st.
func (p *packer) styled(st style, s string) {
	p.begin()
	p.c.styled(st, s)
	p.end()
}

// discard forgets the fields: nothing of them is drawn.
func (p *packer) discard() {
	p.c.back(place{p.start, p.first, p.start})
}

// finish ends the open line and returns the lines drawn.
func (p *packer) finish() block {
	if !p.done {
		p.c.fit(p.start, p.w)
		p.c.endLine()
	}
	return p.c.since(p.first)
}

// bannerLines draws the failure banner in w cells and at most n lines:
// what failed and how, wrapped whole, then the newest of the culprit's
// last lines that fit, each wrapped too (the log has them all).
func (m *dashModel) bannerLines(st styles, w, n int) []string {
	f := m.failure
	var head string
	switch {
	case f.Rank >= 0 && f.Rank < len(m.ranks):
		rs := m.ranks[f.Rank]
		who := fmt.Sprintf("rank %d", f.Rank)
		if f.Node != "" {
			who += " on " + f.Node
		}
		switch {
		case rs.state == rankHung && m.hung != "":
			head = "✗ the job hung: " + m.hung
		case rs.state == rankFailed:
			head = fmt.Sprintf("✗ %s failed: %s", who, how(rs.code, rs.signal))
		default:
			head = "✗ " + f.Message
		}
	case f.Message != "":
		head = "✗ " + strings.TrimPrefix(f.Message, "cluster: ")
	default:
		head = "✗ the job failed"
	}
	if f.Rank < 0 && strings.HasPrefix(f.Message, "launch: ") {
		head = "✗ the job failed: " + f.Message
	}
	if len(f.Tail) > 0 {
		head += " — its last lines (esc hides; the log has them all):"
	}
	// D works once the job's processes are gone, not at its failed event.
	if lost := m.lostNodes(); len(lost) > 0 && m.nodesLeft() > 0 && m.closed {
		head += fmt.Sprintf(" — D drops %s and resumes on the nodes left", strings.Join(lost, ", "))
	}
	var out []string
	for _, l := range wrap(head, w-2) {
		out = append(out, st.Banner.r(fit(" "+l, w)))
	}
	if len(out) > n {
		out = out[:n]
	}
	var tail []string
	for i := len(f.Tail) - 1; i >= 0; i-- {
		ls := wrap(f.Tail[i], w-4)
		if len(out)+len(tail)+len(ls) > n {
			break
		}
		tail = append(ls, tail...)
	}
	for _, t := range tail {
		out = append(out, fit(st.Bad.r(" │ ")+t, w))
	}
	return out
}

// chartLines draws the loss chart pane: its window and smoothing in the
// title.
func (m *dashModel) chartLines(c *canvas, st styles, w, h int) block {
	first := c.lines()
	train, eval := m.train.pts, m.eval.pts
	xmin, xmax := 0, m.maxSteps
	focused := m.focus == paneChart
	from := c.ruleBegin(focused)
	c.str("Loss")
	if n := lossWindows[m.window]; n > 0 {
		c.str(" (last ")
		c.num(n)
		c.str(" steps)")
		last := 0
		if p, ok := m.train.last(); ok {
			last = p.step
		}
		xmin = max(last-n, 0)
		xmax = 0
		train, eval = window(train, xmin), window(eval, xmin)
	}
	if m.ema {
		train = smooth(train, 0.1)
		c.str(" EMA")
	}
	c.str("  ⣀ train  • eval  (l window, e EMA)")
	c.ruleEnd(st, from, w, focused)
	c.endLine()
	lossChart(c, st, train, eval, xmin, xmax, w, h-1)
	return c.since(first)
}

// speedLines draws the sparklines of the charted rank's step time and
// throughput over its recent steps, with the latest figures: two lines
// above the nodes pane.
func (m *dashModel) speedLines(c *canvas, st styles, w int) block {
	first := c.lines()
	r := m.lead()
	if r == nil {
		return c.since(first)
	}
	t := r.tail(recentSteps)
	var steps, tps [recentSteps]float64
	for i := range t.n {
		s := t.at(i)
		steps[i], tps[i] = s.stepS, s.tokensPer
	}
	var val [32]byte
	row := func(label string, vs []float64, val []byte) {
		from := len(c.b)
		sw := max(w-len(label)-len(val)-3, 1)
		c.byte(' ')
		c.str(label)
		c.byte(' ')
		spark := len(c.b)
		c.sparkline(vs, sw)
		c.paint(st.Train, spark)
		c.byte(' ')
		c.b = append(c.b, val...)
		c.fit(from, w)
		c.endLine()
	}
	row("step s", steps[:t.n], strconv.AppendFloat(val[:0], r.last.StepTimeS, 'f', 3, 64))
	row("tok/s ", tps[:t.n], append(val[:0], r.tokens...))
	return c.since(first)
}
