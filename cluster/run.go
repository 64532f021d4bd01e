package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gptui/gptui/agent"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/sshexec"
	"github.com/gptui/gptui/units"
)

// tailLines is how many lines of each rank's output the launcher keeps
// for the failure report.
const tailLines = 20

// runState is a started job.
type runState struct {
	procs []*agentProc // by node; nil where the agent did not start
	in    chan msg     // from the node readers to the supervisor
	stop  chan error   // stop requests: the reason
	intr  chan error   // interrupt requests (Start's context ended): the reason
	done  chan struct{}
	err   error // the job's outcome, set before done is closed
}

// msg is what a node reader passes to the supervisor: an event, or the end
// of the node's stream.
type msg struct {
	node   int
	ev     event.Event
	end    bool
	err    error    // why the stream ended, for end
	stderr []string // the agent's last lines of standard error, for end
}

// ErrStopped is the cause of a job stopped by Stop.
var ErrStopped = errors.New("cluster: job stopped")

// Start starts the planned job: one agent per node. Cancelling ctx stops
// the job, as Stop does. The outcome comes from Wait, and as the last
// event on Events.
func (j *Job) Start(ctx context.Context) error {
	j.mu.Lock()
	if j.plan == nil || j.started || j.closed {
		j.mu.Unlock()
		return errors.New("cluster: Start needs a planned job that has not started")
	}
	j.started = true
	p, nodes := j.plan, j.nodes
	r := &runState{
		procs: make([]*agentProc, len(nodes)),
		in:    make(chan msg, 256),
		stop:  make(chan error, 1),
		intr:  make(chan error, 1),
		done:  make(chan struct{}),
	}
	j.run = r
	j.mu.Unlock()

	var startErr error
	for i, n := range nodes {
		line, err := specLine(&p.Nodes[i].Spec)
		if err == nil {
			var ap *agentProc
			if ap, err = n.startAgent(ctx); err == nil {
				r.procs[i] = ap
				if _, werr := ap.stdin.Write(line); werr != nil {
					err = fmt.Errorf("sending the job spec: %w", werr)
				}
			}
		}
		if err != nil {
			startErr = fmt.Errorf("node %s: starting the agent: %w", n.name, err)
			j.nodeEvent(n.name, event.NodeFailed, startErr.Error())
			break
		}
	}
	for i, ap := range r.procs {
		if ap != nil {
			go read(i, ap, r.in)
		}
	}
	if startErr != nil {
		r.stop <- startErr
	} else {
		e := event.New(event.KindJob)
		e.State, e.Job = event.JobStarted, p.JobID
		e.Message = fmt.Sprintf("job %s: %d ranks on %d nodes, MASTER_ADDR=%s MASTER_PORT=%d", p.JobID, p.World, len(nodes), p.MasterAddr, p.MasterPort)
		j.emit(e)
		context.AfterFunc(ctx, func() {
			select {
			case r.intr <- context.Cause(ctx):
			default:
			}
		})
	}
	go j.supervise(r)
	return startErr
}

// read passes the agent's events to in, then the end of its stream.
func read(node int, ap *agentProc, in chan<- msg) {
	stderrDone := make(chan []string, 1)
	go func() {
		var tail []string
		sc := bufio.NewScanner(ap.stderr)
		for sc.Scan() {
			tail = append(tail, sc.Text())
			if len(tail) > tailLines {
				tail = tail[1:]
			}
		}
		stderrDone <- tail
	}()
	rd := event.NewReader(ap.stdout)
	var err error
	for {
		var e event.Event
		if e, err = rd.Next(); err != nil {
			break
		}
		in <- msg{node: node, ev: e}
	}
	if err == io.EOF {
		err = nil
	} else {
		// A bad stream (another gptui version): stop reading, and the agent.
		ap.kill()
		io.Copy(io.Discard, ap.stdout)
	}
	tail := <-stderrDone
	if werr := ap.wait(); err == nil {
		err = werr
	}
	in <- msg{node: node, end: true, err: err, stderr: tail}
}

// Stop stops the job: every agent stops its workers, and is killed if it
// has not within CancelTimeout; during an interrupt (the end of Start's
// context) it kills the saving workers. Wait then returns an error wrapping
// ErrStopped. Stop does not wait; it may be called more than once.
func (j *Job) Stop() { j.requestStop(ErrStopped) }

func (j *Job) requestStop(cause error) {
	j.mu.Lock()
	r := j.run
	j.mu.Unlock()
	if r == nil {
		return
	}
	select {
	case r.stop <- cause:
	default: // a stop is already pending
	}
}

// Wait waits for the job to end and returns nil if every worker succeeded,
// a *Failure naming the first worker that failed or the node that was
// lost, or an error wrapping the cause of a stop (ctx's error, or
// ErrStopped).
func (j *Job) Wait() error {
	j.mu.Lock()
	r := j.run
	j.mu.Unlock()
	if r == nil {
		return errors.New("cluster: Wait before Start")
	}
	<-r.done
	return r.err
}

// supervise merges the nodes' events into Events and applies the gang
// semantics, until every agent's stream has ended: a loop that hands each
// thing that can happen to a handler of the gang's state.
func (j *Job) supervise(r *runState) {
	g := newGang(j, r)
	// Agents send a heartbeat every second: one that has been silent for
	// longer than g.silence is lost, and so is its node.
	liveness := time.NewTicker(g.silence / 10)
	defer liveness.Stop()
	for g.running > 0 {
		select {
		case cause := <-r.intr:
			g.onInterrupt(cause)
		case cause := <-r.stop:
			g.onStop(cause)
		case <-g.force:
			g.onForce()
		case now := <-liveness.C:
			g.onTick(now)
		case <-g.pendingC:
			g.adoptPending()
		case m := <-r.in:
			g.onMessage(m)
		}
	}
	g.end()
}

// gang is the state of a job's supervision: which agents run, how the job
// is ending (a failure, a stop's cause, an interrupt's save), and what the
// end will report.
type gang struct {
	j *Job
	r *runState

	running int      // agents whose streams go on
	failure *Failure // the first failure, if any
	// pending is a worker's failure held for causeWindow before it is
	// the job's (pendingC fires then): a node lost meanwhile is the cause.
	pending   *Failure
	pendingC  <-chan time.Time
	stopCause error // why the job was stopped, if it was
	stopping  bool  // the agents were told to stop
	graceful  bool  // stopping for an interrupt: the workers are saving
	force     <-chan time.Time

	tails    map[int][]string // each rank's last log lines
	nodeOf   map[int]string   // each rank's node
	agentEnd []string         // each agent's final job state
	ended    []bool           // each agent's stream has ended
	heard    []time.Time      // each agent's last event
	killed   []bool           // silent agents killed
	silence  time.Duration    // how long an agent may be silent with nothing to show its ranks alive
	// quiet holds, for each agent silent past agentQuiet, what shows its
	// node's ranks alive (see onTick); nil for an agent that answers.
	quiet   []*quietAgent
	logErrs []RankLogError // ranks that finished, but whose logs failed

	rep       *replicator           // nil without Engine.save_load.replicas > 1
	saved     bool                  // a checkpoint was saved
	reports   map[int]*rankProgress // each running rank's last progress report, for the hang diagnosis
	hangBound time.Duration
}

func newGang(j *Job, r *runState) *gang {
	n := len(j.nodes)
	g := &gang{j: j, r: r, tails: map[int][]string{}, nodeOf: map[int]string{},
		agentEnd: make([]string, n), ended: make([]bool, n), heard: make([]time.Time, n), killed: make([]bool, n), quiet: make([]*quietAgent, n),
		silence: j.opts.AgentTimeout, rep: newReplicator(j, j.nodes), reports: map[int]*rankProgress{}, hangBound: j.opts.hangTimeout()}
	if g.silence <= 0 {
		g.silence = DefaultAgentTimeout
	}
	for _, ap := range r.procs {
		if ap != nil {
			g.running++
		}
	}
	for i := range g.heard {
		g.heard[i] = time.Now()
	}
	for i, np := range j.plan.Nodes {
		for _, w := range np.Spec.Workers {
			g.nodeOf[w.Rank] = j.nodes[i].name
		}
	}
	if g.running == 0 {
		g.stopping = true
	}
	return g
}

// causeWindow is how long a worker's failure is held before it is the
// job's: a node that is lost takes its workers, and the ranks of other
// nodes then fail on their connections to them, which their agents may
// report before the launcher sees the node's stream end. A node lost
// within the window is the cause; a worker's failure is not.
const causeWindow = time.Second

// holdFailure holds f, a worker's failure, for causeWindow unless the job
// already failed, is stopping or holds one.
func (g *gang) holdFailure(f *Failure) {
	if g.failure == nil && g.stopCause == nil && !g.stopping && g.pending == nil {
		g.pending, g.pendingC = f, time.After(causeWindow)
	}
}

// adoptPending makes the held failure the job's, unless another failure
// came first, and stops the job.
func (g *gang) adoptPending() {
	f := g.pending
	g.pending, g.pendingC = nil, nil
	if f == nil {
		return
	}
	g.fail(f)
	g.beginStop(StopTimeout)
}

// stopWith notes cause as the job's end unless a failure or an earlier
// stop is already it. A failure held for causeWindow came first: it is
// the job's.
func (g *gang) stopWith(cause error) {
	if g.pending != nil {
		g.adoptPending()
	}
	if g.failure == nil && g.stopCause == nil {
		g.stopCause = cause
	}
}

// fail notes f as the job's failure unless the job already failed or was
// stopped.
func (g *gang) fail(f *Failure) {
	if g.failure == nil && g.stopCause == nil {
		g.failure = f
	}
}

// beginStop tells every agent to stop its workers (closing its standard
// input) and kills those left after timeout.
func (g *gang) beginStop(timeout time.Duration) {
	if g.stopping {
		return
	}
	g.stopping = true
	for i, ap := range g.r.procs {
		if ap != nil && !g.ended[i] {
			ap.stdin.Close()
		}
	}
	g.force = time.After(timeout)
}

// onInterrupt forwards an interrupt to the agents, whose workers save and
// exit; a stop during it (Stop, a second interrupt) closes their standard
// input, which kills the workers.
func (g *gang) onInterrupt(cause error) {
	g.stopWith(cause)
	if g.stopping {
		return
	}
	g.stopping, g.graceful = true, true
	for i, ap := range g.r.procs {
		if ap != nil && !g.ended[i] {
			if _, err := io.WriteString(ap.stdin, agent.InterruptLine+"\n"); err != nil {
				ap.stdin.Close()
			}
		}
	}
	g.force = time.After(InterruptTimeout)
}

// onStop stops the job (Stop): during an interrupt's save too.
func (g *gang) onStop(cause error) {
	g.stopWith(cause)
	if g.graceful {
		g.graceful, g.stopping = false, false
	}
	g.beginStop(CancelTimeout)
}

// onForce kills the agents a stop's timeout found still running.
func (g *gang) onForce() {
	g.force = nil
	for i, ap := range g.r.procs {
		if ap != nil && !g.ended[i] {
			ap.kill()
		}
	}
}

// onTick diagnoses a hang and finds the agents silent too long, whose
// nodes are lost.
func (g *gang) onTick(now time.Time) {
	j := g.j
	if h := diagnoseHang(g.reports, g.nodeOf, now, g.hangBound); h != nil && !g.stopping && g.failure == nil && g.stopCause == nil && g.pending == nil {
		e := event.New(event.KindJob)
		e.State, e.Rank, e.Node, e.Message = event.JobHung, h.rank, g.nodeOf[h.rank], h.msg
		j.emit(e)
		g.failure = &Failure{Rank: h.rank, Node: g.nodeOf[h.rank], Code: -1, Hung: true, Msg: h.msg}
		g.beginStop(StopTimeout)
	}
	for i, ap := range g.r.procs {
		if ap == nil || g.ended[i] || g.killed[i] || now.Sub(g.heard[i]) <= agentQuiet {
			continue
		}
		q := g.quiet[i]
		if q == nil {
			q = g.agentFellSilent(i)
		}
		if g.trainOn(i, q, now) {
			continue
		}
		g.killed[i] = true
		if g.stopping {
			// Stopping already: don't wait for the silent agent.
			ap.kill()
			continue
		}
		why := fmt.Sprintf("its agent has been silent for %.0f s (no heartbeat; the agent is stopped, frozen or cut off), and nothing has shown its ranks alive for %.0f s", now.Sub(g.heard[i]).Seconds(), now.Sub(q.at).Seconds())
		j.nodeEvent(j.nodes[i].name, event.NodeLost, why)
		g.fail(&Failure{Rank: -1, Node: j.nodes[i].name, Code: -1, Lost: true, Msg: why})
		g.beginStop(StopTimeout)
		ap.kill()
	}
}

// agentQuiet is how long an agent may send nothing (it sends a heartbeat
// every second) before its node is said to have a silent agent.
const agentQuiet = 3 * agent.HeartbeatEvery

// quietAgent is what the launcher knows of the ranks of a node whose
// agent is silent: they have reached at least step, as shown at at (by
// their own last reports, then by the other nodes' ranks, which cannot
// pass them by more than a step: every step's collectives take every
// rank).
type quietAgent struct {
	since    time.Time // the agent's last event
	step     int
	at       time.Time
	trainsOn bool // said so
}

// agentFellSilent notes that node i's agent has been silent past
// agentQuiet: its ranks' reports are stale for the agent, not for the
// ranks (the hang diagnosis then leaves them out of "stuck"), and the
// node is said to have a silent agent.
func (g *gang) agentFellSilent(i int) *quietAgent {
	name := g.j.nodes[i].name
	q := &quietAgent{since: g.heard[i], step: -1, at: g.heard[i]}
	for r, node := range g.nodeOf {
		if rp := g.reports[r]; node == name && rp != nil {
			rp.agentSilent = true
			q.step = max(q.step, rp.p.Step)
		}
	}
	g.quiet[i] = q
	g.j.nodeEvent(name, event.NodeAgentSilent, fmt.Sprintf("its agent has been silent for %.0f s (no heartbeat): its ranks' state is unknown until it answers", time.Since(g.heard[i]).Seconds()))
	return q
}

// trainOn reports whether node i, whose agent is silent (q), is to be
// kept: its agent's silence is within the agent timeout, or the other
// nodes' ranks have shown, within it, that its ranks train on — they
// report a step at least two past the one its ranks were last known at,
// which needs every step's collectives of its ranks in between. It says
// so, once.
func (g *gang) trainOn(i int, q *quietAgent, now time.Time) bool {
	if g.stopping {
		return now.Sub(q.since) <= g.silence
	}
	name := g.j.nodes[i].name
	others := -1
	for r, rp := range g.reports {
		if g.nodeOf[r] != name && !rp.agentSilent && now.Sub(rp.heard) <= g.silence {
			others = max(others, rp.p.Step)
		}
	}
	if q.step >= 0 && others >= q.step+2 {
		q.step, q.at = others-1, now
		if !q.trainsOn {
			q.trainsOn = true
			g.j.nodeEvent(name, event.NodeAgentSilent, fmt.Sprintf("its agent has been silent for %.0f s, but its ranks train on: the other nodes' ranks, which move in step with them, have reached step %d", now.Sub(q.since).Seconds(), others))
		}
	}
	return now.Sub(q.at) <= g.silence
}

// onMessage takes an agent's event, or the end of its stream: a stream
// that ends without the agent's last word means its node is lost. Events
// pass on to Events but heartbeats and the agents' own job events.
func (g *gang) onMessage(m msg) {
	j := g.j
	name := j.nodes[m.node].name
	g.heard[m.node] = time.Now()
	if q := g.quiet[m.node]; q != nil && !m.end {
		g.quiet[m.node] = nil
		for r, node := range g.nodeOf {
			if rp := g.reports[r]; node == name && rp != nil {
				rp.agentSilent = false
			}
		}
		j.nodeEvent(name, event.NodeAgentBack, fmt.Sprintf("its agent answers again, after %.0f s of silence", time.Since(q.since).Seconds()))
	}
	if m.end {
		g.running--
		g.ended[m.node] = true
		if g.agentEnd[m.node] == "" && !g.stopping {
			// The node, its agent or the connection is gone.
			why := "the agent's connection closed"
			if m.err != nil {
				why = m.err.Error()
			}
			j.nodeEvent(name, event.NodeLost, why)
			g.fail(&Failure{Rank: -1, Node: name, Code: -1, Lost: true, Msg: why, Tail: m.stderr})
			g.beginStop(StopTimeout)
		}
		return
	}
	e := m.ev
	e.Node = name
	switch e.Kind {
	case event.KindHeartbeat:
		return
	case event.KindJob:
		// The agent's view of its part; the job's events are the
		// launcher's.
		if e.State != event.JobStarted {
			g.agentEnd[m.node] = e.State
		}
		return
	case event.KindCheckpoint:
		if e.State == event.CheckpointSaved {
			g.saved = true
			if c := e.Checkpoint; c != nil {
				g.rep.saved(m.node, c.Step)
			}
		}
	case event.KindLog:
		t := append(g.tails[e.Rank], e.Line)
		if len(t) > tailLines {
			t = t[len(t)-tailLines:]
		}
		g.tails[e.Rank] = t
	case event.KindProgress:
		if e.Progress != nil && e.Rank >= 0 {
			g.reports[e.Rank] = &rankProgress{heard: time.Now(), p: *e.Progress}
		}
	case event.KindWorker:
		g.onWorker(e, name)
	}
	j.emit(e)
}

// onWorker notes a worker's end: a failure fails the gang, a finished
// worker whose logs failed is noted for the end's report.
func (g *gang) onWorker(e event.Event, node string) {
	if e.State == event.WorkerExited || e.State == event.WorkerFailed || e.State == event.WorkerStopped {
		delete(g.reports, e.Rank)
	}
	if e.State == event.WorkerFailed {
		g.holdFailure(&Failure{Rank: e.Rank, Node: node, Code: e.Code, Signal: e.Signal, BadInput: e.Exit != nil && e.Exit.BadInput})
	}
	if x := e.Exit; e.State == event.WorkerExited && x != nil && x.Finished && x.Error != "" {
		g.logErrs = append(g.logErrs, RankLogError{Rank: e.Rank, Node: node, Msg: x.Error})
	}
}

// end reports how the job ended — failed, stopped or done (with its log
// failures) — sets the run's error, prunes old job folders after success
// and closes the job.
func (g *gang) end() {
	if g.pending != nil {
		g.adoptPending() // every stream ended within the window
	}
	j, r, failure := g.j, g.r, g.failure
	// A failed or stopped job's copy in flight is abandoned: the next
	// attempt's sync copies what it needs.
	g.rep.close(failure != nil || g.stopCause != nil)
	if failure == nil && g.saved && len(j.nodes) > 1 {
		// The newest checkpoint whole on rank 0's node; a failed job's
		// parts stay for its resume to complete.
		ctx, cancel := context.WithTimeout(context.Background(), replicaTimeout)
		if err := j.collectNewest(ctx); err != nil {
			j.nodeEvent(j.nodes[0].name, event.NodePushing, "the newest checkpoint not gathered here whole: "+err.Error())
		}
		cancel()
	}
	end := event.New(event.KindJob)
	switch {
	case failure != nil:
		if !failure.Lost {
			failure.Tail = append([]string(nil), g.tails[failure.Rank]...)
		}
		r.err = failure
		end.State, end.Rank, end.Node, end.Code, end.Signal, end.Tail = event.JobFailed, failure.Rank, failure.Node, failure.Code, failure.Signal, failure.Tail
		end.Message = failure.Error()
	case g.stopCause != nil:
		r.err = fmt.Errorf("cluster: job stopped: %w", g.stopCause)
		end.State, end.Message = event.JobStopped, g.stopCause.Error()
	default:
		for i, s := range g.agentEnd {
			if s != event.JobDone {
				r.err = fmt.Errorf("cluster: node %s ended its part %q", j.nodes[i].name, s)
			}
		}
		end.State = event.JobDone
		if r.err != nil {
			end.State, end.Message = event.JobFailed, r.err.Error()
		} else {
			// Finished, whatever its logs' disk said: reported, not
			// failed (nor restarted).
			if len(g.logErrs) > 0 {
				le := &LogError{Ranks: g.logErrs}
				r.err, end.Message = le, le.Error()
			}
			j.pruneJobs(j.nodes)
		}
	}
	j.emit(end)
	j.lingerLocks(j.nodes, failure)
	for _, n := range j.nodes {
		n.close()
	}
	j.mu.Lock()
	j.closed = true
	j.mu.Unlock()
	close(j.events)
	close(r.done)
}

// pruneTimeout bounds the removal of old job directories after a job.
const pruneTimeout = 30 * time.Second

// pruneJobs removes the old jobs/<id> directories of every node but the
// newest Options.KeepJobs, and says what it did in a NodePruned event per
// node that had any (or failed to).
func (j *Job) pruneJobs(nodes []*node) {
	keep := j.opts.KeepJobs
	if keep < 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), pruneTimeout)
	defer cancel()
	sshexec.ForEach(ctx, len(nodes), j.opts.Parallel, func(ctx context.Context, i int) error {
		n := nodes[i]
		old, err := n.pruneJobs(ctx, keep)
		switch {
		case err != nil:
			j.nodeEvent(n.name, event.NodePruned, "old jobs not removed: "+err.Error())
		case len(old) > 0:
			j.nodeEvent(n.name, event.NodePruned, fmt.Sprintf("removed %d old %s (jobs/%s), keeping the newest %d", len(old), units.Plural(len(old), "job"), strings.Join(old, ", jobs/"), keep))
		}
		return err
	})
}
