package tui

import (
	"fmt"
	"strconv"
	"strings"

	tea "charm.land/bubbletea/v2"

	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/ranktable"
	"github.com/gptui/gptui/units"
)

// jobModel is the Job screen: the preset or config file, the restart
// policy, its -o overrides, the strategy they resolve to, the planner's
// estimate, and the launch.
type jobModel struct {
	source    string   // preset name or config file
	overrides []string // Section.key=value
	sel       int      // row: 0 the config, then the restarts, the fewest nodes, the overrides, add, launch
	// restarts is the job's automatic restart policy (--max-restarts,
	// --min-nodes).
	restarts cluster.Restarts

	cfg *presets.Config // source with overrides, resolved; nil if err
	err error
}

// Rows before the overrides.
const (
	rowConfig   = iota
	rowRestarts // --max-restarts
	rowMinNodes // --min-nodes
	rowOverride // the first override
)

func newJobModel(source string, overrides []string, restarts cluster.Restarts) jobModel {
	m := jobModel{source: source, overrides: append([]string(nil), overrides...), restarts: restarts}
	m.resolve()
	m.sel = m.launchRow()
	return m
}

// resolve loads the config again after a change.
func (m *jobModel) resolve() {
	if m.source == "" {
		m.cfg, m.err = nil, fmt.Errorf("no config: press enter on the Config row and give a preset name or a YAML file")
		return
	}
	m.cfg, m.err = presets.Load(m.source, m.overrides)
}

// Row kinds.
func (m *jobModel) addRow() int    { return rowOverride + len(m.overrides) }
func (m *jobModel) launchRow() int { return m.addRow() + 1 }

// override returns the index of the override on the selected row, -1
// for none.
func (m *jobModel) override() int {
	if m.sel >= rowOverride && m.sel < m.addRow() {
		return m.sel - rowOverride
	}
	return -1
}

// setRestarts sets the restart policy's field of row (rowRestarts or
// rowMinNodes) from text: a number, 0 for none (never restart; every
// node).
func (m *jobModel) setRestarts(row int, text string) error {
	n, err := strconv.Atoi(strings.TrimSpace(text))
	switch {
	case row == rowRestarts && (err != nil || n < 0):
		return fmt.Errorf("--max-restarts %q: want 0 (never restart) or more", text)
	case row == rowMinNodes && (err != nil || n < 0):
		return fmt.Errorf("--min-nodes %q: want the fewest nodes a restart goes on with, 0 for every node", text)
	case row == rowRestarts:
		m.restarts.Max = n
	default:
		m.restarts.MinNodes = n
	}
	return nil
}

// restartsText says what the restart policy does.
func (m *jobModel) restartsText() (restarts, minNodes string) {
	r := m.restarts
	restarts = "never: a failure ends the job"
	if r.Max > 0 {
		restarts = fmt.Sprintf("up to %d, from the newest checkpoint, after a failure, a lost node or a hang", r.Max)
	}
	minNodes = "every node: a restart waits for all of them"
	if r.MinNodes > 0 {
		minNodes = fmt.Sprintf("%d: a restart leaves out the nodes it cannot reach and re-plans, down to %d", r.MinNodes, r.MinNodes)
	}
	return restarts, minNodes
}

// ranks returns the number of ranks the strategy needs, 0 without a config.
func (m *jobModel) ranks() int {
	if m.cfg == nil {
		return 0
	}
	d := m.cfg.Distributed
	return max(d.DPDegree, 1) * max(d.Sharding.ShardingDegree, 1) * max(d.CPDegree, 1) * max(d.MPDegree, 1) * max(d.PPDegree, 1)
}

// setOverride replaces override i (or adds one when i is len) with kv; an
// empty kv deletes it.
func (m *jobModel) setOverride(i int, kv string) error {
	kv = strings.TrimSpace(kv)
	if kv != "" && !strings.Contains(kv, "=") {
		return fmt.Errorf("override %q: want Section.key=value, such as Engine.max_steps=100", kv)
	}
	switch {
	case kv == "" && i < len(m.overrides):
		m.overrides = append(m.overrides[:i], m.overrides[i+1:]...)
	case kv == "":
	case i < len(m.overrides):
		m.overrides[i] = kv
	default:
		m.overrides = append(m.overrides, kv)
	}
	m.resolve()
	return nil
}

// Plan rows come after the launch row: plan i is row planRow(i).
func (m *jobModel) planRow(i int) int { return m.launchRow() + 1 + i }

// selectedPlan returns the index of the selected plan, or -1 when the
// selection is on another row.
func (m *jobModel) selectedPlan() int {
	if m.sel > m.launchRow() {
		return m.sel - m.launchRow() - 1
	}
	return -1
}

// update handles a key of the Job screen; it reports whether it used it,
// and what follows.
func (m *jobModel) update(msg tea.KeyPressMsg, k keyMap, page int, h host) (bool, tea.Cmd) {
	switch {
	case is(msg, k.Add):
		return true, h.openPrompt(promptOverride, "-o ", "", fmt.Sprint(len(m.overrides)))
	case is(msg, k.Apply) || (is(msg, k.Open) && m.selectedPlan() >= 0):
		h.applyPlan()
		return true, nil
	case is(msg, k.Open, k.Edit):
		switch {
		case m.sel == rowConfig:
			return true, h.openPrompt(promptConfig, "config or preset: ", m.source, "")
		case m.sel == rowRestarts:
			return true, h.openPrompt(promptRestarts, "--max-restarts ", fmt.Sprint(m.restarts.Max), fmt.Sprint(rowRestarts))
		case m.sel == rowMinNodes:
			return true, h.openPrompt(promptRestarts, "--min-nodes ", fmt.Sprint(m.restarts.MinNodes), fmt.Sprint(rowMinNodes))
		case m.override() >= 0:
			return true, h.openPrompt(promptOverride, "-o ", m.overrides[m.override()], fmt.Sprint(m.override()))
		case m.sel == m.addRow():
			return true, h.openPrompt(promptOverride, "-o ", "", fmt.Sprint(len(m.overrides)))
		case is(msg, k.Open) && m.sel == m.launchRow():
			return true, h.launch(false)
		}
	}
	return m.move(msg, k, h.plans(), page), nil
}

// move handles the keys that move the selection and delete an override,
// with plans the number of ranked plans below the launch row.
func (m *jobModel) move(msg tea.KeyPressMsg, k keyMap, plans, page int) bool {
	m.sel = min(m.sel, m.launchRow()+plans) // the plans may have changed
	last := m.launchRow() + plans
	switch {
	case is(msg, k.Up):
		m.sel = max(m.sel-1, 0)
	case is(msg, k.Down):
		m.sel = min(m.sel+1, last)
	case is(msg, k.PageUp) && m.selectedPlan() >= 0:
		m.sel = max(m.sel-page, m.planRow(0))
	case is(msg, k.PageDown):
		m.sel = min(max(m.sel, m.launchRow())+page, last)
	case is(msg, k.Top):
		m.sel = 0
	case is(msg, k.Bottom):
		m.sel = m.launchRow()
	case is(msg, k.Delete) && m.override() >= 0:
		m.setOverride(m.override(), "")
		m.sel = min(m.sel, m.launchRow())
	default:
		return false
	}
	return true
}

// applyPlan replaces the overrides with those of plan i of r and keeps
// that plan selected.
func (m *jobModel) applyPlan(r *PlanReport, i int) {
	m.overrides = append([]string(nil), r.Plans[i].Overrides...)
	m.resolve()
	m.sel = m.planRow(i)
}

// strategy describes the parallel layout in one line, against the rank
// table of the ready nodes (ready of all).
func (m *jobModel) strategy(tableRanks, ready, all int) string {
	if m.cfg == nil {
		return ""
	}
	d := m.cfg.Distributed
	cp := ""
	if d.CPDegree > 1 {
		cp = fmt.Sprintf(" × cp %d", d.CPDegree)
	}
	s := fmt.Sprintf("dp %d × sharding %d (stage %d)%s × mp %d × pp %d = %d ranks",
		max(d.DPDegree, 1), max(d.Sharding.ShardingDegree, 1), max(d.Sharding.ShardingStage, 1), cp, max(d.MPDegree, 1), max(d.PPDegree, 1), m.ranks())
	nodes := ""
	if ready < all {
		nodes = fmt.Sprintf(" (ready nodes only: %d of %d)", ready, all)
	}
	if tableRanks == m.ranks() {
		return s + fmt.Sprintf(" · rank table: %d ✓%s", tableRanks, nodes)
	}
	return s + fmt.Sprintf(" · rank table has %d%s: set -o Distributed.dp_degree or edit the rank table", tableRanks, nodes)
}

// jobView is what the Job screen shows besides its own model.
type jobView struct {
	table      *ranktable.Table
	ready, all int    // nodes ready, and in the inventory
	blocked    string // why the job cannot be launched; "" when it can
	planner    bool   // there is a planner
	plan       *planState
}

// view draws the screen in w×h cells, with the planner's kept answer.
// When the plans would get fewer than three lines, the part above them is
// drawn compact: the overrides on one line (unless one of them is
// selected), the strategy's lines truncated rather than wrapped, no blank
// lines.
func (m *jobModel) view(st styles, v jobView, w, h int) []string {
	report := v.plan.report
	top := m.upperLines(st, v, w, false)
	if report != nil && len(report.Plans) > 0 {
		if _, n := m.planLines(st, report, w, h-len(top)-2); n < min(3, len(report.Plans)) {
			top = m.upperLines(st, v, w, true)
		}
	}
	lines := top
	title := "Plan"
	if v.plan.pending() && v.plan.asked != "" {
		title += "  (planning…)"
	}
	lines = append(lines, rule(st, title, w, false))
	add := func(s string) {
		for _, l := range wrap(s, w-2) {
			lines = append(lines, fit("  "+l, w))
		}
	}
	switch {
	case !v.planner:
		add(st.Dim.r("no planner: run 'gptui plan' for the ranked strategies and the per-device memory"))
	case m.cfg == nil:
	case v.plan.err != nil:
		add(st.Bad.r("✗ ") + v.plan.err.Error())
	case report != nil:
		pl, _ := m.planLines(st, report, w, h-len(lines))
		lines = append(lines, pl...)
	}
	if len(lines) > h {
		lines = lines[:h]
	}
	return lines
}

// upperLines draws the rows (config, overrides, add, launch) and the
// strategy, ending with a blank line unless compact.
func (m *jobModel) upperLines(st styles, v jobView, w int, compact bool) []string {
	var lines []string
	row := func(i int, label, text string) {
		mark := "  "
		if i == m.sel {
			mark = st.Sel.r("› ")
		}
		lines = append(lines, fit(mark+fmt.Sprintf("%-10s ", label)+text, w))
	}
	row(rowConfig, "Config", m.source+st.Dim.r("   (enter: edit; a preset name or a YAML file)"))
	restarts, minNodes := m.restartsText()
	if compact && m.sel != rowRestarts && m.sel != rowMinNodes {
		row(-1, "Restarts", fmt.Sprintf("%d, min nodes %d", m.restarts.Max, m.restarts.MinNodes)+st.Dim.r("   (--max-restarts, --min-nodes)"))
	} else {
		row(rowRestarts, "Restarts", fmt.Sprint(m.restarts.Max)+st.Dim.r("   --max-restarts: "+restarts))
		row(rowMinNodes, "Min nodes", fmt.Sprint(m.restarts.MinNodes)+st.Dim.r("   --min-nodes: "+minNodes))
	}
	if compact && len(m.overrides) > 1 && m.override() < 0 {
		row(-1, fmt.Sprintf("-o (%d)", len(m.overrides)), strings.Join(m.overrides, " "))
	} else {
		for i, o := range m.overrides {
			row(rowOverride+i, "-o", o)
		}
	}
	row(m.addRow(), "", st.Dim.r("+ add an override (enter or a; d deletes the selected one)"))
	launch := "[ Launch ]"
	if m.sel == m.launchRow() {
		launch = st.Sel.r(launch)
	}
	if v.blocked == "" {
		row(m.launchRow(), "", launch+st.Dim.r("   (enter)"))
	} else {
		row(m.launchRow(), "", launch+"   "+st.Bad.r("✗ off:"))
		for _, l := range wrap(v.blocked, w-15) {
			lines = append(lines, fit(strings.Repeat(" ", 15)+st.Bad.r(l), w))
		}
	}

	if !compact {
		lines = append(lines, "")
	}
	lines = append(lines, rule(st, "Strategy", w, false))
	add := func(s string) {
		if compact {
			lines = append(lines, fit("  "+s, w))
			return
		}
		for _, l := range wrap(s, w-2) {
			lines = append(lines, fit("  "+l, w))
		}
	}
	if m.err != nil {
		add(st.Bad.r("✗ ") + m.err.Error())
	} else {
		c := m.cfg
		add(m.strategy(v.table.RankSize(), v.ready, v.all))
		add(fmt.Sprintf("model: %d layers, hidden %d, %d heads, seq %d, vocab %d · batch: global %d, local %d, micro %d",
			c.Model.NumLayers, c.Model.HiddenSize, c.Model.NumAttentionHeads, c.Data.Train.Dataset.MaxSeqLen, c.Model.VocabSize,
			c.Global.GlobalBatchSize, c.Global.LocalBatchSize, c.Global.MicroBatchSize))
		add(fmt.Sprintf("%d steps, log every %d, eval every %d · device %s · log_dir %s · checkpoints every %d in %s",
			c.Engine.MaxSteps, c.Engine.LoggingFreq, c.Engine.EvalFreq, c.Global.Device, c.Engine.LogDir, c.Engine.SaveLoad.SaveSteps, c.Engine.SaveLoad.OutputDir))
	}
	if !compact {
		lines = append(lines, "")
	}
	return lines
}

// planLines draws the planner's report in w×h cells and returns the lines
// and the number of plans among them: the estimate of the
// config's strategy, as many ranked plans as fit (scrolled to keep the
// selected one in view, the config's own marked *), the rejected plans'
// count with the command that lists them, and the note. When the plans
// would get fewer than five lines, the text around them takes one line
// each (the estimate its first), and then the note goes.
func (m *jobModel) planLines(st styles, r *PlanReport, w, h int) (lines []string, plans int) {
	fits := st.OK.r("✓ fits") + ": "
	if !r.Fits {
		fits = st.Bad.r("✗ does not fit") + ": "
	}
	count := fmt.Sprintf("%d feasible, %d rejected (%s)", len(r.Plans), r.Rejected, r.Reasons)
	switch {
	case len(r.Plans) == 0:
		count = st.Bad.r("✗ no feasible plan") + fmt.Sprintf(", %d rejected (%s)", r.Rejected, r.Reasons)
	case r.Rejected == 0:
		count = fmt.Sprintf("%d feasible, none rejected", len(r.Plans))
	}
	text := func(compact, note bool) (est, foot []string) {
		add := func(to *[]string, s string, wrapped bool) {
			if !wrapped {
				*to = append(*to, fit("  "+s, w))
				return
			}
			for _, l := range wrap(s, w-2) {
				*to = append(*to, fit("  "+l, w))
			}
		}
		for i, l := range r.Estimate {
			if i == 0 {
				l = fits + l
			} else if compact {
				break
			}
			add(&est, l, !compact)
		}
		add(&foot, count, !compact)
		add(&foot, "list them all: "+r.Command, true)
		if note && r.Note != "" {
			add(&foot, st.Dim.r(r.Note), !compact)
		}
		return est, foot
	}
	want := min(len(r.Plans), 5)
	est, foot := text(false, true)
	if h-len(est)-len(foot)-1 < want {
		est, foot = text(true, true)
	}
	if h-len(est)-len(foot)-1 < want {
		est, foot = text(true, false)
	}
	room := h - len(est) - len(foot) - 1 // the table's header
	if len(r.Plans) == 0 || room < 1 {
		return append(est, foot...), 0
	}
	// Columns after the strategy: memory, step, tokens/s, MFU, bubble, comm.
	const marks, tail = 7, 7 + 9 + 10 + 7 + 7 + 7
	const strategyHead = "strategy (*: config's)"
	sw := len(strategyHead) + 1
	for _, p := range r.Plans {
		sw = max(sw, len(p.Strategy)+1)
	}
	sw = max(min(sw, w-2-marks-tail), 8)
	row := func(sel bool, cur, n, strategy, rest string) string {
		mark := "  "
		if sel {
			mark = st.Sel.r("› ")
		}
		return fit("  "+mark+fmt.Sprintf("%3s %s%s", n, cur, fit(strategy, sw))+rest, w)
	}
	head := row(false, " ", "#", strategyHead, fmt.Sprintf("%7s%9s%10s%7s%7s%7s", "GiB/dev", "step s", "tokens/s", "MFU", "bubble", "comm s"))
	out := append(est, st.Dim.r(head))
	sel := m.selectedPlan()
	first := 0
	if sel >= room {
		first = sel - room + 1
	}
	for i := first; i < len(r.Plans) && i < first+room; i++ {
		plans++
		p := r.Plans[i]
		cur := " "
		if p.Current {
			cur = "*"
		}
		bubble := "-"
		if p.Bubble >= 0 {
			bubble = fmt.Sprintf("%.1f%%", 100*p.Bubble)
		}
		rest := fmt.Sprintf("%7.2f%9.3f%10.0f%6.1f%%%7s%7.3f", units.InGiB(p.MemBytes), p.StepS, p.TokensPerS, 100*p.MFU, bubble, p.CommS)
		out = append(out, row(i == sel, cur, fmt.Sprint(i+1), p.Strategy, rest))
	}
	return append(out, foot...), plans
}
