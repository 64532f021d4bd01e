package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/jobdir"
)

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
