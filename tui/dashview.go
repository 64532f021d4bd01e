package tui

import (
	"fmt"
	"github.com/gptui/gptui/internal/units"
	"strings"
	"time"

	"github.com/charmbracelet/x/ansi"
)

// view draws the dashboard in w×h cells at time now (the model's clock,
// which ages the heartbeats and the checkpoint): the header, the failure
// banner, then the loss chart beside the speed and the nodes, the ranks
// and the log; or, zoomed, the header and the focused pane alone.
func (m *dashModel) view(st styles, w, h int, now time.Time) []string {
	lines := m.header(st, w, now)
	if m.banner && m.failure != nil {
		lines = append(lines, m.bannerLines(st, w, max(3, h/3))...)
	}
	rest := h - len(lines)
	if m.zoom {
		lines = append(lines, m.pane(st, m.focus, w, rest, now)...)
		return pad(lines, h)
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
	left := m.pane(st, paneChart, chartW, topH, now)
	speed := m.speedLines(st, sideW)
	right := append(speed, m.pane(st, paneNodes, sideW, max(topH-len(speed), 2), now)...)
	for i := range topH {
		lines = append(lines, fit(at(left, i), chartW)+" "+fit(at(right, i), sideW))
	}
	lines = append(lines, m.pane(st, paneRanks, w, ranksH, now)...)
	// The log beside the events where there is room; else the events,
	// a few rows, above the log.
	if w >= wideEvents {
		logW := w * 11 / 20
		evW := w - logW - 1
		lg := m.pane(st, paneLog, logW, logH, now)
		es := m.pane(st, paneEvents, evW, logH, now)
		for i := range logH {
			lines = append(lines, fit(at(lg, i), logW)+" "+fit(at(es, i), evW))
		}
		return pad(lines, h)
	}
	evH := min(4, logH-4)
	if evH >= 2 {
		lines = append(lines, m.pane(st, paneEvents, w, evH, now)...)
		logH -= evH
	}
	lines = append(lines, m.pane(st, paneLog, w, logH, now)...)
	return pad(lines, h)
}

// wideEvents is the narrowest dashboard that shows the events pane beside
// the log rather than above it.
const wideEvents = 120

// pane draws one pane with its title rule in w×h cells.
func (m *dashModel) pane(st styles, p, w, h int, now time.Time) []string {
	var out []string
	switch p {
	case paneChart:
		out = m.chartLines(st, w, h)
	case paneNodes:
		out = m.nodesLines(st, w, h)
	case paneRanks:
		out = m.ranksLines(st, w, h, now)
	case paneEvents:
		out = m.eventsLines(st, w, h)
	default:
		out = m.logLines(st, w, h)
	}
	if len(out) > h {
		out = out[:h]
	}
	return out
}

func at(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	return ""
}

// pad makes lines exactly h long.
func pad(lines []string, h int) []string {
	for len(lines) < h {
		lines = append(lines, "")
	}
	return lines[:h]
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
	t := r.tail(32)
	var own []float64
	for _, s := range t {
		if s.stepS > 0 {
			own = append(own, s.stepS)
		}
	}
	per := median(own)
	if len(t) >= 2 && t[len(t)-1].step > t[0].step {
		if d := t[len(t)-1].at.Sub(t[0].at).Seconds(); d > 0 {
			per = max(per, d/float64(t[len(t)-1].step-t[0].step))
		}
	}
	if per <= 0 {
		return 0, false
	}
	return float64(m.maxSteps-1-r.last.Step) * per, true
}

// header is the figures of the job, wrapped into at most three lines: the
// step and loss first, then the ranks' states and the slowest rank, the
// optimizer's figures, the checkpoint and the restarts.
func (m *dashModel) header(st styles, w int, now time.Time) []string {
	var f []string
	if m.state == "" && m.message != "" {
		f = append(f, m.message)
	}
	if r := m.lead(); r != nil {
		mt := r.last
		step := fmt.Sprintf("step %d", mt.Step)
		if m.maxSteps > 0 {
			step += fmt.Sprintf("/%d", m.maxSteps)
		}
		f = append(f, step, st.Bold.r(fmt.Sprintf("loss %.4f", mt.Loss)))
		if e, ok := m.eval.last(); ok {
			f = append(f, fmt.Sprintf("eval %.4f", e.v))
		}
		f = append(f, units.Metric(mt.TokensPerS)+" tok/s", fmt.Sprintf("MFU %.1f%%", mt.MFU*100))
		if eta, ok := m.eta(r); ok {
			f = append(f, "ETA "+duration(eta))
		}
	} else if m.from > 0 {
		// A resumed attempt before its first step: where it resumes, not
		// the steps its agents send again.
		step := fmt.Sprintf("step %d", m.from)
		if m.maxSteps > 0 {
			step += fmt.Sprintf("/%d", m.maxSteps)
		}
		if m.running() {
			step += " (resuming)"
		}
		f = append(f, step)
		if p, ok := m.train.last(); ok && p.step <= m.from {
			f = append(f, st.Bold.r(fmt.Sprintf("loss %.4f", p.v)))
		}
	}
	if !m.start.IsZero() {
		end := m.end
		if end.IsZero() {
			end = now
		}
		if end.After(m.start) {
			f = append(f, "elapsed "+duration(end.Sub(m.start).Seconds()))
		}
	}
	if len(m.ranks) > 0 {
		f = append(f, "ranks: "+m.stateCounts(st))
	}
	if s := m.slow; s.rank >= 0 {
		text := s.text(false)
		switch {
		case s.silent > 0:
			text = st.Bad.r(text)
		case s.stall.secs > 0 || s.ratio() >= 1.5:
			text = st.Warn.r(text)
		}
		f = append(f, text)
	}
	if r := m.lead(); r != nil {
		mt := r.last
		f = append(f, fmt.Sprintf("lr %.2e", mt.LR), fmt.Sprintf("grad norm %.3g", mt.GradNorm))
		if mt.LossScale > 0 {
			f = append(f, fmt.Sprintf("loss scale %g, %d skipped", mt.LossScale, mt.SkippedSteps))
		}
	}
	if m.state != "" || m.ckpt.step > 0 {
		f = append(f, m.ckptText(now))
	}
	if r := m.restart; r != nil {
		from := "from the start"
		if r.Step > 0 {
			from = fmt.Sprintf("from step %d", r.Step)
		}
		f = append(f, st.Warn.r(fmt.Sprintf("restart %d/%d %s: %s", r.Count, r.Max, from, r.Cause)))
		if m.replan != "" {
			f = append(f, st.Warn.r(m.replan))
		}
	}
	if len(f) == 0 {
		return []string{fit(" no job yet: launch one from the Job screen (3)", w)}
	}
	return pack(f, w, 3)
}

// stateCounts is the ranks' states counted, each in its colour.
func (m *dashModel) stateCounts(st styles) string {
	text := counts(m.ranks)
	if !st.Bad.on {
		return text
	}
	parts := strings.Split(text, " · ")
	for i, p := range parts {
		_, s, _ := strings.Cut(p, " ")
		s, _, _ = strings.Cut(s, " ")
		parts[i] = st.state(s).r(p)
	}
	return strings.Join(parts, " · ")
}

// ckptText says where the checkpoints are: the last one saved and how long
// ago, a save in flight.
func (m *dashModel) ckptText(now time.Time) string {
	c := m.ckpt
	s := "no checkpoint yet"
	if c.step == 0 && m.from > 0 {
		s = fmt.Sprintf("checkpoint step %d", m.from) // the one the attempt resumed from
	}
	if c.step > 0 {
		s = fmt.Sprintf("checkpoint step %d", c.step)
		if !c.at.IsZero() && now.After(c.at) {
			s += " " + duration(now.Sub(c.at).Seconds()) + " ago"
		}
	}
	if c.saving > 0 {
		s += fmt.Sprintf(", saving step %d…", c.saving)
	}
	return s
}

// pack lays fields out in lines of w cells, two spaces apart, starting a
// new line where the next field does not fit; at most n lines, the last
// cut. A field wider than a line is cut.
func pack(fields []string, w, n int) []string {
	var out []string
	line, lw := " ", 1
	for _, f := range fields {
		fw := ansi.StringWidth(f)
		if lw > 1 && lw+2+fw > w {
			out = append(out, fit(line, w))
			line, lw = " ", 1
		}
		if lw > 1 {
			line, lw = line+"  ", lw+2
		}
		line, lw = line+f, lw+fw
	}
	out = append(out, fit(line, w))
	if len(out) > n {
		out = out[:n]
	}
	return out
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
func (m *dashModel) chartLines(st styles, w, h int) []string {
	train, eval := m.train.pts, m.eval.pts
	xmin, xmax := 0, m.maxSteps
	title := "Loss"
	if n := lossWindows[m.window]; n > 0 {
		title += fmt.Sprintf(" (last %d steps)", n)
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
		title += " EMA"
	}
	title += "  ⣀ train  • eval  (l window, e EMA)"
	out := []string{rule(st, title, w, m.focus == paneChart)}
	return append(out, lossChart(st, train, eval, xmin, xmax, w, h-1)...)
}

// speedLines draws the sparklines of the charted rank's step time and
// throughput over its recent steps, with the latest figures: two lines
// above the nodes pane.
func (m *dashModel) speedLines(st styles, w int) []string {
	r := m.lead()
	if r == nil {
		return nil
	}
	t := r.tail(recentSteps)
	steps, tps := make([]float64, len(t)), make([]float64, len(t))
	for i, s := range t {
		steps[i], tps[i] = s.stepS, s.tokensPer
	}
	row := func(label string, vs []float64, val string) string {
		sw := max(w-len(label)-len(val)-3, 1)
		return fit(" "+label+" "+st.Train.r(sparkline(vs, sw))+" "+val, w)
	}
	return []string{
		row("step s", steps, fmt.Sprintf("%.3f", r.last.StepTimeS)),
		row("tok/s ", tps, units.Metric(r.last.TokensPerS)),
	}
}
