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
// semantics, until every agent's stream has ended.
func (j *Job) supervise(r *runState) {
	p, nodes := j.plan, j.nodes
	running := 0
	for _, ap := range r.procs {
		if ap != nil {
			running++
		}
	}
	var (
		failure   *Failure
		stopCause error
		stopping  bool
		force     <-chan time.Time
		graceful  bool // stopping for an interrupt: the workers are saving
		tails     = map[int][]string{}
		nodeOf    = map[int]string{}
		agentEnd  = make([]string, len(nodes)) // each agent's final job state
		ended     = make([]bool, len(nodes))
		heard     = make([]time.Time, len(nodes)) // each agent's last event
		killed    = make([]bool, len(nodes))      // silent agents killed
		silence   = j.opts.AgentTimeout
	)
	var logErrs []RankLogError // ranks that finished, but whose logs failed
	if silence <= 0 {
		silence = DefaultAgentTimeout
	}
	for i := range heard {
		heard[i] = time.Now()
	}
	rep := newReplicator(j, nodes) // nil without Engine.save_load.replicas > 1
	// Each running rank's last progress report, for the hang diagnosis.
	reports := map[int]*rankProgress{}
	hangBound := j.opts.hangTimeout()
	// Agents send a heartbeat every second: one that has been silent for
	// longer than silence is lost, and so is its node.
	liveness := time.NewTicker(silence / 10)
	defer liveness.Stop()
	for i, np := range p.Nodes {
		for _, w := range np.Spec.Workers {
			nodeOf[w.Rank] = nodes[i].name
		}
	}
	beginStop := func(timeout time.Duration) {
		if stopping {
			return
		}
		stopping = true
		for i, ap := range r.procs {
			if ap != nil && !ended[i] {
				ap.stdin.Close() // the agent stops its workers
			}
		}
		force = time.After(timeout)
	}
	// interrupt forwards an interrupt to the agents, whose workers save
	// and exit; a stop during it (Stop, a second interrupt) closes their
	// standard input, which kills the workers.
	interrupt := func() {
		if stopping {
			return
		}
		stopping, graceful = true, true
		for i, ap := range r.procs {
			if ap != nil && !ended[i] {
				if _, err := io.WriteString(ap.stdin, agent.InterruptLine+"\n"); err != nil {
					ap.stdin.Close()
				}
			}
		}
		force = time.After(InterruptTimeout)
	}
	if running == 0 {
		stopping = true
	}
	for running > 0 {
		select {
		case cause := <-r.intr:
			if failure == nil && stopCause == nil {
				stopCause = cause
			}
			interrupt()
		case cause := <-r.stop:
			if failure == nil && stopCause == nil {
				stopCause = cause
			}
			if graceful {
				graceful, stopping = false, false
			}
			beginStop(CancelTimeout)
		case <-force:
			force = nil
			for i, ap := range r.procs {
				if ap != nil && !ended[i] {
					ap.kill()
				}
			}
		case now := <-liveness.C:
			if h := diagnoseHang(reports, nodeOf, now, hangBound); h != nil && !stopping && failure == nil && stopCause == nil {
				e := event.New(event.KindJob)
				e.State, e.Rank, e.Node, e.Message = event.JobHung, h.rank, nodeOf[h.rank], h.msg
				j.emit(e)
				failure = &Failure{Rank: h.rank, Node: nodeOf[h.rank], Code: -1, Hung: true, Msg: h.msg}
				beginStop(StopTimeout)
			}
			for i, ap := range r.procs {
				if ap == nil || ended[i] || killed[i] || now.Sub(heard[i]) <= silence {
					continue
				}
				killed[i] = true
				if stopping {
					// Stopping already: don't wait for the silent agent.
					ap.kill()
					continue
				}
				why := fmt.Sprintf("its agent has been silent for %.0f s (no heartbeat; the agent is stopped, frozen or cut off)", now.Sub(heard[i]).Seconds())
				j.nodeEvent(nodes[i].name, event.NodeLost, why)
				if failure == nil && stopCause == nil {
					failure = &Failure{Rank: -1, Node: nodes[i].name, Code: -1, Lost: true, Msg: why}
				}
				beginStop(StopTimeout)
				ap.kill()
			}
		case m := <-r.in:
			name := nodes[m.node].name
			heard[m.node] = time.Now()
			if m.end {
				running--
				ended[m.node] = true
				if agentEnd[m.node] == "" && !stopping {
					// The stream ended without the agent's last word: the
					// node, its agent or the connection is gone.
					why := "the agent's connection closed"
					if m.err != nil {
						why = m.err.Error()
					}
					j.nodeEvent(name, event.NodeLost, why)
					if failure == nil && stopCause == nil {
						failure = &Failure{Rank: -1, Node: name, Code: -1, Lost: true, Msg: why, Tail: m.stderr}
					}
					beginStop(StopTimeout)
				}
				continue
			}
			e := m.ev
			e.Node = name
			switch e.Kind {
			case event.KindHeartbeat:
				continue
			case event.KindJob:
				// The agent's view of its part; the job's events are the
				// launcher's.
				if e.State != event.JobStarted {
					agentEnd[m.node] = e.State
				}
				continue
			case event.KindCheckpoint:
				if e.State == event.CheckpointSaved {
					rep.saved(m.node)
				}
			case event.KindLog:
				t := append(tails[e.Rank], e.Line)
				if len(t) > tailLines {
					t = t[len(t)-tailLines:]
				}
				tails[e.Rank] = t
			case event.KindProgress:
				if e.Progress != nil && e.Rank >= 0 {
					reports[e.Rank] = &rankProgress{heard: time.Now(), p: *e.Progress}
				}
			case event.KindWorker:
				if e.State == event.WorkerExited || e.State == event.WorkerFailed || e.State == event.WorkerStopped {
					delete(reports, e.Rank)
				}
				if e.State == event.WorkerFailed && failure == nil && stopCause == nil && !stopping {
					failure = &Failure{Rank: e.Rank, Node: name, Code: e.Code, Signal: e.Signal, BadInput: e.Exit != nil && e.Exit.BadInput}
					beginStop(StopTimeout)
				}
				if x := e.Exit; e.State == event.WorkerExited && x != nil && x.Finished && x.Error != "" {
					logErrs = append(logErrs, RankLogError{Rank: e.Rank, Node: name, Msg: x.Error})
				}
			}
			j.emit(e)
		}
	}

	// A failed or stopped job's copy in flight is abandoned: the next
	// attempt's sync copies what it needs.
	rep.close(failure != nil || stopCause != nil)
	end := event.New(event.KindJob)
	switch {
	case failure != nil:
		if !failure.Lost {
			failure.Tail = append([]string(nil), tails[failure.Rank]...)
		}
		r.err = failure
		end.State, end.Rank, end.Node, end.Code, end.Signal, end.Tail = event.JobFailed, failure.Rank, failure.Node, failure.Code, failure.Signal, failure.Tail
		end.Message = failure.Error()
	case stopCause != nil:
		r.err = fmt.Errorf("cluster: job stopped: %w", stopCause)
		end.State, end.Message = event.JobStopped, stopCause.Error()
	default:
		for i, s := range agentEnd {
			if s != event.JobDone {
				r.err = fmt.Errorf("cluster: node %s ended its part %q", nodes[i].name, s)
			}
		}
		end.State = event.JobDone
		if r.err != nil {
			end.State, end.Message = event.JobFailed, r.err.Error()
		} else {
			// Finished, whatever its logs' disk said: reported, not
			// failed (nor restarted).
			if len(logErrs) > 0 {
				le := &LogError{Ranks: logErrs}
				r.err, end.Message = le, le.Error()
			}
			j.pruneJobs(nodes)
		}
	}
	j.emit(end)
	j.lingerLocks(nodes, failure)
	for _, n := range nodes {
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
			j.nodeEvent(n.name, event.NodePruned, fmt.Sprintf("removed %d old %s (jobs/%s), keeping the newest %d", len(old), plural(len(old), "job"), strings.Join(old, ", jobs/"), keep))
		}
		return err
	})
}

func plural(n int, w string) string {
	if n == 1 {
		return w
	}
	return w + "s"
}
