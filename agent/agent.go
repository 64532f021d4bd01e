package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/launch"
	"github.com/gptui/gptui/nvml"
)

// MemoryEvery is how often Run reports each worker's memory.
const MemoryEvery = time.Second

// HeartbeatEvery is how often Run sends a heartbeat event, whatever the
// workers do, so that the launcher can tell a silent agent (a stopped or
// frozen process, a dead network) from a quiet job.
const HeartbeatEvery = time.Second

// ErrLauncherGone is the cause of a job that Run stopped because its
// standard input reached end of file or its events could not be written:
// the launcher closed the connection, or lost it.
var ErrLauncherGone = errors.New("the launcher closed the connection")

// Run starts the spec's workers and reports on them as events written to
// out until they have all exited, then writes a final job event (done,
// failed or stopped) and returns: nil when every worker exited with status
// 0, the *launch.JobError otherwise.
//
// When stdin (which may be nil) reaches end of file, when writing to out
// fails, or when ctx ends, Run stops the workers: SIGTERM to each process
// group, SIGKILL after the spec's grace period. An InterruptLine on stdin
// stops them for an interrupt: SIGTERM, and SIGKILL only after
// launch.DefaultInterruptGrace, so that they can save.
func Run(ctx context.Context, spec *Spec, stdin io.Reader, out *event.Writer) error {
	if err := spec.Check(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	interrupt := make(chan struct{})
	if stdin != nil {
		go func() {
			readStops(stdin, interrupt)
			cancel(ErrLauncherGone)
		}()
	}
	a := &agent{spec: spec, out: out, cancel: cancel, interrupt: interrupt, pids: map[int]int{}, tails: map[int]chan struct{}{}, metricsFrom: map[int]int64{}, exits: map[int]event.Exit{}}
	return a.run(ctx)
}

// agent is one Run.
type agent struct {
	spec      *Spec
	out       *event.Writer
	cancel    context.CancelCauseFunc
	interrupt chan struct{} // closed when the launcher forwards an interrupt

	mu    sync.Mutex
	pids  map[int]int           // rank -> pid (process group) of a running worker
	tails map[int]chan struct{} // rank -> closed to stop tailing its metrics
	// metricsFrom is, by rank, the size of the metrics file before the
	// worker started: where tailing starts. Written before the workers
	// start.
	metricsFrom map[int]int64
	// exits is, by rank, the exit record the worker wrote (ReportExit).
	exits  map[int]event.Exit
	tailWG sync.WaitGroup
}

// emit writes e with the node's name; a failed write means the launcher is
// gone, which stops the job.
func (a *agent) emit(e event.Event) {
	e.Node = a.spec.Node
	if err := a.out.Write(e); err != nil {
		a.cancel(fmt.Errorf("%w (%v)", ErrLauncherGone, err))
	}
}

func (a *agent) workerEvent(rank int, state string) event.Event {
	e := event.New(event.KindWorker)
	e.Rank, e.State = rank, state
	return e
}

func (a *agent) run(ctx context.Context) error {
	spec := a.spec
	workers := make([]launch.Worker, len(spec.Workers))
	devices := map[int]int{} // rank -> device, for GPU workers
	for i, w := range spec.Workers {
		env := append([]string{}, w.Env...)
		env = append(env, ProgressEnv+"=1")
		if w.Device >= 0 {
			devices[w.Rank] = w.Device
			env = append(env, "GPTUI_DEVICE="+strconv.Itoa(w.Device))
		}
		workers[i] = launch.Worker{Rank: w.Rank, LocalRank: w.LocalRank, Args: w.Args, Env: env}
		// The records of an earlier run are not this one's: tailing starts
		// at the file's end. (A resumed run keeps the file, dropping the
		// records past its step, and a new run empties it: both shrink
		// it, and tailMetrics then reads it from the start.)
		if fi, err := os.Stat(a.metricsPath(w.Rank)); err == nil {
			a.metricsFrom[w.Rank] = fi.Size()
		}
	}
	for _, w := range spec.Workers {
		a.emit(a.workerEvent(w.Rank, event.WorkerStarting))
	}
	started := event.New(event.KindJob)
	started.State, started.Message = event.JobStarted, fmt.Sprintf("job %s: %d workers", spec.Job, len(workers))
	a.emit(started)

	beatDone := make(chan struct{})
	defer close(beatDone)
	go a.heartbeat(beatDone)

	memDone := make(chan struct{})
	memStopped := make(chan struct{})
	go func() {
		defer close(memStopped)
		a.sampleMemory(memDone, devices)
	}()

	_, err := launch.Run(ctx, launch.Options{
		Exe:       spec.Exe,
		Workers:   workers,
		Grace:     spec.grace(),
		Interrupt: a.interrupt,
		OnStart:   a.started,
		OnLine: func(rank int, stderr bool, line []byte) {
			if x, ok := parseExit(line); ok && stderr {
				a.mu.Lock()
				a.exits[rank] = x
				a.mu.Unlock()
				return
			}
			if p, ok := parseProgress(line); ok {
				e := event.New(event.KindProgress)
				e.Rank, e.Progress = rank, &p
				a.emit(e)
				return
			}
			if c, ok := parseCheckpoint(line); ok && stderr {
				e := event.New(event.KindCheckpoint)
				e.Rank, e.State, e.Checkpoint = rank, c.State, &c.Checkpoint
				a.emit(e)
				return
			}
			e := event.New(event.KindLog)
			e.Rank, e.Line, e.Stderr = rank, string(line), stderr
			a.emit(e)
		},
		OnExit:   a.exited,
		Finished: a.finished,
	})
	close(memDone)
	<-memStopped
	a.tailWG.Wait()

	end := event.New(event.KindJob)
	var je *launch.JobError
	switch {
	case err == nil:
		end.State = event.JobDone
	case errors.As(err, &je) && je.Cancelled && ctx.Err() == nil:
		end.State, end.Message = event.JobStopped, "interrupted"
	case errors.As(err, &je) && je.Cancelled:
		end.State, end.Message = event.JobStopped, stopReason(ctx)
	case errors.As(err, &je):
		end.State, end.Rank, end.Code, end.Signal, end.Tail = event.JobFailed, je.Rank, je.Code, je.Signal, je.Tail
		end.Message = err.Error()
	default:
		end.State, end.Message = event.JobFailed, err.Error()
	}
	a.emit(end)
	return err
}

// InterruptLine is what the launcher writes on an agent's standard input,
// after the spec, to forward an interrupt: the agent sends SIGTERM to its
// workers ('gptui train' then saves its finished steps and exits) and
// kills them only after launch.DefaultInterruptGrace, or at once if its
// standard input then reaches end of file.
const InterruptLine = "interrupt"

// readStops reads the launcher's lines after the spec until end of file,
// closing interrupt at the first InterruptLine.
func readStops(stdin io.Reader, interrupt chan struct{}) {
	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		if sc.Text() == InterruptLine && interrupt != nil {
			close(interrupt)
			interrupt = nil
		}
	}
}

// stopReason says why ctx ended.
func stopReason(ctx context.Context) string {
	if c := context.Cause(ctx); c != nil {
		return c.Error()
	}
	return "stopped"
}

func (a *agent) metricsPath(rank int) string {
	return event.MetricsFile(a.spec.LogDir, rank)
}

// started is launch's OnStart: it reports the worker running and starts
// tailing its metrics.
func (a *agent) started(w launch.Worker, pid int) {
	e := a.workerEvent(w.Rank, event.WorkerRunning)
	e.Message = "pid " + strconv.Itoa(pid)
	e.Proc = &event.Proc{PID: pid}
	a.emit(e)
	done := make(chan struct{})
	a.mu.Lock()
	a.pids[w.Rank] = pid
	a.tails[w.Rank] = done
	a.mu.Unlock()
	a.tailWG.Add(1)
	go func() {
		defer a.tailWG.Done()
		tailMetrics(a.metricsPath(w.Rank), a.metricsFrom[w.Rank], done, func(m event.Metrics) {
			e := event.New(event.KindMetrics)
			e.Rank, e.Metrics = w.Rank, &m
			a.emit(e)
		})
	}()
}

// exitOf returns the exit record the worker of r wrote, if it then exited
// with the status it announced (a worker killed, or one whose runtime
// died after the record, has none).
func (a *agent) exitOf(r launch.Result) (event.Exit, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	x, ok := a.exits[r.Rank]
	return x, ok && r.Err == nil && r.Signal == "" && x.Code == r.ExitCode
}

// finished is launch's Finished: the worker's exit record says it did
// all its work.
func (a *agent) finished(r launch.Result) bool {
	x, ok := a.exitOf(r)
	return ok && x.Finished
}

// exited is launch's OnExit.
func (a *agent) exited(r launch.Result) {
	a.mu.Lock()
	delete(a.pids, r.Rank)
	if done, ok := a.tails[r.Rank]; ok {
		close(done)
		delete(a.tails, r.Rank)
	}
	a.mu.Unlock()
	x, said := a.exitOf(r)
	e := a.workerEvent(r.Rank, event.WorkerExited)
	switch {
	case r.Stopped:
		// The job's stop ended it: another worker's failure, the
		// launcher's stop or an interrupt, not its own doing.
		e.State = event.WorkerStopped
	case said && x.Finished:
		// Its work is done; what failed after (its logs) is in x.
	case r.ExitCode != 0 || r.Err != nil:
		e.State = event.WorkerFailed
	}
	e.Code, e.Signal = r.ExitCode, r.Signal
	if said {
		e.Exit = &x
	}
	if r.Err != nil {
		e.Message = r.Err.Error()
	}
	a.emit(e)
}

// heartbeat sends a heartbeat event every HeartbeatEvery until done is
// closed.
func (a *agent) heartbeat(done <-chan struct{}) {
	t := time.NewTicker(HeartbeatEvery)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			a.emit(event.New(event.KindHeartbeat))
		}
	}
}

// sampleMemory reports every MemoryEvery, until done is closed, the
// node's health (event.Health: CPU, memory, the workers' resident memory,
// their GPUs' load) and the memory of each running worker: the used memory
// of its GPU (devices maps rank to device) from NVML, or else the resident
// memory of its process group, with the machine's memory as the total;
// with it, the worker's pid and the CPU its process group used since the
// last report (event.Proc).
func (a *agent) sampleMemory(done <-chan struct{}, devices map[int]int) {
	var lib *nvml.Lib
	if len(devices) > 0 {
		if l, err := nvml.Open(); err == nil {
			lib = l
			defer lib.Close()
		}
	}
	total := memTotal()
	var cpu cpuTimes // the last reading, for the node's CPU utilisation
	var gpus []int   // the devices of this node's workers
	for _, d := range devices {
		if !slices.Contains(gpus, d) {
			gpus = append(gpus, d)
		}
	}
	slices.Sort(gpus)
	ticks := map[int]uint64{} // the last reading of each group's CPU time
	last := time.Now()
	t := time.NewTicker(MemoryEvery)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		a.mu.Lock()
		ranks := make(map[int]int, len(a.pids))
		for r, pid := range a.pids {
			ranks[r] = pid
		}
		a.mu.Unlock()
		var groups []int
		for _, pid := range ranks {
			groups = append(groups, pid)
		}
		use := groupUsage(groups)
		now := time.Now()
		secs := now.Sub(last).Seconds()
		last = now
		rss := make(map[int]int64, len(use))
		for g, u := range use {
			rss[g] = u.rss
		}
		he := event.New(event.KindHealth)
		hv := health(&cpu, rss, lib, gpus)
		he.Health = &hv
		a.emit(he)
		for r, pid := range ranks {
			e := event.New(event.KindMemory)
			e.Rank, e.Device = r, -1
			e.Proc = &event.Proc{PID: pid}
			if before, ok := ticks[pid]; ok {
				e.Proc.CPUPercent = cpuPercent(use[pid].ticks, before, secs)
			}
			ticks[pid] = use[pid].ticks
			if d, gpu := devices[r]; gpu && lib != nil {
				used, tot, err := lib.Memory(d)
				if err != nil {
					continue
				}
				e.Device, e.Used, e.Total = d, used, tot
			} else {
				e.Used, e.Total = rss[pid], total
			}
			a.emit(e)
		}
	}
}
