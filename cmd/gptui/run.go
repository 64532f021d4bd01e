package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/ranktable"
	"github.com/gptui/gptui/sshexec"
)

// cmdRun implements 'gptui run': it trains with --nproc worker processes on
// this machine, or with --hosts on the nodes of an inventory over SSH. Both
// are jobs of package cluster, a local one on this machine as its one node
// (sshexec.LocalNode): an agent process whose workers are each 'gptui
// train' with the resolved config and their rank in RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR and MASTER_PORT.
func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("run", stderr)
	c, o := configFlags(fs)
	preset := fs.String("preset", "", "a preset `NAME` (the same as -c NAME)")
	noTUI := fs.Bool("no-tui", false, "print the workers' output lines instead of the interactive UI (required for now)")
	detach := fs.Bool("detach", false, "run the job on its own, detached from this terminal: print its id and return ('gptui jobs', 'attach', 'stop' and 'restart' act on it)")
	var cf clusterFlags
	fs.IntVar(&cf.nproc, "nproc", 1, "number of worker processes to start on this machine")
	fs.StringVar(&cf.show, "show-ranks", "0", "whose output to print: 'all' or a comma-separated list of ranks")
	fs.IntVar(&cf.port, "master-port", 0, "MASTER_PORT for the workers; 0 picks a free port")
	resume := fs.Bool("resume", false, "resume from the newest checkpoint of Engine.save_load.output_dir (the same as -o Engine.save_load.ckpt_dir=auto); with --hosts, nodes without it get a copy first")
	force := fs.Bool("force", false, "train from step 0 even where Engine.save_load.output_dir holds another run's checkpoints (the same as -o Engine.save_load.force=true)")
	fs.StringVar(&cf.hosts, "hosts", "", "run on the nodes of the inventory `FILE` over SSH (one node per line: [user@]host[:port] devices=0-7 ...)")
	fs.StringVar(&cf.rankTable, "rank-table", "", "with --hosts: take ranks and devices from the rank table `FILE` instead of the inventory and probes")
	fs.BoolVar(&cf.acceptNew, "accept-new-host-keys", false, "with --hosts: accept and record the host keys of nodes that ~/.ssh/known_hosts does not know")
	fs.BoolVar(&cf.dryRun, "dry-run", false, "with --hosts: set the nodes up (connect, push, probe, pre-flight), print the rank table, each node's commands and the pre-flight table, and start nothing")
	fs.DurationVar(&cf.summaryEvery, "summary-every", 10*time.Second, "with --hosts: how often to print the summary line")
	fs.DurationVar(&cf.agentTimeout, "agent-timeout", cluster.DefaultAgentTimeout, "with --hosts: a node whose agent sends nothing (not even its heartbeat, every second) for this long is lost")
	fs.DurationVar(&cf.hangTimeout, "hang-timeout", cluster.DefaultHangTimeout, "with --hosts: the job is hung when a worker sends no progress report (every second) for this long, or ranks wait this long in one collective; the stuck rank is named and the job stopped (or restarted)")
	fs.IntVar(&cf.keepJobs, "keep-jobs", cluster.DefaultKeepJobs, "with --hosts: after a successful job, each node keeps the newest `K` jobs/<id> directories (this job's included; -1 keeps all)")
	fs.IntVar(&cf.restarts.Max, "max-restarts", 0, "restart the job from its newest checkpoint up to `N` times after a worker fails, a node is lost or the job hangs")
	fs.IntVar(&cf.restarts.MinNodes, "min-nodes", 0, "with --hosts: at the start and at a restart, leave out nodes that stay unreachable and re-plan for those left, down to `K` nodes (default: every node)")
	fs.IntVar(&cf.restarts.MaxNodes, "max-nodes", 0, "with --hosts: use at most the first `K` nodes of the inventory (default: all)")
	cf.binaries = binaryFlags{}
	fs.Var(cf.binaries, "binary", "with --hosts: push the gptui executable `GOOS/GOARCH=PATH` (such as linux/arm64=gptui-arm64) to the nodes of that platform instead of this one (repeat for more platforms)")
	fs.StringVar(&cf.stageData, "stage-data", "missing", "with --hosts: `missing` copies a data path a node lacks there from this machine (SHA-256 verified, files already there skipped); never refuses the job instead")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *resume {
		*o = append(*o, "Engine.save_load.ckpt_dir=auto")
	}
	if *force {
		*o = append(*o, "Engine.save_load.force=true")
	}
	if *preset != "" {
		if *c != "" && *c != *preset {
			return usagef("run: -c %s and --preset %s: give one", *c, *preset)
		}
		*c = *preset
	}
	if !*noTUI && !*detach {
		return usagef("run: pass --no-tui to run headless, or --detach to run detached from this terminal; the interactive UI is `gptui --hosts FILE --preset NAME` (no command)")
	}
	cf.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { cf.set[f.Name] = true })
	if err := cf.check(); err != nil {
		return err
	}
	if *detach {
		if cf.dryRun {
			return usagef("run: --dry-run starts nothing: leave out --detach")
		}
		if len(cf.binaries) > 0 {
			return usagef("run: --binary does not go with --detach yet (a detached job's spec does not carry it): run the job with --no-tui")
		}
		return detachRun(cf, *c, *o, stdout, stderr)
	}
	return runCluster(ctx, cf, *c, *o, stdout, stderr)
}

// runCluster runs a job of 'gptui run': it plans the job on the nodes (the
// inventory's, or this machine as its one node), then (unless --dry-run)
// runs it, printing its events.
//
// Every run but a dry one keeps its folder, jobs/<id>/ in the current
// directory, as a detached one does (see package jobdir): its event log,
// summary and control socket, so that 'gptui jobs' lists it, 'gptui
// attach' opens it and 'gptui stop' stops it, while it runs and after.
func runCluster(ctx context.Context, cf clusterFlags, c string, o []string, stdout, stderr io.Writer) error {
	if cf.dryRun {
		return runJob(ctx, cf, c, o, stdout, stderr, jobHooks{})
	}
	if err := checkJob(cf, c, o); err != nil {
		return err
	}
	j, err := newJobDir(cf, c, o)
	if err != nil {
		return fmt.Errorf("run: the job's folder: %w", err)
	}
	var started bool
	err = supervise(ctx, j, &started, stdout, stderr)
	if !started {
		// Its setup failed (said on the terminal), or was interrupted:
		// nothing ran, and nothing stays (a refused job writes nothing in
		// the workdir another job holds).
		os.RemoveAll(j.Dir)
		os.Remove(filepath.Dir(j.Dir)) // jobs/, if that leaves it empty
	}
	return err
}

// jobHooks are what a detached job's supervisor (cmdSupervise) adds to
// runJob: the job's id, a function that each event passes through before
// it is printed (the event log), and one told of the job's supervisor
// once it exists (the control socket's restarts).
type jobHooks struct {
	id      string
	tee     func(event.Event)
	created func(*cluster.Supervisor)
}

// runJob is runCluster with hooks.
func runJob(ctx context.Context, cf clusterFlags, c string, o []string, stdout, stderr io.Writer, h jobHooks) error {
	local := cf.local()
	world := -1 // --hosts: the ranks are checked once the job's size is known
	if local {
		world = cf.nproc
	}
	showSet, err := rankSet(cf.show, world)
	if err != nil {
		return err
	}
	var show func(int) bool // nil: every rank
	if showSet != nil {
		show = func(r int) bool { return showSet[r] }
	}
	cfg, err := loadConfig(c, o)
	if err != nil {
		return err
	}
	for _, n := range cfg.Notes {
		switch {
		case !local:
			fmt.Fprintf(stdout, "[config] %s\n", n)
		case show == nil || show(0):
			// A local job's lines are its ranks': the notes are rank 0's,
			// as when each worker loaded the config itself.
			fmt.Fprintf(stdout, "[0] [config] %s\n", n)
		}
	}
	nodes, hosts := []sshexec.Node{sshexec.LocalNode(cf.nproc)}, sshexec.LocalHosts
	if !local {
		hosts = cf.hosts
		if nodes, err = sshexec.LoadInventory(cf.hosts); err != nil {
			return usageError{fmt.Errorf("run: %w", err)}
		}
		if len(cf.nodes) > 0 {
			nodes = slices.DeleteFunc(nodes, func(n sshexec.Node) bool { return !slices.Contains(cf.nodes, n.Name) })
		}
		if err := cf.checkRestarts(len(nodes)); err != nil {
			return usageError{fmt.Errorf("run: %w", err)}
		}
	}
	opts := cluster.Options{
		Nodes:        nodes,
		Hosts:        hosts,
		Config:       cfg,
		SSH:          sshexec.ClientConfig{AcceptNewHostKeys: cf.acceptNew},
		KeepJobs:     cf.keepJobs,
		AgentTimeout: cf.agentTimeout,
		HangTimeout:  cf.hangTimeout,
		MasterPort:   cf.port,
		DryRun:       cf.dryRun,
		JobID:        h.id,
		Continues:    cf.continues,
		Binaries:     cf.binaries,
		NoStaging:    cf.stageData == "never",
	}
	if cf.rankTable != "" {
		t, err := ranktable.Read(cf.rankTable)
		if err != nil {
			return usageError{fmt.Errorf("run: %w", err)}
		}
		opts.RankTable, opts.RankTableFile = t, cf.rankTable
	}

	start := time.Now()
	job := cluster.NewSupervisor(opts, cf.restarts)
	if h.created != nil {
		h.created(job)
	}
	pr := &printer{out: stdout, err: stderr, local: local, show: show, every: cf.summaryEvery, start: start}
	printed := make(chan struct{})
	go func() {
		defer close(printed)
		events := job.Events()
		if h.tee != nil {
			ch := make(chan event.Event, 256)
			go func() {
				defer close(ch)
				for e := range job.Events() {
					h.tee(e)
					ch <- e
				}
			}()
			events = ch
		}
		pr.consume(events)
	}()
	plan, err := job.Plan(ctx)
	if err != nil {
		job.Close()
		<-printed
		var ie *cluster.InputError
		if errors.As(err, &ie) {
			return usageError{fmt.Errorf("run: %w", err)}
		}
		return fmt.Errorf("run: %w", err)
	}
	if _, err := rankSet(cf.show, plan.World); err != nil {
		job.Close()
		<-printed
		return err
	}
	if cf.dryRun {
		job.Close()
		<-printed
		if err := printPlan(stdout, plan); err != nil {
			return err
		}
		if fs := plan.PreflightFailures(); len(fs) > 0 {
			return usagef("run: pre-flight: %s", strings.Join(fs, "; "))
		}
		return nil
	}
	// An interrupt (ctx) reaches the workers, which save and exit; a
	// second one (hard) kills them.
	if hard := hardContext(ctx); hard != ctx {
		defer context.AfterFunc(hard, job.Stop)()
	}
	if err := job.Start(ctx); err != nil {
		job.Wait()
		<-printed
		return fmt.Errorf("run: %w", err)
	}
	err = job.Wait()
	<-printed
	pr.final(err)
	var f *cluster.Failure
	if errors.As(err, &f) {
		printFailure(stderr, f, local)
		if f.BadInput {
			// The worker said it stopped on bad input (its exit record,
			// not its status alone): so does the job, exit 2.
			return usageError{f}
		}
		return f
	}
	return err
}
