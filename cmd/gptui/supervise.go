package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/jobdir"
	"github.com/gptui/gptui/ranktable"
	"github.com/gptui/gptui/sshexec"
)

// specOf is the job spec (jobdir.Spec) of 'gptui run' with these flags,
// config and overrides.
func specOf(cf clusterFlags, c string, o []string) jobdir.Spec {
	s := jobdir.Spec{
		Config: c, Overrides: append([]string(nil), o...),
		RankTable: cf.rankTable, AcceptNewHostKeys: cf.acceptNew, MasterPort: cf.port, KeepJobs: cf.keepJobs,
		AgentTimeout: cf.agentTimeout, HangTimeout: cf.hangTimeout,
		MaxRestarts: cf.restarts.Max, MinNodes: cf.restarts.MinNodes, MaxNodes: cf.restarts.MaxNodes,
		ShowRanks: cf.show, SummaryEvery: cf.summaryEvery, NoStaging: cf.stageData == "never",
	}
	if cf.local() {
		s.Nproc = cf.nproc
	} else {
		s.Hosts = cf.hosts
	}
	return s
}

// flagsOf is the inverse of specOf: the flags, config and overrides of a
// job spec.
func flagsOf(s jobdir.Spec) (clusterFlags, string, []string) {
	cf := clusterFlags{
		hosts: s.Hosts, nodes: s.Nodes, continues: s.Continues, rankTable: s.RankTable, nproc: max(s.Nproc, 1), port: s.MasterPort,
		acceptNew: s.AcceptNewHostKeys, show: s.ShowRanks, summaryEvery: s.SummaryEvery,
		keepJobs: s.KeepJobs, agentTimeout: s.AgentTimeout, hangTimeout: s.HangTimeout,
		restarts: cluster.Restarts{Max: s.MaxRestarts, MinNodes: s.MinNodes, MaxNodes: s.MaxNodes},
	}
	if s.NoStaging {
		cf.stageData = "never"
	}
	if cf.show == "" {
		cf.show = "0"
	}
	if cf.summaryEvery <= 0 {
		cf.summaryEvery = 10 * time.Second
	}
	if cf.keepJobs == 0 {
		cf.keepJobs = cluster.DefaultKeepJobs
	}
	o := append([]string(nil), s.Overrides...)
	if s.Resume {
		o = append(o, "Engine.save_load.ckpt_dir=auto")
	}
	return cf, s.Config, o
}

// checkJob checks what a job of 'gptui run' would refuse at once, before
// anything is written: the config, the inventory, the restart policy,
// --show-ranks and the rank table. Its errors are usage errors.
func checkJob(cf clusterFlags, c string, o []string) error {
	cfg, err := loadConfig(c, o)
	if err != nil {
		return err
	}
	world := -1 // not known before the nodes are probed
	if cf.local() {
		world = cf.nproc
	} else {
		nodes, err := sshexec.LoadInventory(cf.hosts)
		if err != nil {
			return usageError{fmt.Errorf("run: %w", err)}
		}
		if err := cf.checkRestarts(len(nodes)); err != nil {
			return usageError{fmt.Errorf("run: %w", err)}
		}
		world = inventoryWorld(nodes, cf.nodes)
	}
	if _, err := rankSet(cf.show, world); err != nil {
		return err
	}
	if cf.rankTable != "" {
		t, err := ranktable.Read(cf.rankTable)
		if err != nil {
			return usageError{fmt.Errorf("run: %w", err)}
		}
		world = t.RankSize()
	}
	// The degrees against the ranks: what every worker would refuse at
	// its start, refused here before a worker (or a detached supervisor)
	// is started. Distributed.auto chooses the degrees for the world.
	if world > 0 && !cfg.Distributed.Auto {
		if _, err := engine.StartupMemory(cfg, 0, world); err != nil {
			return usageError{fmt.Errorf("run: %w", err)}
		}
	}
	return nil
}

// inventoryWorld is the number of workers the inventory's nodes (those
// named in only, or all) run when every one of them gives its devices, or
// -1 when one leaves them to its probe.
func inventoryWorld(nodes []sshexec.Node, only []string) int {
	world := 0
	for _, n := range nodes {
		if len(only) > 0 && !slices.Contains(only, n.Name) {
			continue
		}
		if n.Devices.Count() == 0 {
			return -1
		}
		world += n.Devices.Count()
	}
	return world
}

// newJobDir makes the folder of a new job of 'gptui run' in the current
// directory (jobs/<id>/) and returns it as read back.
func newJobDir(cf clusterFlags, c string, o []string) (*jobdir.Job, error) {
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	spec := specOf(cf, c, o)
	spec.ID, spec.Dir = jobdir.NewID(), wd
	dir, err := jobdir.Create(wd, spec)
	if err != nil {
		return nil, err
	}
	return jobdir.Read(dir)
}

// detachRun starts the job of 'gptui run --detach': it checks what a run
// in the foreground would refuse at once (checkJob), makes the job's
// folder, starts its supervisor detached from this terminal, prints the
// job's id and returns.
func detachRun(cf clusterFlags, c string, o []string, stdout, stderr io.Writer) error {
	if err := checkJob(cf, c, o); err != nil {
		return err
	}
	j, err := newJobDir(cf, c, o)
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	sup, err := jobdir.Launch(j.Dir, "")
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	fmt.Fprintln(stdout, j.ID)
	fmt.Fprintf(stderr, "gptui: job %s runs detached (its supervisor: pid %d); 'gptui attach %s' shows it, 'gptui stop %s' stops it; its output: %s\n",
		j.ID, sup.PID, j.ID, j.ID, filepath.Join(jobdir.Path(".", j.ID), jobdir.OutputFile))
	return nil
}

// errStopRequested is why a job stopped through its control socket.
var errStopRequested = errors.New("stopped on request (gptui stop, or the UI's s)")

// cmdSupervise implements 'gptui __supervise DIR' (jobdir.SuperviseCommand):
// the supervisor of the detached job in the folder DIR, which jobdir.Launch
// starts in a session of its own. It runs the job as 'gptui run --no-tui'
// does (supervise) — its printed lines go to DIR/output.log. A hang-up
// never stops it; SIGINT and SIGTERM interrupt the job as they do a
// foreground run.
func cmdSupervise(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) != 1 {
		return usagef("%s DIR: the job's folder", jobdir.SuperviseCommand)
	}
	prev, err := jobdir.Read(args[0])
	if err != nil {
		return usageError{err}
	}
	if prev.Alive {
		return fmt.Errorf("job %s has a supervisor already (pid %d)", prev.ID, prev.Supervisor.PID)
	}
	signal.Ignore(syscall.SIGHUP)
	var started bool
	return supervise(ctx, prev, &started, stdout, stderr)
}

// supervise runs the job in its folder, prev.Dir (as prev was read before
// it starts), writing every event to the job's event log and answering its
// control socket — stop (an interrupt: the workers save and exit) and
// restart — and prints its events as 'gptui run --no-tui' does. A job
// of 'gptui run' in the foreground is supervised so too, in the launcher's
// own process.
//
// started is set once the job has started (its setup done).
func supervise(ctx context.Context, prev *jobdir.Job, started *bool, stdout, stderr io.Writer) error {
	dir, spec := prev.Dir, prev.Spec
	cf, c, o := flagsOf(spec)
	// One supervisor per job (jobdir.Claim): held until this returns.
	claim, err := jobdir.SuperviseClaim(dir)
	if err != nil {
		return err
	}
	defer claim.Release()

	// A job whose supervisor ran before (gptui restart of an ended job)
	// goes on in the same log.
	again := prev.Summary.State != ""
	sum := jobdir.NewSummary(0, time.Now())
	if again {
		sum = prev.Summary
	}
	cfg, cfgErr := loadConfig(c, o)
	if cfgErr == nil {
		sum.MaxSteps = cfg.Engine.MaxSteps
	}
	log, err := jobdir.OpenLog(dir, sum)
	if err != nil {
		return err
	}
	defer log.Close()
	ctl, err := jobdir.Listen(dir)
	if err != nil {
		return err
	}
	defer ctl.Close()

	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var (
		mu  sync.Mutex
		sup *cluster.Supervisor
	)
	go ctl.Serve(func(op string) error {
		switch op {
		case jobdir.OpPing:
			return nil
		case jobdir.OpStop:
			stop(errStopRequested)
			return nil
		case jobdir.OpRestart:
			mu.Lock()
			s := sup
			mu.Unlock()
			if s == nil {
				return errors.New("the job is being set up: restart it once it runs")
			}
			return s.Restart()
		}
		return fmt.Errorf("unknown request %q (ping, stop, restart)", op)
	})
	if err := jobdir.WriteSupervisor(dir, jobdir.Self(ctl.Path())); err != nil {
		return err
	}

	var ended, logFailed bool
	tee := func(e event.Event) {
		if err := log.Write(e); err != nil && !logFailed {
			// The job goes on; its views see its events up to here.
			logFailed = true
			fmt.Fprintf(stderr, "gptui: %v\n", err)
		}
		ended = ended || e.Ends()
		*started = *started || e.Kind == event.KindJob && e.State == event.JobStarted
	}
	if again {
		e := event.New(event.KindJob)
		e.State = event.JobRestarting
		e.Restart = &event.Restart{Count: 1, Requested: true, Cause: "restarted after its end (gptui restart)"}
		if ck := sum.Checkpoint; ck != nil {
			e.Restart.Step = ck.Step
		}
		e.Message = e.Restart.String()
		tee(e)
	}
	err = cfgErr
	if err == nil {
		err = runJob(ctx, cf, c, o, stdout, stderr, jobHooks{id: spec.ID, tee: tee, created: func(s *cluster.Supervisor) {
			mu.Lock()
			sup = s
			mu.Unlock()
		}})
	}
	if !ended {
		// It ended before it started (its setup failed, or was stopped):
		// the log says so.
		e := event.New(event.KindJob)
		e.State, e.Message = event.JobFailed, "the job did not start"
		if err != nil {
			e.Message = oneLine(err)
		}
		if ctx.Err() != nil {
			e.State, e.Message = event.JobStopped, context.Cause(ctx).Error()
		}
		tee(e)
	}
	return err
}
