// Package tui is gptui's interactive terminal UI: the nodes of the
// inventory as they are probed, the rank table, the job's config and
// strategy, and a live dashboard of the running job (memory, loss, figures,
// the state of every rank and any rank's log).
//
// It follows the Elm architecture of Bubble Tea: Model is the root model,
// with one child model per screen (nodes.go, ranktable.go, job.go,
// dashboard.go). Everything from outside — probe results, the job's
// events, ticks — arrives as a message through a command; nothing changes
// the model from another goroutine. The UI only renders state: what to
// probe and run is a Launcher's business, the same launcher `gptui run
// --no-tui` prints from, and what it reports is the event stream of
// package event.
package tui

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"charm.land/bubbles/v2/key"
	"charm.land/bubbles/v2/textinput"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/sshexec"
)

// Screens.
const (
	screenNodes = iota
	screenRanks
	screenJob
	screenDash
	numScreens
)

var screenNames = [numScreens]string{"Nodes", "Rank table", "Job", "Dashboard"}

// Options configure the UI.
type Options struct {
	// Context bounds probing and jobs; nil means context.Background().
	Context context.Context
	// Launcher probes the nodes and starts jobs; nil shows the screens
	// without probing and refuses to launch.
	Launcher Launcher
	// Nodes are the inventory (--hosts).
	Nodes []sshexec.Node
	// Config and Overrides are the job's -c and -o to begin with.
	Config    string
	Overrides []string
	// RankTablePath is where the rank table is written; empty means
	// rank_table.json.
	RankTablePath string
	// Plan ranks the strategies for the Job screen (see Planner); nil
	// shows none.
	Plan Planner
	// Colour turns colour on; leave it off when NO_COLOR is set.
	Colour bool
	// LogLines is how many lines of each rank's log are kept (2000 if 0);
	// LossPoints how many points of each loss curve (2048 if 0).
	LogLines, LossPoints int
}

// Prompt purposes.
const (
	promptFilter   = iota // filter the nodes
	promptSearch          // search the log
	promptDevices         // a node's device range
	promptConfig          // the config or preset
	promptOverride        // an -o override
)

// confirmation is a yes/no question on the bottom line.
type confirmation struct {
	question string
	yes      func() tea.Cmd
	quit     bool // the question of q and ctrl+c
}

// tickMsg is the clock, once a second, for the elapsed time.
type tickMsg time.Time

func tick() tea.Cmd {
	return tea.Tick(time.Second, func(t time.Time) tea.Msg { return tickMsg(t) })
}

// Model is the root model of the UI.
type Model struct {
	opt    Options
	ctx    context.Context
	st     styles
	keys   keyMap
	w, h   int
	screen int
	back   []int // screens to return to with esc
	now    time.Time

	nodes nodesModel
	ranks rankModel
	job   jobModel
	dash  dashModel

	help    bool
	confirm *confirmation
	input   textinput.Model
	prompt  int // purpose of the input, while inputOn
	inputOn bool
	arg     string // the node or override index the prompt is about
	status  string // a one-line message, until the next key

	probeCh   <-chan event.Event
	jobN      int    // number of the current (or last) job
	runner    Runner // the running job; nil when none runs
	launching bool   // Start was called and has not answered yet
	quitting  bool   // quit once the job has stopped
	restart   bool   // restart from the checkpoint once the job has stopped
}

// New returns the UI's model.
func New(opt Options) *Model {
	if opt.Context == nil {
		opt.Context = context.Background()
	}
	if opt.LogLines <= 0 {
		opt.LogLines = 2000
	}
	if opt.LossPoints <= 0 {
		opt.LossPoints = 2048
	}
	in := textinput.New()
	in.SetVirtualCursor(false)
	in.SetStyles(textinput.Styles{})
	m := &Model{
		opt:   opt,
		ctx:   opt.Context,
		st:    newStyles(opt.Colour),
		keys:  newKeyMap(),
		w:     80,
		h:     24,
		nodes: newNodesModel(opt.Nodes),
		ranks: newRankModel(opt.RankTablePath),
		job:   newJobModel(opt.Config, opt.Overrides),
		dash:  newDashModel(opt.LogLines, opt.LossPoints),
		input: in,
	}
	// Start where there is something to look at: the nodes while they are
	// probed, the job when there is only this machine.
	m.screen = screenJob
	for _, n := range opt.Nodes {
		if !n.Local {
			m.screen = screenNodes
		}
	}
	return m
}

// Init starts probing the nodes and the clock.
func (m *Model) Init() tea.Cmd {
	cmds := []tea.Cmd{tick()}
	if m.opt.Launcher != nil {
		m.probeCh = m.opt.Launcher.Probe(m.ctx)
		cmds = append(cmds, readEvents(probeStream, m.probeCh))
	}
	return tea.Batch(cmds...)
}

// Runner returns the running job, if any: after the program ends, the
// caller stops it and waits for it, so that no worker outlives the UI.
func (m *Model) Runner() Runner { return m.runner }

// Update handles a message.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.w, m.h = max(msg.Width, 20), max(msg.Height, 8)
		m.input.SetWidth(max(m.w-12, 8))
		return m, nil
	case tickMsg:
		m.now = time.Time(msg)
		return m, tick()
	case eventsMsg:
		return m, m.onEvents(msg)
	case startedMsg:
		return m, m.onStarted(msg)
	case tea.KeyPressMsg:
		return m, m.onKey(msg)
	case tea.PasteMsg:
		if m.inputOn {
			var cmd tea.Cmd
			m.input, cmd = m.input.Update(msg)
			return m, cmd
		}
	}
	return m, nil
}

// onEvents applies a batch of events from the probe or the job.
func (m *Model) onEvents(msg eventsMsg) tea.Cmd {
	if msg.stream == probeStream {
		for _, ev := range msg.events {
			m.nodes.apply(ev)
			if ev.Kind == event.KindJob && ev.State == event.JobFailed {
				m.status = "probe: " + ev.Message // a mistake that is no one node's
			}
		}
		if msg.closed {
			return nil
		}
		return readEvents(probeStream, m.probeCh)
	}
	if msg.stream != m.jobN {
		return nil // a job that was replaced; its channel is drained elsewhere
	}
	for _, ev := range msg.events {
		switch ev.Kind {
		case event.KindProbe, event.KindNode:
			m.nodes.apply(ev)
		}
		m.dash.apply(ev)
	}
	if !msg.closed {
		return readEvents(m.jobN, m.runner.Events())
	}
	// The job is over and its workers are gone.
	m.runner = nil
	if m.dash.state == event.JobStarted || m.dash.state == "stopping" || m.dash.state == "" {
		m.dash.state = event.JobStopped
	}
	switch {
	case m.quitting:
		return tea.Quit
	case m.restart:
		m.restart = false
		return m.launch(true)
	}
	return nil
}

// onStarted takes the answer of Launcher.Start.
func (m *Model) onStarted(msg startedMsg) tea.Cmd {
	if msg.job != m.jobN {
		return nil
	}
	m.launching = false
	if msg.err != nil {
		e := event.New(event.KindJob)
		e.State, e.Message, e.Time = event.JobFailed, "launch: "+msg.err.Error(), time.Time{}
		m.dash.apply(e) // the banner says why
		m.status = e.Message
		if m.quitting {
			return tea.Quit
		}
		return nil
	}
	m.runner = msg.runner
	cmd := readEvents(m.jobN, m.runner.Events())
	if m.quitting {
		return tea.Batch(cmd, m.stopJob())
	}
	return cmd
}

// busy reports whether a job runs or is being started.
func (m *Model) busy() bool { return m.runner != nil || m.launching }

// launch starts the job as configured, or resumes it.
func (m *Model) launch(resume bool) tea.Cmd {
	switch {
	case m.opt.Launcher == nil:
		m.status = "nothing can be launched: no launcher (start gptui with --hosts or --nproc)"
		return nil
	case m.busy():
		m.status = "a job is running: s stops it"
		return nil
	case m.job.cfg == nil:
		m.status = "the config does not resolve: see the Job screen"
		m.screen = screenJob
		return nil
	}
	t := m.ranks.table(m.nodes.rows)
	if t.RankSize() != m.job.ranks() {
		m.status = fmt.Sprintf("the strategy needs %d ranks, the rank table has %d: fix one of them", m.job.ranks(), t.RankSize())
		return nil
	}
	if err := m.ranks.write(t); err != nil {
		m.status = "rank table: " + err.Error()
		return nil
	}
	job := Job{
		Config:    m.job.source,
		Overrides: append([]string(nil), m.job.overrides...),
		Resume:    resume,
		Table:     t,
		TablePath: m.ranks.path,
		Resolved:  m.job.cfg,
	}
	m.jobN++
	m.launching = true
	m.dash.reset(m.job.cfg.Engine.MaxSteps, resume)
	m.dash.message = "starting"
	m.go2(screenDash)
	n, l, ctx := m.jobN, m.opt.Launcher, m.ctx
	return func() tea.Msg {
		r, err := l.Start(ctx, job)
		return startedMsg{job: n, runner: r, err: err}
	}
}

// stopJob asks the running job to stop.
func (m *Model) stopJob() tea.Cmd {
	r := m.runner
	if r == nil {
		return nil
	}
	m.dash.state = "stopping"
	return func() tea.Msg { r.Stop(); return nil }
}

// go2 shows a screen, remembering the one to go back to.
func (m *Model) go2(s int) {
	if s != m.screen {
		m.back = append(m.back, m.screen)
		if len(m.back) > 16 {
			m.back = m.back[1:]
		}
		m.screen = s
	}
}

// ask puts a yes/no question on the bottom line.
func (m *Model) ask(q string, yes func() tea.Cmd) { m.confirm = &confirmation{question: q, yes: yes} }

// openPrompt opens the input line.
func (m *Model) openPrompt(purpose int, label, value, arg string) tea.Cmd {
	m.inputOn, m.prompt, m.arg = true, purpose, arg
	m.input.Prompt = label
	m.input.SetValue(value)
	m.input.CursorEnd()
	return m.input.Focus()
}

// onKey handles a key press.
func (m *Model) onKey(msg tea.KeyPressMsg) tea.Cmd {
	k := m.keys
	m.status = ""
	if m.confirm != nil {
		switch {
		case is(msg, k.Yes):
			c := m.confirm
			m.confirm = nil
			return c.yes()
		case is(msg, k.No), msg.String() == "q":
			m.confirm = nil
		case msg.String() == "ctrl+c":
			c := m.confirm
			m.confirm = nil
			if c.quit {
				return c.yes() // ctrl+c answers its own question
			}
			return m.quit()
		}
		return nil
	}
	if m.inputOn {
		switch msg.String() {
		case "enter":
			m.inputOn = false
			m.input.Blur()
			return m.submit(m.input.Value())
		case "esc", "ctrl+c":
			m.inputOn = false
			m.input.Blur()
			return nil
		}
		var cmd tea.Cmd
		m.input, cmd = m.input.Update(msg)
		return cmd
	}
	if m.help {
		if is(msg, k.Help, k.Back) || msg.String() == "q" {
			m.help = false
			return nil
		}
		if msg.String() != "ctrl+c" {
			return nil
		}
	}
	switch {
	case is(msg, k.Quit):
		if msg.String() == "ctrl+c" && m.quitting {
			return tea.Quit // a second ctrl+c does not wait for the workers
		}
		return m.quit()
	case is(msg, k.Help):
		m.help = true
		return nil
	case is(msg, k.Screen1, k.Screen2, k.Screen3, k.Screen4):
		m.go2(int(msg.String()[0] - '1'))
		return nil
	case is(msg, k.Stop):
		if m.runner == nil {
			m.status = "no job is running"
			return nil
		}
		m.ask("Stop the job? Its workers get SIGTERM, then SIGKILL.", m.stopJob)
		return nil
	case is(msg, k.Restart) && m.screen != screenJob:
		return m.askRestart()
	}
	switch m.screen {
	case screenNodes:
		if is(msg, k.Filter) {
			return m.openPrompt(promptFilter, "filter nodes: ", m.nodes.filter, "")
		}
		if m.nodes.update(msg, k) {
			return nil
		}
	case screenRanks:
		switch {
		case is(msg, k.Open, k.Edit) && len(m.nodes.rows) > 0:
			r := m.nodes.rows[m.ranks.sel]
			return m.openPrompt(promptDevices, "devices of "+r.node.Name+": ", m.ranks.devices(r).String(), r.node.Name)
		case is(msg, k.Save):
			if err := m.ranks.write(m.ranks.table(m.nodes.rows)); err != nil {
				m.status = "rank table: " + err.Error()
			} else {
				m.status = "wrote " + m.ranks.path
			}
			return nil
		}
		if m.ranks.update(msg, k, len(m.nodes.rows)) {
			return nil
		}
	case screenJob:
		j := &m.job
		switch {
		case is(msg, k.Restart):
			return m.askRestart()
		case is(msg, k.Add):
			return m.openPrompt(promptOverride, "-o ", "", fmt.Sprint(len(j.overrides)))
		case is(msg, k.Apply) || (is(msg, k.Open) && j.selectedPlan() >= 0):
			m.applyPlan()
			return nil
		case is(msg, k.Open, k.Edit):
			switch {
			case j.sel == 0:
				return m.openPrompt(promptConfig, "config or preset: ", j.source, "")
			case j.sel <= len(j.overrides):
				return m.openPrompt(promptOverride, "-o ", j.overrides[j.sel-1], fmt.Sprint(j.sel-1))
			case j.sel == j.addRow():
				return m.openPrompt(promptOverride, "-o ", "", fmt.Sprint(len(j.overrides)))
			case is(msg, k.Open) && j.sel == j.launchRow():
				return m.launch(false)
			}
		}
		plans := 0
		if r, err := m.planReport(); err == nil && r != nil {
			plans = len(r.Plans)
		}
		j.sel = min(j.sel, j.launchRow()+plans) // the plans may have changed
		if j.update(msg, k, plans, max(m.h/3, 1)) {
			return nil
		}
	case screenDash:
		if is(msg, k.Filter) {
			return m.openPrompt(promptSearch, "search the log: ", m.dash.search, "")
		}
		if m.dash.update(msg, k, max(m.h/3, 1)) {
			return nil
		}
	}
	switch {
	case is(msg, k.Next):
		m.screen = (m.screen + 1) % numScreens
	case is(msg, k.Prev):
		m.screen = (m.screen + numScreens - 1) % numScreens
	case is(msg, k.Back) && len(m.back) > 0:
		m.screen = m.back[len(m.back)-1]
		m.back = m.back[:len(m.back)-1]
	}
	return nil
}

// planReport asks the planner about the job as the Job screen has it; nil
// without a planner or a config that resolves.
func (m *Model) planReport() (*PlanReport, error) {
	if m.opt.Plan == nil || m.job.cfg == nil {
		return nil, nil
	}
	return m.opt.Plan(m.job.request(m.ranks.table(m.nodes.rows), m.nodes.probes()))
}

// applyPlan applies the selected plan of the Job screen: its overrides
// replace the job's.
func (m *Model) applyPlan() {
	j := &m.job
	i := j.selectedPlan()
	if i < 0 {
		m.status = "select a plan first: ↓ past [ Launch ] moves into the plans"
		return
	}
	r, err := m.planReport()
	switch {
	case err != nil:
		m.status = "plan: " + err.Error()
		return
	case r == nil || i >= len(r.Plans):
		m.status = "no plan to apply"
		return
	}
	p := r.Plans[i]
	changed := 0
	for _, o := range p.Overrides {
		if !slices.Contains(j.overrides, o) {
			changed++
		}
	}
	j.applyPlan(r, i)
	switch {
	case j.err != nil:
		m.status = fmt.Sprintf("plan %d (%s) does not resolve: %v", i+1, p.Strategy, j.err)
	case changed == 0:
		m.status = fmt.Sprintf("plan %d (%s) is the config's strategy already", i+1, p.Strategy)
	default:
		m.status = fmt.Sprintf("applied plan %d (%s): %d override(s) set; enter on [ Launch ] starts it", i+1, p.Strategy, changed)
	}
}

// quit quits, first asking to stop a running job.
func (m *Model) quit() tea.Cmd {
	if !m.busy() {
		return tea.Quit
	}
	m.ask("A job is running: stop it and quit?", func() tea.Cmd {
		m.quitting = true
		m.status = "stopping the job…"
		return m.stopJob()
	})
	m.confirm.quit = true
	return nil
}

// askRestart asks to restart the job from its latest checkpoint.
func (m *Model) askRestart() tea.Cmd {
	if m.jobN == 0 {
		m.status = "no job has run yet: launch it from the Job screen"
		return nil
	}
	if m.busy() {
		m.ask("Stop the job and restart it from the latest checkpoint?", func() tea.Cmd {
			m.restart = true
			return m.stopJob()
		})
		return nil
	}
	m.ask("Restart the job from the latest checkpoint?", func() tea.Cmd { return m.launch(true) })
	return nil
}

// submit takes the text of the input line.
func (m *Model) submit(v string) tea.Cmd {
	switch m.prompt {
	case promptFilter:
		m.nodes.filter, m.nodes.sel = strings.TrimSpace(v), 0
	case promptSearch:
		if !m.dash.setSearch(v) && v != "" {
			m.status = fmt.Sprintf("%q is not in rank %d's log", v, m.dash.sel)
		}
	case promptDevices:
		if err := m.ranks.setDevices(m.arg, v); err != nil {
			m.status = err.Error()
		}
	case promptConfig:
		m.job.source = strings.TrimSpace(v)
		m.job.resolve()
	case promptOverride:
		var i int
		fmt.Sscan(m.arg, &i)
		n := len(m.job.overrides)
		if err := m.job.setOverride(i, v); err != nil {
			m.status = err.Error()
		}
		if len(m.job.overrides) > n {
			m.job.sel = i + 1 // the new override's row
		}
		m.job.sel = min(m.job.sel, m.job.launchRow())
	}
	return nil
}

// View draws the UI.
func (m *Model) View() tea.View {
	v := tea.NewView(m.Render())
	v.AltScreen = true
	if m.inputOn {
		if c := m.input.Cursor(); c != nil {
			c.Y = m.h - 1
			v.Cursor = c
		}
	}
	return v
}

// Render returns the screen as text: exactly the window's height in lines,
// each exactly its width in cells.
func (m *Model) Render() string {
	w, h := m.w, m.h
	lines := make([]string, 0, h)
	lines = append(lines, m.titleLine(w))
	body := h - 2
	var b []string
	switch {
	case m.help:
		b = m.helpLines(w, body)
	case m.screen == screenNodes:
		b = m.nodes.view(m.st, w, body)
	case m.screen == screenRanks:
		b = m.ranks.view(m.st, m.nodes.rows, w, body)
	case m.screen == screenJob:
		r, err := m.planReport()
		b = m.job.view(m.st, m.ranks.table(m.nodes.rows), m.opt.Plan, r, err, w, body)
	default:
		b = m.dash.view(m.st, w, body, m.now)
	}
	for i := range body {
		if i < len(b) {
			lines = append(lines, fit(b[i], w))
		} else {
			lines = append(lines, strings.Repeat(" ", w))
		}
	}
	lines = append(lines, m.bottomLine(w))
	return strings.Join(lines, "\n")
}

// titleLine shows the screens, the current one in brackets, and the job.
func (m *Model) titleLine(w int) string {
	var b strings.Builder
	b.WriteString(m.st.Title.r(" gptui "))
	for i, name := range screenNames {
		t := fmt.Sprintf(" %d %s ", i+1, name)
		if i == m.screen && !m.help {
			b.WriteString(m.st.Tab.r("[" + t[1:len(t)-1] + "]"))
		} else {
			b.WriteString(t)
		}
	}
	state := ""
	switch {
	case m.launching:
		state = "job starting"
	case m.runner != nil && m.dash.state == "stopping":
		state = "job stopping"
	case m.runner != nil && m.dash.state != event.JobStarted && m.dash.state != "":
		state = "job " + m.dash.state // its last workers are being stopped
	case m.runner != nil:
		state = "job running"
	case m.dash.state != "":
		state = "job " + m.dash.state
	}
	left := b.String()
	pad := w - ansi.StringWidth(left) - len(state) - 1
	if pad < 1 {
		return fit(left, w)
	}
	return fit(left+strings.Repeat(" ", pad)+m.st.state(strings.TrimPrefix(state, "job ")).r(state)+" ", w)
}

// bottomLine is the input line, a question, a message or the key hints.
func (m *Model) bottomLine(w int) string {
	switch {
	case m.inputOn:
		return fit(m.input.View(), w)
	case m.confirm != nil:
		return fit(m.st.Warn.r(m.confirm.question+" [y/N]"), w)
	case m.status != "":
		return fit(" "+m.status, w)
	}
	var hints string
	switch {
	case m.help:
		hints = "esc or ? closes the help"
	case m.screen == screenNodes:
		hints = "↑↓ select  enter details  / filter  1-4 screens  ? help  q quit"
	case m.screen == screenRanks:
		hints = "↑↓ select  enter edit devices  w write  1-4 screens  ? help  q quit"
	case m.screen == screenJob:
		hints = "↑↓ select  enter edit/launch/apply  a add -o  d delete  p apply  ? help  q quit"
	default:
		hints = "tab pane  ↑↓ move  / search  f follow  s stop  r restart  ? help  q quit"
	}
	return m.st.Dim.r(fit(" "+hints, w))
}

// helpLines lists the keys.
func (m *Model) helpLines(w, h int) []string {
	var all []key.Binding
	for _, g := range m.keys.helpGroups() {
		all = append(all, g...)
	}
	cols := 2
	if w >= 120 {
		cols = 3
	}
	cw := w / cols
	rows := (len(all) + cols - 1) / cols
	out := []string{rule(m.st, "Keys", w, true)}
	for r := range rows {
		var b strings.Builder
		for c := range cols {
			i := c*rows + r
			if i >= len(all) {
				break
			}
			hp := all[i].Help()
			b.WriteString(fit(fmt.Sprintf(" %-9s %s", hp.Key, hp.Desc), cw))
		}
		out = append(out, fit(b.String(), w))
	}
	if len(out) > h {
		out = out[:h]
	}
	return out
}
