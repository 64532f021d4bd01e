package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/term"

	"github.com/gptui/gptui/agent"
	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/launch"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/sshexec"
	"github.com/gptui/gptui/tui"
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
	table := fs.String("rank-table", "rank_table.json", "where the rank table is written")
	acceptNew := fs.Bool("accept-new-host-keys", false, "with --hosts: trust and record the host key of a node not in known_hosts")
	var cf clusterFlags
	fs.IntVar(&cf.restarts.Max, "max-restarts", 0, "with --hosts: restart a job from its newest checkpoint up to `N` times after a worker fails, a node is lost or the job hangs (on the same nodes: the UI's rank table fixes them)")
	if err := parse(fs, args); err != nil {
		return err
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
	if !term.IsTerminal(os.Stdin.Fd()) || !term.IsTerminal(os.Stdout.Fd()) {
		return usagef("the terminal UI needs a terminal, and standard input or output is not one: use 'gptui run --no-tui' with the same flags")
	}
	opt := tui.Options{
		Context:       ctx,
		Config:        *c,
		Overrides:     *o,
		RankTablePath: *table,
		Colour:        os.Getenv("NO_COLOR") == "",
		Plan:          newPlanner(),
	}
	if *hosts != "" {
		nodes, err := sshexec.LoadInventory(*hosts)
		if err != nil {
			return usageError{err}
		}
		if err := cf.checkRestarts(len(nodes)); err != nil {
			return err
		}
		opt.Nodes = nodes
		opt.Launcher = &clusterLauncher{
			nodes: nodes, hosts: *hosts, config: *c, overrides: *o,
			ssh:      sshexec.ClientConfig{AcceptNewHostKeys: *acceptNew},
			restarts: cf.restarts,
		}
	} else {
		if cf.restarts.Max != 0 {
			return usagef("--max-restarts needs --hosts FILE")
		}
		opt.Nodes = []sshexec.Node{{Name: "localhost", Host: "127.0.0.1", Local: true, Workdir: ".", Devices: sshexec.Devices{CPU: *nproc}}}
		opt.Launcher = &localLauncher{nodes: opt.Nodes}
	}
	return runTUI(ctx, opt, os.Stdin, stdout)
}

// runTUI runs the UI until the user quits, then stops whatever job is still
// running and waits for its workers to be gone.
func runTUI(ctx context.Context, opt tui.Options, in io.Reader, out io.Writer) error {
	m := tui.New(opt)
	popts := []tea.ProgramOption{tea.WithContext(ctx), tea.WithInput(in), tea.WithOutput(out)}
	if !opt.Colour {
		popts = append(popts, tea.WithColorProfile(colorprofile.Ascii))
	}
	_, err := tea.NewProgram(m, popts...).Run()
	if r := m.Runner(); r != nil {
		r.Stop()
		drain(r.Events(), 30*time.Second)
	}
	if errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil {
		return ctx.Err()
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

// localLauncher runs jobs on this machine: it probes it as `gptui agent
// --probe` does and runs the workers with the node agent in process, so the
// UI gets the same events as from a cluster job.
type localLauncher struct {
	nodes []sshexec.Node
}

// Probe reports this machine for each local node and refuses remote ones.
func (l *localLauncher) Probe(ctx context.Context) <-chan event.Event {
	ch := make(chan event.Event, 2*len(l.nodes)+1)
	p := agent.Probe()
	for _, n := range l.nodes {
		e := event.New(event.KindNode)
		e.Node = n.Name
		if !n.Local {
			e.State, e.Message = event.NodeFailed, "not probed: remote nodes need the cluster runner, which this build does not have"
			ch <- e
			continue
		}
		pe := event.New(event.KindProbe)
		pe.Node, pe.Probe = n.Name, &p
		ch <- pe
		e.State = event.NodeReady
		ch <- e
	}
	close(ch)
	return ch
}

// Start runs the job's workers on this machine through the node agent.
func (l *localLauncher) Start(ctx context.Context, job tui.Job) (tui.Runner, error) {
	if job.Table == nil || len(job.Table.Servers) != 1 || len(l.nodes) != 1 || !l.nodes[0].Local {
		return nil, errors.New("only a job on this machine alone can be launched without the cluster runner")
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	port, err := launch.FreePort(masterAddr)
	if err != nil {
		return nil, err
	}
	devs := job.Table.Servers[0].Devices
	world := len(devs)
	spec := &agent.Spec{
		Job:    "local-" + strconv.FormatInt(time.Now().UnixNano(), 36),
		Node:   l.nodes[0].Name,
		Exe:    exe,
		LogDir: job.Resolved.Engine.LogDir,
	}
	args := []string{"train", "-c", job.Config}
	for _, kv := range job.Overrides {
		args = append(args, "-o", kv)
	}
	if job.Resume {
		args = append(args, "--resume")
	}
	var threads []string
	if os.Getenv("GPTUI_THREADS") == "" {
		threads = []string{"GPTUI_THREADS=" + strconv.Itoa(max(1, runtime.NumCPU()/world))}
	}
	secret, err := comm.NewSecret()
	if err != nil {
		return nil, err
	}
	for i, d := range devs {
		spec.Workers = append(spec.Workers, agent.WorkerSpec{
			Rank: d.RankID, LocalRank: i, Device: -1, Args: args,
			Env: append(launch.Env(d.RankID, i, world, masterAddr, port, secret), threads...),
		})
	}
	if err := spec.Check(); err != nil {
		return nil, err
	}
	r := &localRunner{events: make(chan event.Event, 256)}
	stdin, stop := io.Pipe()
	r.stop = stop
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		err := agent.Run(ctx, spec, stdin, event.NewWriter(pw))
		pw.Close()
		errc <- err
	}()
	go func() {
		defer close(r.events)
		rd := event.NewReader(pr)
		ended := false
		for {
			e, err := rd.Next()
			if err != nil {
				break
			}
			ended = ended || e.Ends()
			r.events <- e
		}
		pr.Close()
		if err := <-errc; err != nil && !ended {
			// The agent could not run the job at all: say why.
			e := event.New(event.KindJob)
			e.State, e.Message = event.JobFailed, err.Error()
			r.events <- e
		}
	}()
	return r, nil
}

// localRunner is a job run by an in-process agent.
type localRunner struct {
	events chan event.Event
	stop   *io.PipeWriter // closing it is the agent's end of input: it stops the workers
	once   sync.Once
}

func (r *localRunner) Events() <-chan event.Event { return r.events }
func (r *localRunner) Stop()                      { r.once.Do(func() { r.stop.Close() }) }

// clusterLauncher runs jobs on the nodes of an inventory with the cluster
// runner (package cluster), the launcher of 'gptui run --hosts'.
type clusterLauncher struct {
	nodes     []sshexec.Node
	hosts     string
	config    string
	overrides []string
	ssh       sshexec.ClientConfig
	restarts  cluster.Restarts // the automatic restarts of each job
}

// Probe plans a job of the starting config on the nodes, which connects to
// each, pushes gptui and probes it, and reports it all as events; then it
// gives the job up. (A config that does not resolve yet is replaced by
// tiny for the probe: it only decides which data paths are checked.)
func (l *clusterLauncher) Probe(ctx context.Context) <-chan event.Event {
	cfg, err := presets.Load(l.config, l.overrides)
	if err != nil {
		cfg, _ = presets.Load("tiny", nil)
	}
	job := cluster.New(cluster.Options{Nodes: l.nodes, Hosts: l.hosts, Config: cfg, SSH: l.ssh})
	ch := make(chan event.Event, 64)
	go func() {
		defer close(ch)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for e := range job.Events() {
				ch <- e
			}
		}()
		_, err := job.Plan(ctx)
		job.Close()
		<-done
		var ie *cluster.InputError
		if errors.As(err, &ie) {
			e := event.New(event.KindJob)
			e.State, e.Message = event.JobFailed, err.Error()
			ch <- e
		}
	}()
	return ch
}

// Start plans the job with the UI's rank table and starts it; both happen
// in the background, reported on the runner's events.
func (l *clusterLauncher) Start(ctx context.Context, job tui.Job) (tui.Runner, error) {
	cfg := job.Resolved
	if job.Resume {
		// The same as 'gptui train --resume'.
		var err error
		if cfg, err = presets.Load(job.Config, append(append([]string(nil), job.Overrides...), "Engine.save_load.ckpt_dir=auto")); err != nil {
			return nil, err
		}
	}
	cj := cluster.NewSupervisor(cluster.Options{
		Nodes: l.nodes, Hosts: l.hosts, Config: cfg, SSH: l.ssh,
		RankTable: job.Table, RankTableFile: job.TablePath,
	}, l.restarts)
	ctx, cancel := context.WithCancel(ctx)
	r := &clusterRunner{events: make(chan event.Event, 256), cancel: cancel}
	failed := make(chan error, 1)
	go func() {
		defer close(r.events)
		for e := range cj.Events() {
			r.events <- e
		}
		if err := <-failed; err != nil {
			e := event.New(event.KindJob)
			e.State, e.Message = event.JobFailed, err.Error()
			if ctx.Err() != nil {
				e.State = event.JobStopped // Stop while the job was being planned
			}
			r.events <- e
		}
		cancel()
	}()
	go func() {
		if _, err := cj.Plan(ctx); err != nil {
			cj.Close()
			failed <- err
			return
		}
		if err := cj.Start(ctx); err != nil {
			cj.Wait() // its events end with the job's failure
		}
		failed <- nil
	}()
	return r, nil
}

// clusterRunner is a job of the cluster runner.
type clusterRunner struct {
	events chan event.Event
	cancel context.CancelFunc // stops the job, while it is planned or runs
}

func (r *clusterRunner) Events() <-chan event.Event { return r.events }
func (r *clusterRunner) Stop()                      { r.cancel() }
