// Package cluster runs a training job on the nodes of an SSH host
// inventory, or on this machine as a node of its own: the launcher side of
// `gptui run` (--hosts FILE or --nproc N) and of the terminal UI.
//
// A [Job] goes through two phases. [Job.Plan] connects to every node (one
// SSH connection per node, reused for everything after; a local node runs
// its commands without SSH), asks each SSH node its platform (`uname -sm`,
// in the first command run there; a node the executable is not built for
// gets Options.Binaries' for its platform, or refuses the job), pushes
// the gptui executable and the resolved config to the node's workdir
// (skipped when the remote SHA-256 matches; the executable, and each
// staged data file of 1 MiB or more, goes from this machine to one node
// only and spreads
// from node to node as a tree, each node with a verified copy serving the
// next ones over TCP with a per-transfer token, this machine the fallback
// for a relay that fails: see distribute.go), taking the workdir's lock
// for the job in between (one job per workdir:
// a workdir another job holds refuses the job before the push, naming it;
// see package agent's HoldLock), probes the node with `gptui agent
// --probe`, checks that the config's data paths exist there (on an SSH
// node: a local node's workers report a missing path themselves) and
// copies there those it lacks from this machine (stage.go), builds
// the rank table (or maps a given one onto the nodes), and picks
// MASTER_ADDR and MASTER_PORT (Options.MasterPort if given), then runs
// every node's pre-flight at once (`gptui agent --preflight`, package
// agent's RunPreflight: the master's port and each peer's reached, the
// interface toward the master, which becomes the workers'
// NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME unless set, /dev/shm, ulimit
// -l and -n, the disk for the checkpoints, the GPUs, the CUDA libraries,
// the clock), whose failed checks refuse the job. The resulting [Plan]
// is what --dry-run shows. [Job.Start] then
// starts one agent per node (`gptui agent`, package agent), which starts
// that node's workers, and merges the agents' event streams into one.
//
// Everything the job does is reported on [Job.Events], as events of
// package event: the node events of the setup (connecting, pushing,
// locked, probed, ready, failed), each node's preflight event, and the
// node events of the run (lost), the agents' worker, log,
// metrics and memory events, and the job events (started, and one of
// done, failed, stopped at the end). A front end (the headless printer,
// the terminal UI) renders that stream and nothing else.
//
// The job is a gang: when a worker fails or a node is lost, the launcher
// stops every agent (closing its standard input, on which the agent stops
// its workers) and, if one has not finished within StopTimeout, kills it,
// which kills its workers. Calling Stop does the same within CancelTimeout.
// Cancelling the context given to Start is an interrupt: the launcher
// writes agent.InterruptLine to every agent, whose workers save their
// finished steps and exit (within InterruptTimeout); Stop during it
// kills them.
//
// A [Supervisor] runs a job as a series of such gangs: after a failure it
// starts a new Job from the same Options, resuming from the newest
// checkpoint, up to a number of restarts, and re-plans it for fewer nodes
// when some stay unreachable (see [Restarts]).
package cluster

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/gptui/gptui/badinput"

	"github.com/gptui/gptui/agent"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/jobdir"
	"github.com/gptui/gptui/launch"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/ranktable"
	"github.com/gptui/gptui/sshexec"
)

// Timeouts of a job's stop.
const (
	// StopTimeout is how long agents have to stop their workers after a
	// failure before the launcher kills them.
	StopTimeout = 6 * time.Second
	// CancelTimeout is the same after Stop.
	CancelTimeout = 3 * time.Second
	// InterruptTimeout is the same after the end of Start's context (an
	// interrupt), which the agents forward to their workers as SIGTERM:
	// the workers save their finished steps and exit, and are killed
	// after launch.DefaultInterruptGrace.
	InterruptTimeout = launch.DefaultInterruptGrace + 10*time.Second
	// KeepAlive is the SSH keepalive interval: a node whose connection
	// stops answering is lost after three intervals.
	KeepAlive = 2 * time.Second
	// DefaultAgentTimeout is how long an agent may be silent before its
	// node is lost, unless Options.AgentTimeout says otherwise.
	DefaultAgentTimeout = 10 * time.Second
)

// DefaultParallel is how many nodes Plan sets up at once unless
// Options.Parallel says otherwise.
const DefaultParallel = 32

// DefaultKeepJobs is how many jobs/<id> directories each node keeps after
// a successful job unless Options.KeepJobs says otherwise.
const DefaultKeepJobs = 5

// Options describe a job.
type Options struct {
	// Nodes are the inventory's nodes, in rank order.
	Nodes []sshexec.Node
	// Hosts is the inventory's file name, for messages.
	Hosts string
	// Config is the resolved config every worker trains with.
	Config *presets.Config
	// RankTable, if set, gives the ranks and devices instead of the
	// inventory and probes; RankTableFile names it in messages.
	RankTable     *ranktable.Table
	RankTableFile string
	// Exe is the gptui executable pushed to the nodes (and run on a local
	// node); empty means os.Executable(). A node of another platform
	// (its `uname -sm`, against the platform Exe's header names) gets
	// Binaries' file for its platform instead, or is refused.
	Exe string
	// Binaries maps a platform, "GOOS/GOARCH" as in "linux/arm64", to the
	// gptui executable pushed to the nodes of that platform (and run on
	// a local node of it) in place of Exe: `gptui run --binary`.
	Binaries map[string]string
	// SSH configures the connections; each node's user and identity from
	// the inventory take precedence. A zero KeepAlive means KeepAlive.
	SSH sshexec.ClientConfig
	// Env holds KEY=value entries for every worker, after the GPTUI_* and
	// NCCL_* variables of the launcher's environment, which are passed on
	// too.
	Env []string
	// Parallel bounds how many nodes are set up at once; 0 means
	// DefaultParallel.
	Parallel int
	// JobID names the job (its config goes to <workdir>/jobs/<JobID>/);
	// empty means one made of the time and random digits.
	JobID string
	// KeepJobs is how many jobs/<id> directories each node keeps after a
	// successful job: the newest, this job's included. Only directories
	// named like the job ids New makes are removed. 0 means
	// DefaultKeepJobs; a negative number keeps them all.
	KeepJobs int
	// AgentTimeout is how long an agent may be silent (it sends a
	// heartbeat every agent.HeartbeatEvery) before its node is taken for
	// lost; 0 means DefaultAgentTimeout.
	AgentTimeout time.Duration
	// MasterPort, if not 0, is MASTER_PORT, where rank 0 listens, instead
	// of a port found free on rank 0's node; every start of the job
	// (each restart) uses it.
	MasterPort int
	// NoRelay pushes every file to every SSH node from this machine, as
	// before relays: no node serves another (distribute.go).
	NoRelay bool
	// NoStaging refuses a job whose SSH node lacks a data path, instead
	// of copying it there from this machine (stage.go; gptui run
	// --stage-data=never).
	NoStaging bool
	// DryRun plans the job without writing anything on the nodes but, on
	// an SSH node, the gptui executable that the probe runs: no config,
	// no checkpoint copies, no workdir lock (a workdir another job holds
	// still refuses the plan).
	DryRun bool
	// Command is the command line that started the job, which the
	// workdir locks name to another job refused; empty means this
	// process's.
	Command string
	// Continues is the id of a failed job that this one resumes in its
	// place under a new id (the UI's drop of a lost node): the workdir
	// locks that job's last attempt keeps for a restart that did not come
	// (agent.LockLinger) are this job's own, taken over at once rather
	// than refusing their nodes until they expire. A live job's locks
	// still refuse it.
	Continues string
	// lockOwner names the job across a Supervisor's attempts, whose
	// locks are each other's (JobID without a Supervisor); lockStarted is
	// when it started; lockLinger, that a failure of this attempt is
	// restarted, so its locks are kept for the restart.
	lockOwner   string
	lockStarted time.Time
	lockLinger  bool
	// HangTimeout is how long the job may go without progress before it
	// is taken for hung: a worker whose progress reports (every
	// agent.ProgressEvery) stop for that long, or ranks waiting that long
	// in one communicator operation. The stuck rank is named, with every
	// rank's operation, and the gang stopped. 0 means DefaultHangTimeout.
	// Unless GPTUI_COMM_TIMEOUT is given, the workers' communicator
	// timeout is set to 2·HangTimeout+10 s, so that the launcher, which
	// sees every rank, is the first to notice.
	HangTimeout time.Duration
}

// hangTimeout returns Options.HangTimeout or its default.
func (o *Options) hangTimeout() time.Duration {
	if o.HangTimeout > 0 {
		return o.HangTimeout
	}
	return DefaultHangTimeout
}

// Plan is what a job will run where.
type Plan struct {
	JobID      string
	Table      *ranktable.Table // the rank table
	MasterAddr string
	MasterPort int
	World      int // WORLD_SIZE
	Nodes      []NodePlan
	// Resume is the checkpoint directory every rank of a resuming job
	// loads, which the launcher made every node hold; "" for none.
	Resume string
	// ResumeStep is Resume's step, 0 for none.
	ResumeStep int
}

// NodePlan is one node's part of a plan.
type NodePlan struct {
	Name    string      // the node's name in events (the inventory's, with :port if two share a name)
	Addr    string      // user@host:port, or "local"
	Workdir string      // the node's workdir as the inventory gives it
	Probe   event.Probe // what the node has
	// Platform is the node's GOOS/GOARCH (from its `uname -sm`; this
	// machine's for a local node), which the executable it runs is built
	// for.
	Platform string
	// Command is the shell command that starts the node's agent (for a
	// local node, the program and its arguments).
	Command string
	// Spec is the job spec the agent receives.
	Spec agent.Spec
	// Pushes lists the files pushed to the node, with what happened.
	Pushes []Push
	// Preflight is what the node's pre-flight found (see Job.Plan).
	Preflight *event.Preflight
}

// Push is one file's push to a node.
type Push struct {
	File    string        // the remote path
	From    string        // the local file pushed; "" for one made by the launcher (the config)
	Bytes   int64         // its size
	Skipped bool          // the node already had it (same SHA-256)
	Took    time.Duration // the whole push, hashing included
	Via     string        // the node it was relayed from; "" for this machine (distribute.go)
}

// InputError is a mistake in the user's input found while planning: a
// node without a device the inventory names, a data path missing on a
// node, a rank table that does not fit the inventory. The CLI maps it to
// exit status 2.
type InputError struct{ Err error }

func (e *InputError) Error() string { return e.Err.Error() }
func (e *InputError) Unwrap() error { return e.Err }

// Is reports that an InputError is bad input (badinput.Err).
func (e *InputError) Is(target error) bool { return badinput.Is(target) }

func inputErrorf(format string, args ...any) error {
	return &InputError{fmt.Errorf(format, args...)}
}

// Failure is the error of a job that failed: the first worker that failed
// or the node that was lost.
type Failure struct {
	Rank   int      // the rank that failed; -1 for a lost node
	Node   string   // its node
	Code   int      // its exit status; -1 if killed by a signal
	Signal string   // the signal that killed it
	Tail   []string // the last lines of its output (for a lost node, of its agent's)
	Lost   bool     // the node's agent or connection was lost
	Hung   bool     // the job made no progress for Options.HangTimeout; Rank is the rank that was stuck
	// BadInput: the worker said, in its exit record (event.Exit), that it
	// stopped on bad input; a restart would stop the same way. An exit
	// status of 2 without the record is a crash (the Go runtime's).
	BadInput bool
	Msg      string // why, in words
}

func (f *Failure) Error() string {
	switch {
	case f.Lost:
		return fmt.Sprintf("node %s lost: %s", f.Node, f.Msg)
	case f.Hung:
		return "job hung: " + f.Msg
	case f.Signal != "":
		return fmt.Sprintf("rank %d on %s was killed by %s", f.Rank, f.Node, f.Signal)
	}
	return fmt.Sprintf("rank %d on %s exited with code %d", f.Rank, f.Node, f.Code)
}

// LogError is the outcome of a job whose ranks all finished, some of whose
// log files failed (a full disk) after or during training: the job is done,
// its checkpoints saved, and it is not restarted. Each entry names a rank
// whose worker said so in its exit record (event.Exit.Finished).
type LogError struct {
	Ranks []RankLogError
}

// RankLogError is one rank's log failure.
type RankLogError struct {
	Rank int
	Node string
	Msg  string // the worker's one-line error
}

func (e *LogError) Error() string {
	var b strings.Builder
	b.WriteString("the job finished, but ")
	for i, r := range e.Ranks {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "rank %d on %s: %s", r.Rank, r.Node, r.Msg)
	}
	return b.String()
}

// Job is one training job on a cluster. Create it with New, then call
// Plan, then Start and Wait (or Close, to give up after Plan). The caller
// must receive from Events until it is closed.
type Job struct {
	opts   Options
	events chan event.Event

	mu      sync.Mutex
	nodes   []*node
	plan    *Plan
	started bool
	closed  bool
	run     *runState    // set by Start
	locks   *lockOrder   // set by Plan
	dist    *distributor // set by Plan, for its setup
}

// New returns a job for opts. Nothing happens until Plan.
func New(opts Options) *Job {
	if opts.JobID == "" {
		opts.JobID = jobdir.NewID()
	}
	if opts.Parallel <= 0 {
		opts.Parallel = DefaultParallel
	}
	if opts.KeepJobs == 0 {
		opts.KeepJobs = DefaultKeepJobs
	}
	if opts.SSH.KeepAlive == 0 {
		opts.SSH.KeepAlive = KeepAlive
	}
	if opts.Command == "" {
		opts.Command = commandLine()
	}
	if opts.lockOwner == "" {
		opts.lockOwner, opts.lockStarted = lockOwner(opts), time.Now()
	}
	return &Job{opts: opts, events: make(chan event.Event, 4096)}
}

// Events returns the job's events. The channel is closed once the job
// has ended (after Start) or has been closed (without Start).
func (j *Job) Events() <-chan event.Event { return j.events }

// emit sends e on the events channel.
func (j *Job) emit(e event.Event) { j.events <- e }

func (j *Job) nodeEvent(name, state, msg string) {
	e := event.New(event.KindNode)
	e.Node, e.State, e.Message = name, state, msg
	j.emit(e)
}

// checkpointEvent sends a checkpoint event of the launcher's about node
// name: c (nil where unknown), and msg for people.
func (j *Job) checkpointEvent(name, state string, c *event.Checkpoint, msg string) {
	e := event.New(event.KindCheckpoint)
	e.Node, e.State, e.Checkpoint, e.Message = name, state, c, msg
	j.emit(e)
}

// Close ends a job that was planned but not started (or whose Plan
// failed): it closes the connections and the events channel. On a started
// job it stops the job and waits for its end. Close is safe to call more
// than once, but not while Plan runs: cancel Plan's context instead.
func (j *Job) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return nil
	}
	j.closed = true
	started, nodes := j.started, j.nodes
	j.mu.Unlock()
	if started {
		j.Stop()
		_ = j.Wait()
		return nil
	}
	for _, n := range nodes {
		if n != nil {
			n.close()
		}
	}
	close(j.events)
	return nil
}

// exe returns the executable to push.
func (j *Job) exe() (string, error) {
	if j.opts.Exe != "" {
		return j.opts.Exe, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("cluster: the gptui executable to push: %w", err)
	}
	return exe, nil
}

// nodeNames returns the names nodes go by in events: the inventory name,
// with the port where two nodes share a name.
func nodeNames(nodes []sshexec.Node) []string {
	count := map[string]int{}
	for _, n := range nodes {
		count[n.Name]++
	}
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Name
		if count[n.Name] > 1 {
			names[i] = fmt.Sprintf("%s:%d", n.Name, n.Port)
		}
	}
	return names
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+/=:,@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// errorsFirst returns the first non-nil error of errs, which are in node
// order.
func errorsFirst(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
