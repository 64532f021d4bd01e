package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/term"

	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/jobdir"
	"github.com/gptui/gptui/sshexec"
	"github.com/gptui/gptui/tui"
	"github.com/gptui/gptui/tui/hooks"
)

// wantsTUI reports whether 'gptui' with these arguments opens the
// interactive UI: with no arguments on a terminal, or with the UI's flags
// (--hosts, --preset, ...) and no command.
func wantsTUI(args []string) bool {
	if len(args) == 0 {
		return term.IsTerminal(os.Stdin.Fd()) && term.IsTerminal(os.Stdout.Fd())
	}
	a := args[0]
	return strings.HasPrefix(a, "-") && a != "-h" && a != "--help" && a != "-help"
}

// cmdTUI implements 'gptui [--hosts FILE] [--preset NAME | -c CONFIG] [-o
// ...]': the interactive terminal UI.
func cmdTUI(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("", stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: gptui [--hosts FILE | --nproc N] [--preset NAME | -c CONFIG] [-o Section.key=value ...]")
		fs.PrintDefaults()
	}
	c, o := configFlags(fs)
	preset := fs.String("preset", "", "a preset name or config file (the same as -c)")
	hosts := fs.String("hosts", "", "the host inventory: one node per line (see 'gptui ranktable --hosts')")
	nproc := fs.Int("nproc", 1, "without --hosts: the number of CPU workers on this machine")
	table := fs.String("rank-table", "", "where the rank table is written (default: jobs/<job>/rank_table.json at a launch, the job's directory; rank_table.json when saved with w)")
	acceptNew := fs.Bool("accept-new-host-keys", false, "with --hosts: trust and record the host key of a node not in known_hosts")
	var cf clusterFlags
	fs.IntVar(&cf.restarts.Max, "max-restarts", 0, "restart a job from its newest checkpoint up to `N` times after a worker fails, a node is lost or the job hangs (the Job screen's Restarts)")
	fs.IntVar(&cf.restarts.MinNodes, "min-nodes", 0, "with --hosts: at the start and at a restart, leave out nodes that stay unreachable and re-plan for those left, down to `K` nodes (the Job screen's Min nodes; default: every node)")
	fs.DurationVar(&cf.agentTimeout, "agent-timeout", cluster.DefaultAgentTimeout, "a node whose agent sends nothing for this long is lost")
	fs.DurationVar(&cf.hangTimeout, "hang-timeout", cluster.DefaultHangTimeout, "the job is hung when a worker sends no progress report for this long, or ranks wait this long in one collective")
	cf.binaries = binaryFlags{}
	fs.Var(cf.binaries, "binary", "with --hosts: the gptui executable `GOOS/GOARCH=PATH` for the nodes of another platform (not carried to the UI's jobs yet: use 'gptui run --no-tui')")
	if err := parse(fs, args); err != nil {
		return err
	}
	if len(cf.binaries) > 0 {
		// The UI's probes and its detached jobs (tui/hooks.Cluster,
		// jobdir.Spec) do not carry cluster.Options.Binaries yet.
		return usagef("--binary: the UI does not pass it on to its jobs yet; run the job with 'gptui run --no-tui --hosts FILE --binary %s'", strings.ReplaceAll(cf.binaries.String(), ",", " --binary "))
	}
	cf.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { cf.set[f.Name] = true })
	if cf.agentTimeout < 2*time.Second || cf.hangTimeout < 2*time.Second {
		return usagef("--agent-timeout %v, --hang-timeout %v: want at least 2s each (agents and workers report every second)", cf.agentTimeout, cf.hangTimeout)
	}
	cf.hosts = *hosts
	if *preset != "" && *c != "" && *preset != *c {
		return usagef("give a preset with --preset or -c, not both")
	}
	if *preset != "" {
		*c = *preset
	}
	if *nproc < 1 {
		return usagef("--nproc %d: need at least one worker", *nproc)
	}
	opt := tui.Options{
		Context:       ctx,
		Config:        *c,
		Overrides:     *o,
		RankTablePath: *table,
		Colour:        os.Getenv("NO_COLOR") == "",
		Plan:          hooks.Planner(),
	}
	opt.Restarts = cf.restarts
	l := &hooks.Cluster{Hosts: *hosts, Config: *c, Overrides: *o, SSH: sshexec.ClientConfig{AcceptNewHostKeys: *acceptNew},
		AgentTimeout: cf.agentTimeout, HangTimeout: cf.hangTimeout}
	if *hosts != "" {
		nodes, err := sshexec.LoadInventory(*hosts)
		if err != nil {
			return usageError{err}
		}
		if err := cf.checkRestarts(len(nodes)); err != nil {
			return err
		}
		l.Nodes = nodes
	} else {
		// As 'gptui run' and the Job screen: a local job restarts too.
		if cf.set["min-nodes"] || cf.set["max-nodes"] {
			return usagef("--min-nodes and --max-nodes need --hosts FILE")
		}
		if cf.restarts.Max < 0 {
			return usagef("--max-restarts %d: want 0 (never restart) or more", cf.restarts.Max)
		}
		// This machine, run by the same launcher as a cluster: an agent
		// process and its workers, in the current directory.
		l.Hosts = sshexec.LocalHosts
		l.Nodes = []sshexec.Node{sshexec.LocalNode(*nproc)}
	}
	opt.Nodes, opt.Launcher = l.Nodes, l
	if !term.IsTerminal(os.Stdin.Fd()) || !term.IsTerminal(os.Stdout.Fd()) {
		return usagef("the terminal UI needs a terminal, and standard input or output is not one: use 'gptui run --no-tui' with the same flags")
	}
	return runTUI(ctx, opt, os.Stdin, stdout)
}

// runTUI runs the UI until the user quits. A job the UI launched or
// opened runs detached (its own supervisor): it is left running unless the
// user stopped it. A job of another Launcher is stopped, and its workers
// waited for. A last job that failed is its error (exit status 1).
func runTUI(ctx context.Context, opt tui.Options, in io.Reader, out io.Writer) error {
	m := tui.New(opt)
	popts := []tea.ProgramOption{tea.WithContext(ctx), tea.WithInput(in), tea.WithOutput(out)}
	if !opt.Colour {
		popts = append(popts, tea.WithColorProfile(colorprofile.Ascii))
	}
	_, err := tea.NewProgram(m, popts...).Run()
	// A detached job runs on whatever became of the UI: quit, killed, or
	// its terminal gone. Another is stopped, and waited for.
	id := m.Detached()
	switch r := m.Runner().(type) {
	case tui.DetachedRunner:
		r.Detach()
		if !m.Quitting() {
			id = r.ID()
		}
	case nil:
	default:
		r.Stop()
		drain(r.Events(), 30*time.Second)
	}
	if id != "" {
		fmt.Fprintf(out, "gptui: job %s runs on: 'gptui attach %s' reopens it, 'gptui stop %s' stops it\n", id, id, id)
	}
	for _, l := range m.Summary() {
		fmt.Fprintln(out, l)
	}
	if errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil {
		return ctx.Err()
	}
	if err == nil {
		err = m.Err()
	}
	return err
}

// drain reads ch until it is closed or the time is up.
func drain(ch <-chan event.Event, limit time.Duration) {
	t := time.NewTimer(limit)
	defer t.Stop()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-t.C:
			return
		}
	}
}

// cmdAttach implements 'gptui attach [ID]': the UI's dashboard on a job
// started here (the newest by default), running or ended, by following
// its event log from the start. q leaves it running (or stops it, if
// asked to); r restarts it, in place while it runs, from its newest
// checkpoint after its end.
func cmdAttach(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("attach", stderr)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	j, err := jobArg("attach", pos, true)
	if err != nil {
		return err
	}
	if !term.IsTerminal(os.Stdin.Fd()) || !term.IsTerminal(os.Stdout.Fd()) {
		return usagef("attach: the dashboard needs a terminal, and standard input or output is not one: 'gptui jobs' gives the job's state, %s its event log", filepath.Join(j.Dir, jobdir.EventsFile))
	}
	_, c, o := flagsOf(j.Spec)
	cfg, _ := loadConfig(c, o) // nil: the dashboard does without its total steps
	var nodes []sshexec.Node
	if j.Spec.Local() {
		nodes = []sshexec.Node{sshexec.LocalNode(max(j.Spec.Nproc, 1))}
	} else if inv, err := sshexec.LoadInventory(j.Spec.Hosts); err == nil {
		nodes = inv
	}
	opt := tui.Options{
		Context: ctx, Config: c, Overrides: o, Nodes: nodes,
		Colour: os.Getenv("NO_COLOR") == "",
		Attach: &tui.Attached{
			Runner: jobdir.Attach(ctx, j.Dir, 0),
			Config: cfg,
			Reopen: func() (tui.Runner, error) {
				from := eventsSize(j)
				if err := restartEnded(j); err != nil {
					return nil, err
				}
				return jobdir.Attach(ctx, j.Dir, from), nil
			},
			Next: func(ctx context.Context, prev tui.Runner) (tui.Runner, error) {
				a, ok := prev.(*jobdir.Attached)
				if !ok {
					return nil, fmt.Errorf("attach: job %s: not followed from its event log", j.ID)
				}
				n, err := a.Next(ctx)
				if err != nil {
					return nil, err
				}
				return n, nil
			},
		},
	}
	return runTUI(ctx, opt, os.Stdin, stdout)
}
