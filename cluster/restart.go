package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/jobdir"
	"github.com/gptui/gptui/layout"
	"github.com/gptui/gptui/planner"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/sshexec"
	"github.com/gptui/gptui/units"
)

// Restart tries: at a restart, setting the nodes up is tried PlanTries
// times, RetryDelay apart, before the nodes that failed every try are
// given up (see Restarts.MinNodes).
const (
	PlanTries  = 3
	RetryDelay = time.Second
)

// Restarts is the restart policy of a [Supervisor].
type Restarts struct {
	// Max is how many times the job is restarted after a failure; 0 never.
	Max int
	// MinNodes is the fewest nodes the job goes on with: at a restart, a
	// node that fails to set up PlanTries times is left out and the job
	// re-planned for the nodes left, as long as there are at least
	// MinNodes. 0 means every node (the job never shrinks).
	MinNodes int
	// MaxNodes is how many of the inventory's nodes (the first ones) the
	// job uses; 0 means all. Every restart tries them all again, so a node
	// that was left out and came back is taken in.
	MaxNodes int
}

// Supervisor runs a job and restarts it after a failure, up to
// Restarts.Max times: each attempt is a [Job] made from the same Options,
// resuming from the newest checkpoint the job saved
// (Engine.save_load.ckpt_dir=auto). A worker that fails (a crash: any exit
// status, status 2 of the Go runtime's fatal errors included, or a signal),
// a lost node and a hang restart the job; a worker that said it stopped on
// bad input (Failure.BadInput, from its exit record), a stop (Stop, or the
// end of Start's context), a failure to set the job up and a job that
// finished (its log failures, *LogError, included) do not.
//
// It is used as a Job is: Plan (the first attempt's), then Start and
// Wait, or Close; the caller receives from Events until it is closed.
// Events carries every attempt's events, each restart as a job event
// "restarting" (and "replanned" when the job shrinks or grows) in place
// of the failed attempt's "failed"; the last event is the last attempt's
// end.
type Supervisor struct {
	opts   Options
	policy Restarts
	events chan event.Event

	mu        sync.Mutex
	job       *Job // the current attempt
	fwd       <-chan forwarded
	cancel    context.CancelCauseFunc
	interrupt context.CancelCauseFunc // interrupts the running attempt; nil between attempts
	requests  int                     // restarts asked for (Restart)
	started   bool
	closed    bool
	done      chan struct{}
	err       error
	restarts  int
	saved     int             // the newest step a checkpoint was saved at; -1 none
	run       string          // the training run of the job's checkpoints, once one is saved
	workers   map[string]int  // workers per node name, from the last plan
	strategy  string          // the last attempt's strategy, for messages
	left      map[string]bool // nodes an attempt left out, by name, until they are back
}

// forwarded is what forward found in one attempt's events.
type forwarded struct {
	end    *event.Event // the attempt's last job event, held back
	failed []nodeError  // nodes that failed to set up
	saved  int          // the newest checkpoint step saved; -1 none
	run    string       // the run that saved it
}

type nodeError struct{ name, msg string }

// NewSupervisor returns a supervisor of the job opts describes, with the
// restart policy p. Nothing happens until Plan.
func NewSupervisor(opts Options, p Restarts) *Supervisor {
	if opts.JobID == "" {
		opts.JobID = jobdir.NewID()
	}
	opts.lockOwner, opts.lockStarted = lockOwner(opts), time.Now() // every attempt's locks are the job's
	return &Supervisor{opts: opts, policy: p, events: make(chan event.Event, 4096), saved: -1, workers: map[string]int{}, left: map[string]bool{}}
}

// Events returns the events of every attempt. The channel is closed once
// the job has ended (after Start) or has been closed (without Start).
func (s *Supervisor) Events() <-chan event.Event { return s.events }

// nodes returns the inventory's nodes the job may use.
func (s *Supervisor) nodes() []sshexec.Node {
	n := s.opts.Nodes
	if m := s.policy.MaxNodes; m > 0 && m < len(n) {
		n = n[:m]
	}
	return n
}

// Plan plans the first attempt on every node (up to MaxNodes), as
// [Job.Plan] does.
func (s *Supervisor) Plan(ctx context.Context) (*Plan, error) {
	if r, n := s.opts.Config.Engine.SaveLoad.Replicas, len(s.nodes()); r > n && s.opts.Continues != "" {
		// A failed job resumed on the nodes left (the UI's drop) keeps
		// as many copies as they can hold, as an elastic restart does.
		c := *s.opts.Config
		c.Engine.SaveLoad.Replicas = n
		s.opts.Config = &c
	} else if r > n {
		return nil, inputErrorf("Engine.save_load.replicas: %d, but the job has %d %s: want 1 to %d (each checkpoint on that many nodes)", r, n, units.Plural(n, "node"), n)
	}
	j := s.attempt(s.nodes(), s.opts.Config, 0)
	p, err := j.Plan(ctx)
	if err == nil {
		s.remember(p)
		return p, nil
	}
	var ie *InputError
	if s.policy.MinNodes <= 0 || errors.As(err, &ie) || ctx.Err() != nil {
		return p, err
	}
	// With --min-nodes the job may start on fewer nodes, as a restart
	// goes on without the nodes it cannot reach (a node lost while the
	// job was down: `--resume --min-nodes K` on the nodes left).
	j.Close()
	f := <-s.fwd
	nodes := s.nodes()
	left, gone := leaveOut(nodes, f.failed)
	if len(gone) == 0 || len(left) < s.policy.MinNodes {
		return nil, err
	}
	for _, g := range gone {
		s.left[g.name] = true
	}
	cfg, how, cerr := s.configFor(left)
	if cerr != nil {
		return nil, errors.Join(err, cerr)
	}
	if r := cfg.Engine.SaveLoad.Replicas; r > len(left) {
		cfg.Engine.SaveLoad.Replicas = len(left) // as many copies as the nodes left hold
	}
	e := event.New(event.KindJob)
	e.State, e.Message = event.JobReplanned, unreachableMessage(gone, len(left), how)
	s.events <- e
	j = s.attempt(left, cfg, 0)
	if p, err = j.Plan(ctx); err == nil {
		s.remember(p)
	}
	return p, err
}

// leaveOut splits nodes into those left and those that failed, as failed
// names them.
func leaveOut(nodes []sshexec.Node, failed []nodeError) (left []sshexec.Node, gone []nodeError) {
	names := nodeNames(nodes)
	for i, n := range nodes {
		k := slices.IndexFunc(failed, func(ne nodeError) bool { return ne.name == names[i] })
		if k < 0 {
			left = append(left, n)
		} else {
			gone = append(gone, failed[k])
		}
	}
	return left, gone
}

// unreachableMessage says which nodes are left out and why, how many are
// left, and how the job was re-planned for them.
func unreachableMessage(gone []nodeError, left int, how string) string {
	var names, whys []string
	for _, g := range gone {
		names = append(names, g.name)
		whys = append(whys, g.msg)
	}
	n := fmt.Sprintf("%d nodes left", left)
	if left == 1 {
		n = "1 node left"
	}
	msg := fmt.Sprintf("%s unreachable (%s): %s", strings.Join(names, ", "), strings.Join(whys, "; "), n)
	if how != "" {
		msg += ", " + how
	}
	return msg
}

// attempt makes a job of nodes and cfg and forwards its events.
func (s *Supervisor) attempt(nodes []sshexec.Node, cfg *presets.Config, n int) *Job {
	o := s.opts
	o.Nodes, o.Config = nodes, cfg
	if n > 0 {
		o.JobID = s.opts.JobID + "-r" + strconv.Itoa(n)
	}
	o.lockLinger = n < s.policy.Max
	j := New(o)
	fwd := s.forward(j)
	s.mu.Lock()
	s.job, s.fwd = j, fwd
	s.mu.Unlock()
	return j
}

// remember notes the workers of each node of a plan, and its strategy.
func (s *Supervisor) remember(p *Plan) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, np := range p.Nodes {
		s.workers[np.Name] = len(np.Spec.Workers)
	}
}

// forward passes j's events on, except its last job event, and notes the
// nodes that failed and the checkpoints saved.
func (s *Supervisor) forward(j *Job) <-chan forwarded {
	ch := make(chan forwarded, 1)
	go func() {
		f := forwarded{saved: -1}
		for e := range j.Events() {
			switch {
			case e.Ends():
				end := e
				f.end = &end
				continue
			case e.Kind == event.KindJob && e.State == event.JobStarted:
				e.Job = s.opts.JobID // the job's, of every attempt (Message names the attempt's)
			case e.Kind == event.KindNode && e.State == event.NodeFailed:
				f.failed = append(f.failed, nodeError{e.Node, e.Message})
			case e.Kind == event.KindCheckpoint && e.State == event.CheckpointSaved && e.Checkpoint != nil:
				if e.Checkpoint.Step >= f.saved {
					f.saved, f.run = e.Checkpoint.Step, cmp.Or(e.Checkpoint.Run, f.run)
				}
			}
			s.events <- e
		}
		ch <- f
	}()
	return ch
}

// Close ends a supervisor that was planned but not started, or stops a
// started one and waits for its end.
func (s *Supervisor) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	started, j, fwd := s.started, s.job, s.fwd
	s.mu.Unlock()
	if started {
		s.Stop()
		_ = s.Wait()
		return nil
	}
	if j != nil {
		j.Close()
		if f := <-fwd; f.end != nil {
			s.events <- *f.end
		}
	}
	close(s.events)
	return nil
}

// Start starts the planned first attempt, and restarts the job after
// each restartable failure until Restarts.Max restarts are spent.
// Cancelling ctx stops the job, as Stop does.
func (s *Supervisor) Start(ctx context.Context) error {
	s.mu.Lock()
	if s.job == nil || s.started || s.closed {
		s.mu.Unlock()
		return errors.New("cluster: Start needs a planned job that has not started")
	}
	s.started = true
	s.done = make(chan struct{})
	ctx, cancel := context.WithCancelCause(ctx)
	s.cancel = cancel
	j, fwd := s.job, s.fwd
	actx := s.attemptContext(ctx)
	s.mu.Unlock()
	err := j.Start(actx)
	go s.loop(ctx, j, fwd)
	return err
}

// attemptContext returns the context of the next attempt, which Restart
// ends. s.mu is held.
func (s *Supervisor) attemptContext(ctx context.Context) context.Context {
	actx, cancel := context.WithCancelCause(ctx)
	s.interrupt = cancel
	return actx
}

// ErrRestartRequested is the cause of an attempt that Restart
// interrupted.
var ErrRestartRequested = errors.New("cluster: restart requested")

// Restart interrupts the running attempt — its workers save their
// finished steps and exit, as at an interrupt — and starts the job again
// from the newest checkpoint, as after a failure, whatever Restarts.Max
// says (a requested restart is not a failure's). It is an error when no
// attempt runs: the job is being set up, restarting, or over.
func (s *Supervisor) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !s.started || s.closed:
		return errors.New("the job is not running")
	case s.interrupt == nil:
		return errors.New("the job is restarting already, or has ended")
	}
	s.interrupt(ErrRestartRequested)
	s.interrupt = nil
	return nil
}

// Stop stops the job, or the restart under way; Wait then returns an
// error wrapping ErrStopped.
//
// A Stop while the workers save after an interrupt (the end of Start's
// context) kills them, as [Job.Stop] does.
func (s *Supervisor) Stop() {
	s.mu.Lock()
	cancel, j := s.cancel, s.job
	s.mu.Unlock()
	if cancel != nil {
		cancel(ErrStopped)
	}
	if j != nil {
		j.Stop()
	}
}

// Wait waits for the end of the job, after its last restart, and returns
// the last attempt's outcome as [Job.Wait] does.
func (s *Supervisor) Wait() error {
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	if done == nil {
		return errors.New("cluster: Wait before Start")
	}
	<-done
	return s.err
}

// loop waits for each attempt's end and restarts the job while the
// policy allows.
func (s *Supervisor) loop(ctx context.Context, j *Job, fwd <-chan forwarded) {
	finish := func(err error, end *event.Event) {
		if end != nil {
			s.events <- *end
		}
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		close(s.events)
		close(s.done)
	}
	for {
		err := j.Wait()
		f := <-fwd
		if f.saved > s.saved {
			s.saved, s.run = f.saved, cmp.Or(f.run, s.run)
		}
		s.mu.Lock()
		s.interrupt = nil
		s.mu.Unlock()
		var fail *Failure
		e := event.New(event.KindJob)
		e.State = event.JobRestarting
		switch {
		case errors.Is(err, ErrRestartRequested) && ctx.Err() == nil:
			s.mu.Lock()
			s.requests++
			s.mu.Unlock()
			e.Restart = &event.Restart{Count: s.requests, Requested: true, Cause: "restart requested", Step: max(s.saved, 0)}
		case !errors.As(err, &fail) || fail.BadInput || s.restarts >= s.policy.Max || ctx.Err() != nil:
			finish(err, f.end)
			return
		default:
			s.mu.Lock()
			s.restarts++
			s.mu.Unlock()
			e.Restart = &event.Restart{Count: s.restarts, Max: s.policy.Max, Cause: fail.Error(), Step: max(s.saved, 0)}
		}
		e.Message = e.Restart.String()
		s.events <- e

		nj, p, err := s.replan(ctx)
		if err == nil && p.ResumeStep != e.Restart.Step {
			s.events <- resumedFrom(*e.Restart, p.ResumeStep)
		}
		if err != nil {
			end := event.New(event.KindJob)
			end.State, end.Message = event.JobFailed, err.Error()
			if ctx.Err() != nil {
				err = fmt.Errorf("cluster: job stopped: %w", context.Cause(ctx))
				end.State, end.Message = event.JobStopped, context.Cause(ctx).Error()
			}
			finish(err, &end)
			return
		}
		s.mu.Lock()
		j, fwd = nj, s.fwd
		actx := s.attemptContext(ctx)
		s.mu.Unlock()
		_ = j.Start(actx) // a failure to start is Wait's
	}
}

// resumedFrom is the event that corrects restart r's step where the
// replan resumes from another than the newest saved the restart named
// (the nodes could not all hold it): a JobReplanned event with the
// restart and its true step.
func resumedFrom(r event.Restart, step int) event.Event {
	e := event.New(event.KindJob)
	e.State = event.JobReplanned
	switch {
	case step == 0:
		e.Message = fmt.Sprintf("restarting from the start, not from step %d: no checkpoint can be held by every node", r.Step)
	case step < r.Step:
		e.Message = fmt.Sprintf("resuming from step %d, not %d: no newer checkpoint can be held by every node", step, r.Step)
	default:
		e.Message = fmt.Sprintf("resuming from step %d, the newest checkpoint every node holds", step)
	}
	r.Step = step
	e.Restart = &r
	return e
}

// replan sets the next attempt up: on every node the job may use, trying
// PlanTries times, then without the nodes that failed every try (if at
// least MinNodes are left), re-planned for the ranks left.
func (s *Supervisor) replan(ctx context.Context) (*Job, *Plan, error) {
	nodes := s.nodes()
	var gone []nodeError
	for try := 1; ; try++ {
		cfg, how, err := s.configFor(nodes)
		if err != nil {
			return nil, nil, err
		}
		if how != "" {
			msg := how
			if len(gone) > 0 {
				msg = unreachableMessage(gone, len(nodes), how)
			}
			e := event.New(event.KindJob)
			e.State, e.Message = event.JobReplanned, msg
			s.events <- e
		}
		j := s.attempt(nodes, cfg, s.restarts)
		p, err := j.Plan(ctx)
		if err == nil {
			s.remember(p)
			for _, name := range nodeNames(nodes) {
				if s.left[name] {
					delete(s.left, name)
					e := event.New(event.KindNode)
					e.Node, e.State, e.Message = name, event.NodeBack, "reachable again: the job runs on it from this restart"
					s.events <- e
				}
			}
			return j, p, nil
		}
		j.Close()
		f := <-s.fwd
		var ie *InputError
		if errors.As(err, &ie) || ctx.Err() != nil {
			return nil, nil, err
		}
		if try < PlanTries {
			select {
			case <-ctx.Done():
				return nil, nil, context.Cause(ctx)
			case <-time.After(RetryDelay):
			}
			continue
		}
		min := s.policy.MinNodes
		if min <= 0 {
			min = len(s.nodes())
		}
		var left []sshexec.Node
		left, gone = leaveOut(nodes, f.failed)
		if len(gone) == 0 || len(left) < min {
			return nil, nil, fmt.Errorf("cluster: restart %d: %w (%d tries; %d node(s) would be left, --min-nodes %d)", s.restarts, err, PlanTries, len(left), min)
		}
		for _, g := range gone {
			s.left[g.name] = true
		}
		nodes, try = left, 0
	}
}

// configFor returns the config of the next attempt on nodes: the job's,
// resuming from the newest checkpoint it saved, and re-planned if nodes
// hold another number of ranks than the job's config is for. how says
// how it was re-planned, when the strategy changed since the last
// attempt.
func (s *Supervisor) configFor(nodes []sshexec.Node) (*presets.Config, string, error) {
	orig := s.opts.Config
	c := *orig
	if s.saved > 0 {
		// From the job's own checkpoints: not another run's in the
		// same output_dir.
		c.Engine.SaveLoad.CkptDir = "auto"
		c.Engine.SaveLoad.Run = cmp.Or(s.run, c.Engine.SaveLoad.Run)
	}
	if s.restarts > 0 {
		// The first attempt found the output_dir free of other runs'
		// checkpoints (or was forced): what a restart from step 0 finds
		// there is its own attempts' (a save it never heard of).
		c.Engine.SaveLoad.Force = true
	}
	ranks := 0
	names := nodeNames(nodes)
	s.mu.Lock()
	for i, n := range nodes {
		w := s.workers[names[i]]
		switch {
		case w > 0:
		case n.Devices.CPU > 0:
			w = n.Devices.CPU
		case len(n.Devices.IDs) > 0:
			w = len(n.Devices.IDs)
		default:
			w = 1
		}
		ranks += w
	}
	s.mu.Unlock()
	was := s.strategy
	if was == "" {
		was = planner.StrategyOf(orig).String()
	}
	if err := reshape(&c, ranks); err != nil {
		return nil, "", fmt.Errorf("cluster: cannot re-plan for %d rank(s) on %d node(s): %w", ranks, len(nodes), err)
	}
	now := planner.StrategyOf(&c).String()
	s.strategy = now
	if now == was {
		return &c, "", nil
	}
	g := c.Global
	return &c, fmt.Sprintf("re-planned %s → %s, accumulate %d (global batch %d kept)", was, now, g.LocalBatchSize/g.MicroBatchSize, g.GlobalBatchSize), nil
}

// reshape sets c's data-parallel degree, sharding degree and batch sizes
// for ranks ranks, keeping the global batch (by gradient accumulation),
// the tensor, context and pipeline degrees and, where they still divide,
// the sharding degree and the micro-batch size.
func reshape(c *presets.Config, ranks int) error {
	d, g := &c.Distributed, &c.Global
	mp, pp, cp := max(d.MPDegree, 1), max(d.PPDegree, 1), max(d.CPDegree, 1)
	if ranks%(mp*pp*cp) != 0 {
		if cp > 1 {
			return fmt.Errorf("mp %d × pp %d × cp %d does not divide them", mp, pp, cp)
		}
		return fmt.Errorf("mp %d × pp %d does not divide them", mp, pp)
	}
	replicas := ranks / (mp * pp * cp)
	sh := max(d.Sharding.ShardingDegree, 1)
	if replicas%sh != 0 {
		sh = gcd(sh, replicas)
	}
	d.Sharding.ShardingDegree, d.DPDegree = sh, replicas/sh
	if sh == 1 {
		d.Sharding.ShardingStage = 1
	}
	if p := layout.Check(c.Shape(), c.Layout(), layout.Batch{Global: g.GlobalBatchSize}); p != nil {
		return errors.New(p.Msg)
	}
	g.LocalBatchSize = g.GlobalBatchSize / replicas
	if g.MicroBatchSize <= 0 || g.LocalBatchSize%g.MicroBatchSize != 0 {
		g.MicroBatchSize = gcd(max(g.MicroBatchSize, 1), g.LocalBatchSize)
	}
	if p := layout.Check(c.Shape(), c.Layout(), c.Batch()); p != nil {
		return p
	}
	return nil
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
