// Package tui is gptui's interactive terminal UI: the nodes of the
// inventory as they are set up, the rank table, the job's config, strategy
// and plans, and a live dashboard of the running job.
//
// It follows the Elm architecture of Bubble Tea: Model (model.go) is the
// root model, with one child model per screen, each in its own file and
// handling its own keys: nodes.go, ranktable.go, job.go and the dashboard
// (dashboard.go: its model and events; dashview.go, dashpanes.go and
// events.go: how it is drawn, into a canvas (canvas.go: a frame's lines in
// one buffer); rankstate.go: the ranks' states, silences and pace; pace.go
// and ranked.go: what settle keeps of the ranks, so that an event costs
// what its own rank does, whatever the job's size; drop.go: dropping a
// lost node). Everything from
// outside — the nodes' and the job's events, the planner's answer
// (plan.go), a written report (report.go), ticks — arrives as a message
// through a command; nothing changes the model from another goroutine, and
// drawing reads the model and does nothing else. The UI only renders
// state: what to set up and run is a Launcher's business, what to plan a
// Planner's (runner.go: the hooks' interfaces; package tui/hooks: gptui's,
// over packages cluster, jobdir and planner), and what a job reports is
// the event stream of package event.
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

	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/jobdir"
	"github.com/gptui/gptui/presets"
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
	// jobs/<job id>/rank_table.json at a launch (the job's own directory)
	// and rank_table.json when the Rank table screen saves it (w).
	RankTablePath string
	// Plan ranks the strategies for the Job screen (see Planner); nil
	// shows none.
	Plan Planner
	// Colour turns colour on; leave it off when NO_COLOR is set.
	Colour bool
	// LogLines is how many lines of each rank's log are kept (2000 if 0);
	// LossPoints how many points of each loss curve (2048 if 0).
	LogLines, LossPoints int
	// ReportPath is where w on the dashboard writes the report picture
	// (report.png if empty).
	ReportPath string
	// Restarts is the restart policy the Job screen starts with
	// (--max-restarts, --min-nodes); each job is launched with the
	// screen's.
	Restarts cluster.Restarts
	// Attach, if set, is a job the UI opens on its dashboard at the start
	// (gptui attach), as if it had launched it.
	Attach *Attached
}

// Attached is a job already running, or ended, that the UI opens.
type Attached struct {
	Runner Runner
	// Config is its config (the dashboard's total steps and log
	// directory); nil if it does not resolve.
	Config *presets.Config
	// Reopen starts the job again after its end, resuming from its newest
	// checkpoint (gptui restart), and returns what follows it from there;
	// nil means r cannot.
	Reopen func() (Runner, error)
	// Next, called once prev's events have ended with the job, waits
	// until the job runs again (gptui restart, or r in another view) and
	// returns what follows it from there, so that the dashboard goes on
	// with the new attempt; it returns an error when ctx ends. Nil: the
	// dashboard stays on the job's end.
	Next func(ctx context.Context, prev Runner) (Runner, error)
}

// nextMsg brings the runner of an attached job that runs again after its
// end (Attached.Next).
type nextMsg struct {
	job    int // the jobN whose end it followed
	runner Runner
}

// awaitNext returns the command that waits for the attached job, which
// has ended, to run again.
func (m *Model) awaitNext(prev Runner) tea.Cmd {
	a := m.attached
	if a == nil || a.Next == nil || m.opt.Launcher != nil || prev == nil {
		return nil
	}
	ctx, job := m.ctx, m.jobN
	return func() tea.Msg {
		r, err := a.Next(ctx, prev)
		if err != nil {
			return nil
		}
		return nextMsg{job: job, runner: r}
	}
}

// onNext follows the attached job into its new attempt, unless the
// dashboard has already (its own r) or has quit.
func (m *Model) onNext(msg nextMsg) tea.Cmd {
	if msg.job != m.jobN || m.runner != nil || m.quitting || m.detached != "" {
		if d, ok := msg.runner.(DetachedRunner); ok {
			d.Detach()
		}
		return nil
	}
	m.jobN++
	m.runner, m.dash.state, m.dash.closed = msg.runner, "", false
	m.status = "the job runs again"
	return readEvents(m.jobN, m.runner.Events())
}

// Prompt purposes.
const (
	promptFilter   = iota // filter the nodes
	promptSearch          // search the log
	promptDevices         // a node's device range
	promptConfig          // the config or preset
	promptOverride        // an -o override
	promptRestarts        // --max-restarts or --min-nodes (arg: the row)
)

// confirmation is a yes/no question on the bottom line, or with stop set,
// the question of quitting with a detached job running: yes (the
// default: enter, y, d) detaches, s stops.
type confirmation struct {
	question string
	yes      func() tea.Cmd
	stop     func() tea.Cmd
	quit     bool // the question of q and ctrl+c
}

// statusMsg puts a message on the bottom line.
type statusMsg string

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

	nodes     nodesModel
	rankTable rankTableModel
	job       jobModel
	dash      dashModel

	help    bool
	confirm *confirmation
	input   textinput.Model
	prompt  int // purpose of the input, while inputOn
	inputOn bool
	arg     string // the node or override index the prompt is about
	status  string // a one-line message, until the next key

	probes    map[int]<-chan event.Event // the probes under way, by stream
	probeN    int                        // the stream of the latest probe
	plan      planState                  // the planner's answer for the Job screen
	jobN      int                        // number of the current (or last) job
	owner     string                     // the id the current (or last) launched job's workdir locks name (cluster.Options.Continues)
	continues string                     // the owner a drop resumes: the next resume continues it
	runner    Runner                     // the running job; nil when none runs
	launching bool                       // Start was called and has not answered yet
	quitting  bool                       // quit once the job has stopped
	restart   bool                       // restart from the checkpoint once the job has stopped
	drop      dropState                  // a drop (D) setting the nodes left up again
	detaching bool                       // quit leaving the job to run, once it has started
	detached  string                     // the job the UI quit leaving running
	attached  *Attached                  // the job opened at the start, if any
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
	if opt.ReportPath == "" {
		opt.ReportPath = "report.png"
	}
	in := textinput.New()
	in.SetVirtualCursor(false)
	in.SetStyles(textinput.Styles{})
	m := &Model{
		opt:       opt,
		ctx:       opt.Context,
		st:        newStyles(opt.Colour),
		keys:      newKeyMap(),
		w:         80,
		h:         24,
		nodes:     newNodesModel(opt.Nodes),
		rankTable: newRankTableModel(opt.RankTablePath),
		job:       newJobModel(opt.Config, opt.Overrides, opt.Restarts),
		dash:      newDashModel(opt.LogLines, opt.LossPoints),
		input:     in,
		probes:    make(map[int]<-chan event.Event),
	}
	// Start where there is something to look at: the nodes while they are
	// probed, the job when there is only this machine.
	m.screen = screenJob
	for _, n := range opt.Nodes {
		if !n.Local {
			m.screen = screenNodes
		}
	}
	if a := opt.Attach; a != nil {
		m.attached, m.runner, m.jobN, m.screen = a, a.Runner, 1, screenDash
		m.dash.reset(a.Config, false)
	}
	return m
}

// Init starts probing the nodes and the clock, or follows the job opened.
func (m *Model) Init() tea.Cmd {
	if m.attached != nil {
		return tea.Batch(tick(), readEvents(m.jobN, m.runner.Events()))
	}
	return tea.Batch(tick(), m.probe(ProbeRequest{}))
}

// probe asks the launcher to set nodes up and returns the command that
// reads what it reports.
func (m *Model) probe(req ProbeRequest) tea.Cmd {
	if m.opt.Launcher == nil {
		return nil
	}
	m.probeN--
	ch := m.opt.Launcher.Probe(m.ctx, req)
	m.probes[m.probeN] = ch
	return readEvents(m.probeN, ch)
}

// Runner returns the running job, if any: after the program ends, the
// caller stops it and waits for it, so that no worker outlives the UI.
func (m *Model) Runner() Runner { return m.runner }

// Update handles a message. After one that may change what the planner
// is asked (a key, the nodes' events), it asks the planner again if the
// job, the rank table or the nodes have changed.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	var cmd tea.Cmd
	replan := false
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.w, m.h = max(msg.Width, 20), max(msg.Height, 8)
		m.input.SetWidth(max(m.w-12, 8))
		return m, nil
	case tickMsg:
		m.now = time.Time(msg)
		m.dash.settle(m.now)
		return m, tick()
	case eventsMsg:
		cmd, replan = m.onEvents(msg)
	case nextMsg:
		cmd = m.onNext(msg)
	case startedMsg:
		cmd = m.onStarted(msg)
	case planMsg:
		m.onPlan(msg)
	case reportMsg:
		m.onReport(msg)
	case dropRetryMsg:
		cmd = m.retryDrop()
	case statusMsg:
		m.status = string(msg)
	case tea.KeyPressMsg:
		cmd, replan = m.onKey(msg), true
	case tea.PasteMsg:
		if m.inputOn {
			m.input, cmd = m.input.Update(msg)
		}
	}
	if replan {
		if p := m.replan(); p != nil {
			cmd = tea.Batch(cmd, p)
		}
	}
	return m, cmd
}

// onEvents applies a batch of events from a probe or the job; nodes
// reports whether node events were among them.
func (m *Model) onEvents(msg eventsMsg) (cmd tea.Cmd, nodes bool) {
	if msg.stream <= probeStream {
		for _, ev := range msg.events {
			m.nodes.apply(ev)
			if ev.Kind == event.KindJob && ev.State == event.JobFailed {
				m.status = "probe: " + ev.Message // a mistake that is no one node's
			}
		}
		if msg.closed {
			delete(m.probes, msg.stream)
			return m.dropped(msg.stream), true
		}
		return readEvents(msg.stream, m.probes[msg.stream]), true
	}
	if msg.stream != m.jobN {
		return nil, false // a job that was replaced; its channel is drained elsewhere
	}
	for _, ev := range msg.events {
		switch ev.Kind {
		case event.KindProbe, event.KindNode, event.KindCheckpoint:
			m.nodes.apply(ev)
			nodes = true
		}
		m.dash.apply(ev, msg.at)
	}
	m.dash.settle(m.now)
	if !msg.closed {
		return readEvents(m.jobN, m.runner.Events()), nodes
	}
	// The job is over and its workers are gone (or the UI detached).
	prev := m.runner
	m.runner = nil
	m.dash.over()
	if c := m.confirm; c != nil && c.quit {
		m.confirm = nil // the question was about the job
		return tea.Quit, nodes
	}
	switch {
	case m.quitting || m.detached != "":
		return tea.Quit, nodes
	case m.restart:
		m.restart = false
		return m.launch(true), nodes
	}
	return m.awaitNext(prev), nodes
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
		m.dash.apply(e, time.Time{}) // the banner says why
		m.status = e.Message
		if m.quitting || m.detaching {
			return tea.Quit
		}
		return nil
	}
	m.runner = msg.runner
	cmd := readEvents(m.jobN, m.runner.Events())
	switch {
	case m.detaching:
		return m.detach()
	case m.quitting:
		return tea.Batch(cmd, m.stopJob())
	}
	return cmd
}

// busy reports whether a job runs or is being started.
func (m *Model) busy() bool { return m.runner != nil || m.launching }

// launchProblem says why the job cannot be launched now, in a sentence;
// "" when it can.
func (m *Model) launchProblem() string {
	switch {
	case m.opt.Launcher == nil:
		return "nothing can be launched: no launcher (start gptui with --hosts or --nproc)"
	case m.busy():
		return "a job is running: s stops it"
	case m.job.cfg == nil:
		return "the config does not resolve (see above)"
	}
	if nr := m.nodes.notReady(); nr != "" {
		return "every node must be ready, and " + nr + ": retry a node with R on the Nodes screen (1), or leave it out of the inventory"
	}
	if _, err := planDevice(m.job.cfg, m.nodes.readyNames(), m.nodes.readyProbes()); err != nil {
		return err.Error()
	}
	if n, want := m.rankTable.table(m.nodes.rows).RankSize(), m.job.ranks(); n != want {
		return fmt.Sprintf("the strategy needs %d ranks, the rank table has %d: fix one of them", want, n)
	}
	return ""
}

// launch starts the job as configured, or resumes it.
func (m *Model) launch(resume bool) tea.Cmd {
	if p := m.launchProblem(); p != "" {
		m.status = p
		if m.job.cfg == nil {
			m.screen = screenJob
		}
		return nil
	}
	if m.job.restarts.MinNodes > 0 && len(m.rankTable.edited) > 0 {
		m.status = "--min-nodes does not go with devices edited on the Rank table screen (2), which fix the nodes: set Min nodes to 0 on the Job screen, or undo the edits"
		return nil
	}
	t := m.rankTable.table(m.nodes.rows)
	id := jobdir.NewID()
	path := m.rankTable.jobPath(id)
	if err := m.rankTable.write(path, t); err != nil {
		m.status = "rank table: " + err.Error()
		return nil
	}
	job := Job{
		Config:    m.job.source,
		Overrides: append([]string(nil), m.job.overrides...),
		Resume:    resume,
		Table:     t,
		TablePath: path,
		JobID:     id,
		Resolved:  m.job.cfg,
		Restarts:  m.job.restarts,
		Nodes:     m.nodes.readyNames(),
		Elastic:   m.job.restarts.MinNodes > 0,
	}
	m.owner = id
	if resume && m.continues != "" {
		job.Continues, m.owner = m.continues, m.continues
	}
	m.continues = ""
	m.jobN++
	m.launching = true
	m.dash.reset(m.job.cfg, resume)
	m.dash.message = "starting"
	m.show(screenDash)
	n, l, ctx := m.jobN, m.opt.Launcher, m.ctx
	return func() tea.Msg {
		r, err := l.Start(ctx, job)
		return startedMsg{job: n, runner: r, err: err}
	}
}

// retry sets a node up again, accepting the host key with fingerprint
// key if it is not "".
func (m *Model) retry(node, key string) tea.Cmd {
	switch {
	case m.opt.Launcher == nil:
		m.status = "no launcher to set the node up with"
		return nil
	case m.busy():
		m.status = "a job is running: it sets its nodes up itself"
		return nil
	}
	m.status = "setting " + node + " up again…"
	if key != "" {
		m.status = "accepting " + key + " for " + node + " and setting it up again…"
	}
	return m.probe(ProbeRequest{Nodes: []string{node}, AcceptHostKey: key})
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

// show shows a screen, remembering the one to go back to.
func (m *Model) show(s int) {
	if s != m.screen {
		m.back = append(m.back, m.screen)
		if len(m.back) > 16 {
			m.back = m.back[1:]
		}
		m.screen = s
	}
}

// host is what a screen may ask of the root model while it handles one
// of its keys: the screens' models say what a key means, the root does
// what concerns more than one screen.
type host interface {
	openPrompt(purpose int, label, value, arg string) tea.Cmd
	ask(question string, yes func() tea.Cmd)
	say(status string)
	launch(resume bool) tea.Cmd
	retry(node, key string) tea.Cmd
	askDrop() tea.Cmd
	applyPlan()
	plans() int
	reportPath() string
}

// ask puts a yes/no question on the bottom line.
func (m *Model) ask(q string, yes func() tea.Cmd) { m.confirm = &confirmation{question: q, yes: yes} }

// say puts a message on the bottom line until the next key.
func (m *Model) say(s string) { m.status = s }

// openPrompt opens the input line.
func (m *Model) openPrompt(purpose int, label, value, arg string) tea.Cmd {
	m.inputOn, m.prompt, m.arg = true, purpose, arg
	m.input.Prompt = label
	m.input.SetValue(value)
	m.input.CursorEnd()
	return m.input.Focus()
}

// onKey handles a key press: the question or the input line if one is
// open, the help, the keys of every screen (quit, help, the screens, stop,
// restart), then the current screen's own, then moving between screens.
func (m *Model) onKey(msg tea.KeyPressMsg) tea.Cmd {
	k := m.keys
	m.status = ""
	if c := m.confirm; c != nil && c.stop != nil {
		switch msg.String() {
		case "enter", "y", "Y", "d", "D", "ctrl+c":
			m.confirm = nil
			return c.yes()
		case "s", "S":
			m.confirm = nil
			return c.stop()
		case "esc", "n", "N", "q":
			m.confirm = nil
		}
		return nil
	}
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
		m.show(int(msg.String()[0] - '1'))
		return nil
	case is(msg, k.Stop):
		if m.runner == nil {
			m.status = "no job is running"
			return nil
		}
		m.ask("Stop the job? Its workers get SIGTERM (they save and exit), then SIGKILL.", m.stopJob)
		return nil
	case is(msg, k.Restart):
		return m.askRestart()
	}
	var (
		used bool
		cmd  tea.Cmd
	)
	switch m.screen {
	case screenNodes:
		used, cmd = m.nodes.update(msg, k, m)
	case screenRanks:
		used, cmd = m.rankTable.update(msg, k, m.nodes.rows, m)
	case screenJob:
		used, cmd = m.job.update(msg, k, max(m.h/3, 1), m)
	case screenDash:
		used, cmd = m.dash.update(msg, k, max(m.h/3, 1), m)
	}
	if used {
		return cmd
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

// applyPlan applies the selected plan of the Job screen: its overrides
// replace the job's.
func (m *Model) applyPlan() {
	j := &m.job
	i := j.selectedPlan()
	if i < 0 {
		m.status = "select a plan first: ↓ past [ Launch ] moves into the plans"
		return
	}
	r := m.plan.report
	switch {
	case m.plan.err != nil:
		m.status = "plan: " + m.plan.err.Error()
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

// quit quits, first asking what becomes of a running job: a detached
// one (a DetachingLauncher's, or one attached) is left running by default, or
// stopped; another is stopped.
func (m *Model) quit() tea.Cmd {
	if !m.busy() || m.runner != nil && m.jobEnded() {
		// Nothing runs: its stream only waits for the supervisor's exit.
		return tea.Quit
	}
	stop := func() tea.Cmd {
		m.quitting = true
		m.status = "stopping the job…"
		return m.stopJob()
	}
	_, detachable := m.runner.(DetachedRunner)
	if m.launching && m.opt.Launcher != nil {
		_, detachable = m.opt.Launcher.(DetachingLauncher)
	}
	if !detachable {
		m.ask("A job is running: stop it and quit?", stop)
		m.confirm.quit = true
		return nil
	}
	m.confirm = &confirmation{
		question: "A job is running: detach (it runs on; gptui attach reopens it) or stop it? [D/s]",
		yes:      m.detach,
		stop:     stop,
		quit:     true,
	}
	return nil
}

// jobEnded reports whether the job's end (done, failed, stopped) has
// come.
func (m *Model) jobEnded() bool {
	switch m.dash.state {
	case event.JobDone, event.JobFailed, event.JobStopped:
		return true
	}
	return false
}

// detach quits leaving the job running, once it has started.
func (m *Model) detach() tea.Cmd {
	r, ok := m.runner.(DetachedRunner)
	if !ok {
		m.detaching, m.status = true, "detaching once the job has started…"
		return nil
	}
	m.detached = r.ID()
	r.Detach() // its events end
	return tea.Quit
}

// Quitting reports whether the user asked to stop the job and quit.
func (m *Model) Quitting() bool { return m.quitting }

// Detached returns the id of the job the UI quit leaving running, "" if
// none.
func (m *Model) Detached() string { return m.detached }

// askRestart asks to restart the job from its latest checkpoint: a
// detached job in place, through its supervisor; another by stopping it
// and launching it again, resuming.
func (m *Model) askRestart() tea.Cmd {
	if r, ok := m.runner.(DetachedRunner); ok {
		m.ask("Restart the job from its latest checkpoint? Its workers save, stop and start again.", func() tea.Cmd {
			return func() tea.Msg {
				if err := r.Restart(); err != nil {
					return statusMsg("restart: " + err.Error())
				}
				return nil
			}
		})
		return nil
	}
	if a := m.attached; a != nil && m.runner == nil && m.opt.Launcher == nil {
		if a.Reopen == nil {
			m.status = "this job cannot be restarted from here: gptui restart ID"
			return nil
		}
		m.ask("Restart the job from its latest checkpoint?", func() tea.Cmd {
			r, err := a.Reopen()
			if err != nil {
				m.status = "restart: " + err.Error()
				return nil
			}
			m.jobN++
			m.runner, m.dash.state, m.dash.closed = r, "", false
			return readEvents(m.jobN, r.Events())
		})
		return nil
	}
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
		if err := m.rankTable.setDevices(m.arg, v); err != nil {
			m.status = err.Error()
		}
	case promptConfig:
		m.job.source = strings.TrimSpace(v)
		m.job.resolve()
	case promptRestarts:
		var row int
		fmt.Sscan(m.arg, &row)
		if err := m.job.setRestarts(row, v); err != nil {
			m.status = err.Error()
		}
	case promptOverride:
		var i int
		fmt.Sscan(m.arg, &i)
		n := len(m.job.overrides)
		if err := m.job.setOverride(i, v); err != nil {
			m.status = err.Error()
		}
		if len(m.job.overrides) > n {
			m.job.sel = rowOverride + i // the new override's row
		}
		m.job.sel = min(m.job.sel, m.job.launchRow())
	}
	return nil
}

// Summary says where the last job left its logs and its newest
// checkpoint, for the terminal after the UI has quit; nil when no job
// ran.
func (m *Model) Summary() []string {
	if m.jobN == 0 {
		return nil
	}
	return m.dash.summary(m.opt.Nodes)
}

// Err returns the last job's failure, for the exit status once the UI
// has quit: nil when no job ran, or the last one did not fail.
func (m *Model) Err() error {
	if m.jobN == 0 || m.dash.state != event.JobFailed {
		return nil
	}
	why := "see its log"
	if f := m.dash.failure; f != nil && f.Message != "" {
		why = strings.TrimPrefix(f.Message, "cluster: ")
	}
	return fmt.Errorf("the job failed: %s", why)
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
// each exactly its width in cells. The dashboard draws itself into the
// frame's canvas; the other screens give their lines as strings.
func (m *Model) Render() string {
	w, h := m.w, m.h
	c := newCanvas(w, h)
	rows := make([]int, 0, 2*h)
	m.titleLine(c, w)
	rows = append(rows, c.endLine())
	bottom := m.bottomLines(w)
	body := h - 1 - max(len(bottom), 1)
	var b []string
	switch {
	case m.help:
		b = m.helpLines(w, body)
	case m.screen == screenNodes:
		b = m.nodes.view(m.st, w, body)
	case m.screen == screenRanks:
		b = m.rankTable.view(m.st, m.nodes.rows, w, body)
	case m.screen == screenJob:
		b = m.job.view(m.st, jobView{
			table: m.rankTable.table(m.nodes.rows), ready: len(m.nodes.readyNames()), all: len(m.nodes.rows),
			blocked: m.launchProblem(), planner: m.opt.Plan != nil, plan: &m.plan,
		}, w, body)
	default:
		rows = m.dash.view(c, rows, m.st, w, body, m.now)
	}
	for i := range body {
		if i < len(b) {
			rows = append(rows, c.textLine(b[i]))
		} else if len(rows) < 1+body {
			rows = append(rows, c.endLine())
		}
	}
	if bottom == nil {
		m.hintLine(c, w)
		rows = append(rows, c.endLine())
	}
	for _, l := range bottom {
		rows = append(rows, c.textLine(l))
	}
	// The screen: its lines one after another, the body's fitted to the
	// width.
	out := len(c.b)
	for i, row := range rows {
		if i > 0 {
			c.byte('\n')
		}
		from := len(c.b)
		c.put(row)
		if i > 0 && i <= body {
			c.fit(from, w)
		}
	}
	return string(c.b[out:])
}

// titleLine draws the screens, the current one in brackets, and the job.
func (m *Model) titleLine(c *canvas, w int) {
	from := len(c.b)
	c.styled(m.st.Title, " gptui ")
	for i, name := range screenNames {
		if i == m.screen && !m.help {
			at := len(c.b)
			c.byte('[')
			c.num(i + 1)
			c.byte(' ')
			c.str(name)
			c.byte(']')
			c.paint(m.st.Tab, at)
		} else {
			c.byte(' ')
			c.num(i + 1)
			c.byte(' ')
			c.str(name)
			c.byte(' ')
		}
	}
	state := ""
	switch {
	case m.launching:
		state = "starting"
	case m.runner != nil && m.dash.state == "stopping":
		state = "stopping"
	case m.runner != nil && m.dash.state != event.JobStarted && m.dash.state != "":
		state = m.dash.state // its last workers are being stopped
	case m.runner != nil:
		state = "running"
	case m.dash.state != "":
		state = m.dash.state
	}
	n := 0
	if state != "" {
		n = len("job ") + len(state)
	}
	pad := w - c.width(from) - n - 1
	if pad < 1 {
		c.fit(from, w)
		return
	}
	c.spaces(pad)
	if state != "" {
		at := len(c.b)
		c.str("job ")
		c.str(state)
		c.paint(m.st.state(state), at)
	}
	c.byte(' ')
	c.fit(from, w)
}

// bottomLines are the input line, a question or a message (wrapped, up
// to a third of the screen, so that a long one is read whole); nil when
// the key hints show.
func (m *Model) bottomLines(w int) []string {
	long := func(s string) []string {
		ls := wrap(s, w-2)
		if n := max(m.h/3, 1); len(ls) > n {
			ls = ls[:n]
		}
		for i := range ls {
			ls[i] = fit(" "+ls[i], w)
		}
		return ls
	}
	switch {
	case m.inputOn:
		return []string{fit(m.input.View(), w)}
	case m.confirm != nil && m.confirm.stop != nil:
		return long(m.st.Warn.r(m.confirm.question))
	case m.confirm != nil:
		return long(m.st.Warn.r(m.confirm.question + " [y/N]"))
	case m.status != "":
		return long(m.status)
	}
	return nil
}

// hintLine draws the current screen's main keys.
func (m *Model) hintLine(c *canvas, w int) {
	var hints string
	switch {
	case m.help:
		hints = "esc or ? closes the help"
	case m.screen == screenNodes:
		hints = "↑↓ select  enter details  R retry  a accept key  / filter  ? help  q quit"
	case m.screen == screenRanks:
		hints = "↑↓ select  enter edit devices  w write  1-4 screens  ? help  q quit"
	case m.screen == screenJob:
		hints = "↑↓ select  enter edit/launch/apply  a add -o  d delete  p apply  ? help  q quit"
	default:
		hints = "tab pane  z zoom  W wrap  / search  w report  s stop  r restart  ? help  q quit"
	}
	from := len(c.b)
	c.byte(' ')
	c.str(hints)
	c.fit(from, w)
	c.paint(m.st.Dim, from)
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
