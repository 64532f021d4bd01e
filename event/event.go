// Package event is the stream of facts about a job that the node agents send
// to the launcher and that the launcher's front ends render: the headless
// printer of `gptui run --no-tui` and the terminal UI.
//
// On the wire (an agent's standard output, over its SSH session) each event
// is one JSON object on one line, its "v" field set to Version. A reader
// skips lines that are not JSON objects (a shell's banner, say) and refuses
// an object of another version with an error that names both versions,
// since a launcher and an agent of different gptui builds must not be mixed;
// the launcher pushes its own binary to every node, so this means a bad
// push. Fields that do not apply to an event's kind are left out.
//
// Kinds and the fields each one uses:
//
//	probe    Node, Probe                     what a node has (its devices or CPU)
//	node     Node, State, Message, HostKey   connecting, pushing, probed, ready, failed, stopped, lost, back, pruned
//	worker   Node, Rank, State, Code, Signal, Exit starting, running, exited, failed, stopped
//	metrics  Node, Rank, Metrics             one training step (or evaluation) of a rank
//	memory   Node, Rank, Device, Used, Total, Proc  one device's memory (or a CPU worker's RSS), and the worker process's own figures, each second
//	log      Node, Rank, Line, Stderr        one line of a worker's output (Stderr: from its standard error)
//	checkpoint Node, Rank, State, Checkpoint, Message saving, saved, copied, replicated, replica-failed
//	job      State, Message, Rank, Node, Tail, Job started, done, failed, stopped, restarting, replanned, hung
//	heartbeat Node                           an agent is alive: sent every second while it runs
//	progress Node, Rank, Progress            a worker's step and collectives, each second
//	health   Node, Health                    a node's load, each second
//	preflight Node, State, Preflight, Message a node's pre-flight: ok, warning, failed
//
// The facts a program acts on are in typed fields, never in a Message or
// a log Line, which are for people: a checkpoint saved is a checkpoint
// event (the worker reports it to its agent as a record on its standard
// error, package agent, as it does its progress and its exit record), not
// the "[checkpoint] saved step N" line it also logs.
//
// Also set where they apply: a node event "probed" carries the Probe; a
// worker event "running" has the pid in Proc (and in Message, "pid
// 4242"); a job event "started" names the job in Job; a job event
// "failed" has the failed worker's Code and Signal; a worker event
// "exited", "failed" or "stopped" carries the worker's own Exit record when
// it wrote one before exiting (its exit status alone cannot tell bad input
// from a crash); a job event "restarting"
// (the launcher restarts the gang after a failure, package cluster's
// Supervisor) carries the Restart, and one "replanned" says in Message how
// the job was re-planned for the nodes that are left. An agent (package
// agent) sends its node's part of the job as job events with its Node set;
// the launcher (package cluster) keeps those to itself and sends the job's
// own.
//
// The launcher expects an agent's events, heartbeats included, at least
// every few seconds (package cluster, Options.AgentTimeout) and takes
// silence for a lost node; it keeps heartbeats to itself.
//
// Ranks are global; Node is the inventory name of the node. Times are the
// sender's clock.
package event

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// Version is the wire format's version. Change it whenever the meaning of
// a field changes.
const Version = 3

// Kinds of event.
const (
	KindProbe   = "probe"
	KindNode    = "node"
	KindWorker  = "worker"
	KindMetrics = "metrics"
	KindMemory  = "memory"
	KindLog     = "log"
	KindJob     = "job"
	// KindHeartbeat is an agent's sign of life, sent every second
	// whatever its workers do.
	KindHeartbeat = "heartbeat"
	// KindProgress is a worker's progress (Progress), sent every second by
	// the worker itself: a worker that stops sending is stopped or frozen.
	KindProgress = "progress"
	// KindHealth is a node's load (Health), from its agent every second.
	KindHealth = "health"
	// KindCheckpoint is a fact about a checkpoint (Checkpoint): a worker
	// saved one or began saving one, or the launcher copied one to a node
	// (for a resume) or replicated it (Engine.save_load.replicas). Its
	// State is one of the Checkpoint* states.
	KindCheckpoint = "checkpoint"
	// KindPreflight is a node's pre-flight (Preflight), checked before
	// any worker starts: what `gptui agent --preflight` found on the node,
	// and the launcher's own checks of it. Its State is one of the
	// Preflight* states, its Message the problems in words.
	KindPreflight = "preflight"
)

// States of nodes, workers and jobs.
const (
	// node
	NodeConnecting = "connecting"
	NodeProbed     = "probed"
	NodePushing    = "pushing"
	NodeReady      = "ready"
	NodeFailed     = "failed"  // Message says why (a host-key problem names the fingerprints)
	NodeLost       = "lost"    // its connection dropped during the job
	NodeStopped    = "stopped" // its setup was stopped because another node failed (Message says which)
	NodePruned     = "pruned"  // after a successful job: old jobs/<id> directories removed (Message says which, or why not)
	NodeLocked     = "locked"  // during setup: the job took the lock of the node's workdir (Message names it, and a stale lock taken over)
	// NodeBack: at a restart, a node that an earlier attempt left out
	// (it stayed unreachable) is part of the job again.
	NodeBack = "back"
	// NodeAgentSilent: the node's agent has sent no heartbeat for a few
	// seconds (stopped, frozen, cut off): its ranks' state is unknown, and
	// Message says whether the other nodes' ranks, advancing in step with
	// them, show that they train on. Not a loss: NodeLost follows only
	// when nothing shows the ranks alive for the agent timeout.
	NodeAgentSilent = "agent-silent"
	// NodeAgentBack: the silent agent answers again.
	NodeAgentBack = "agent-back"

	// worker
	WorkerStarting = "starting"
	WorkerRunning  = "running"
	// WorkerExited: exit code 0, or a worker that finished its work and
	// failed only afterwards (Exit.Finished: its log files; Code and
	// Exit.Error say how). Either way the job goes on without it.
	WorkerExited = "exited"
	WorkerFailed = "failed" // non-zero code, or a signal, of its own doing
	// WorkerStopped: the job's stop ended the worker (its agent signalled
	// it after another worker failed, the launcher stopped the job, or an
	// interrupt); Code and Signal say how it exited.
	WorkerStopped = "stopped"

	// job
	JobStarted = "started"
	JobDone    = "done"
	JobFailed  = "failed" // Rank, Node and Tail name the first failure
	JobStopped = "stopped"
	// JobRestarting: the job failed and is restarted from its newest
	// checkpoint; Restart says which restart, why and from which step.
	JobRestarting = "restarting"
	// JobReplanned: nodes stayed unreachable at a restart and the job was
	// re-planned for those left; Message says how. With Restart set, it
	// corrects the restart's step instead: the job resumes from
	// Restart.Step, not from the step the JobRestarting event named (not
	// every node could hold that checkpoint).
	JobReplanned = "replanned"
	// JobHung: the job made no progress for the launcher's hang bound;
	// Rank is the stuck rank and Message the diagnosis (every rank's
	// operation). The job then fails (or restarts).
	JobHung = "hung"

	// checkpoint
	// CheckpointSaving: Rank began saving the checkpoint of
	// Checkpoint.Step in the background; its CheckpointSaved follows.
	CheckpointSaving = "saving"
	// CheckpointSaved: Rank wrote the checkpoint of Checkpoint.Step to
	// Checkpoint.Dir on Node (relative to its workdir unless absolute).
	CheckpointSaved = "saved"
	// CheckpointCopied: the launcher copied the checkpoint
	// Checkpoint.Dir to Node from node Checkpoint.From, so that every
	// rank of a resuming job starts from it.
	CheckpointCopied = "copied"
	// CheckpointReplicated: the launcher copied a new checkpoint to Node
	// from node Checkpoint.From, as one of its replicas; Message says so
	// in words, with the time the copy took.
	CheckpointReplicated = "replicated"
	// CheckpointReplicaFailed: a replica could not be made on Node
	// (Checkpoint, where known, says which); Message says why. Training
	// goes on.
	CheckpointReplicaFailed = "replica-failed"

	// preflight, and the status of each of its checks (Check.Status)
	// PreflightOK: every check passed.
	PreflightOK = "ok"
	// PreflightWarning: the job may run, but a check found what is known
	// to break or slow jobs (a small /dev/shm, a low memlock limit, clock
	// skew); Check.Fix says what to do.
	PreflightWarning = "warning"
	// PreflightFailed: a check found what refuses the job (a port the
	// job needs that a node cannot reach, too little disk for the
	// checkpoints, CUDA libraries the driver cannot run).
	PreflightFailed = "failed"
)

// Event is one fact about the job.
type Event struct {
	V    int       `json:"v"`
	Kind string    `json:"kind"`
	Time time.Time `json:"time"`

	Node  string `json:"node,omitempty"`
	Rank  int    `json:"rank"` // -1 where no rank applies
	State string `json:"state,omitempty"`

	Message string   `json:"message,omitempty"`
	Code    int      `json:"code,omitempty"`   // exit status of a worker
	Signal  string   `json:"signal,omitempty"` // signal that killed a worker, such as "SIGKILL"
	Tail    []string `json:"tail,omitempty"`   // last lines of a failed worker's log
	Line    string   `json:"line,omitempty"`
	Stderr  bool     `json:"stderr,omitempty"` // a log line came from the worker's standard error

	// Job is the job's id, for a job event started.
	Job string `json:"job,omitempty"`

	Probe   *Probe   `json:"probe,omitempty"`
	Metrics *Metrics `json:"metrics,omitempty"`
	Restart *Restart `json:"restart,omitempty"`
	// Checkpoint is the checkpoint of a KindCheckpoint event.
	Checkpoint *Checkpoint `json:"checkpoint,omitempty"`
	// HostKey, for a node event failed, is the host key the node offered
	// and why it was refused, when that is why it failed.
	HostKey *HostKey `json:"host_key,omitempty"`
	// Exit is a worker's own account of its end, for a worker event
	// exited, failed or stopped: nil when it wrote none (it was killed,
	// or crashed) or its exit status is not the one it announced.
	Exit *Exit `json:"exit,omitempty"`
	// Progress is a worker's progress, for KindProgress.
	Progress *Progress `json:"progress,omitempty"`
	// Health is a node's load, for KindHealth.
	Health *Health `json:"health,omitempty"`
	// Proc is a worker process's pid and CPU, for a memory event (and its
	// pid for a worker event "running").
	Proc *Proc `json:"proc,omitempty"`
	// Preflight is a node's pre-flight, for KindPreflight.
	Preflight *Preflight `json:"preflight,omitempty"`

	Device int   `json:"device,omitempty"` // device index on the node; -1 for a CPU worker
	Used   int64 `json:"used,omitempty"`   // bytes
	Total  int64 `json:"total,omitempty"`  // bytes
}

// Probe is what `gptui agent --probe` finds on a node.
type Probe struct {
	Hostname string   `json:"hostname"`
	OS       string   `json:"os"` // runtime.GOOS/GOARCH
	Cores    int      `json:"cores"`
	MemBytes int64    `json:"mem_bytes"` // total memory of the node
	Devices  []Device `json:"devices,omitempty"`
	// NoGPU says why no GPU is listed (no NVML, no devices), if none is.
	NoGPU string `json:"no_gpu,omitempty"`
}

// Device is one accelerator of a node.
type Device struct {
	Index    int    `json:"index"`
	Name     string `json:"name"`
	MemTotal int64  `json:"mem_total"`
	MemFree  int64  `json:"mem_free"`
	UUID     string `json:"uuid,omitempty"`
	PCIBusID string `json:"pci_bus_id,omitempty"`
}

// Preflight is what a node's pre-flight found (package cluster runs it
// on every node at once, package agent's RunPreflight on each): the
// interface the node reaches the master through, and each check.
type Preflight struct {
	// Iface is the network interface the node reaches MASTER_ADDR
	// through, and Addr its address there: where its workers listen.
	Iface string `json:"iface,omitempty"`
	Addr  string `json:"addr,omitempty"`
	// NodeEnv holds the interface variables (NCCL_SOCKET_IFNAME,
	// GLOO_SOCKET_IFNAME) that the node's own environment sets, as
	// KEY=value: the launcher leaves those to it.
	NodeEnv []string `json:"node_env,omitempty"`
	// Checks are the checks made, in a fixed order: the network, the
	// limits, the disk, the CUDA libraries, the GPUs, the clock.
	Checks []Check `json:"checks"`
}

// Names of checks (Check.Name).
const (
	CheckIface   = "iface"   // the interface to the master, and NCCL_SOCKET_IFNAME
	CheckMaster  = "master"  // MASTER_ADDR:MASTER_PORT, listened on by the master node and reached by every node
	CheckPeer    = "peer"    // a port of a peer's listening range, reached (Peer, Port)
	CheckShm     = "shm"     // the size of /dev/shm (Have, Need), on a GPU node
	CheckMemlock = "memlock" // ulimit -l (Have, Need; -1 unlimited), on a GPU node
	CheckNofile  = "nofile"  // ulimit -n, the hard limit (Have, Need)
	CheckDisk    = "disk"    // free bytes where the checkpoints go (Have) against their size (Need)
	CheckGPUs    = "gpus"    // the GPUs the node shows against those devices= names
	CheckCUDA    = "cuda"    // each CUDA library against the driver's CUDA version
	CheckClock   = "clock"   // the node's clock against the launcher's
)

// Check is one check of a pre-flight. The figures a program acts on are
// in its typed fields; Value, Message and Fix are for people.
type Check struct {
	Name   string `json:"name"`   // one of the Check* names
	Status string `json:"status"` // PreflightOK, PreflightWarning or PreflightFailed
	// Value is what was found, in a few words ("64 MiB", "eth0
	// 10.0.0.2").
	Value string `json:"value,omitempty"`
	// Peer is the node a connection went to (master, peer); Port the TCP
	// port (master, peer).
	Peer string `json:"peer,omitempty"`
	Port int    `json:"port,omitempty"`
	// Have and Need are the figure found and the one wanted: bytes (shm,
	// memlock, disk), files (nofile), GPUs (gpus), milliseconds of skew
	// (clock). -1 is unlimited.
	Have int64 `json:"have,omitempty"`
	Need int64 `json:"need,omitempty"`
	// Message says what is wrong, for a warning or a failure; Fix, what
	// to do about it.
	Message string `json:"message,omitempty"`
	Fix     string `json:"fix,omitempty"`
}

// Problem is c in one line for people: its message and fix, "" for a
// check that passed.
func (c Check) Problem() string {
	if c.Status == PreflightOK || c.Status == "" {
		return ""
	}
	if c.Fix == "" {
		return c.Message
	}
	return c.Message + "; fix: " + c.Fix
}

// Status is the pre-flight's state: PreflightFailed if a check failed,
// else PreflightWarning if one warned, else PreflightOK.
func (p *Preflight) Status() string {
	s := PreflightOK
	for _, c := range p.Checks {
		switch c.Status {
		case PreflightFailed:
			return PreflightFailed
		case PreflightWarning:
			s = PreflightWarning
		}
	}
	return s
}

// Restart is one automatic restart of a job.
type Restart struct {
	Count int    `json:"count"` // this restart's number, from 1
	Max   int    `json:"max"`   // the most restarts allowed
	Cause string `json:"cause"` // the failure that caused it
	Step  int    `json:"step"`  // the step the job resumes from (0: from the start)
	// Requested: someone asked for it (gptui restart, the UI's r); Count
	// then counts those, and Max does not apply.
	Requested bool `json:"requested,omitempty"`
}

// String describes the restart: "1/3: rank 3 on node2 was killed by
// SIGKILL; resuming from step 10", or for a requested one "restart
// requested; resuming from step 10".
func (r *Restart) String() string {
	from := "restarting from the start (no checkpoint saved yet)"
	if r.Step > 0 {
		from = fmt.Sprintf("resuming from step %d", r.Step)
	}
	if r.Requested {
		return fmt.Sprintf("%s; %s", r.Cause, from)
	}
	return fmt.Sprintf("%d/%d: %s; %s", r.Count, r.Max, r.Cause, from)
}

// Checkpoint is one checkpoint, as a KindCheckpoint event names it.
type Checkpoint struct {
	// Step is the number of steps done, the step a resume from it starts
	// at (the directory's step_N).
	Step int `json:"step"`
	// Dir is its directory on the event's node, relative to the node's
	// workdir unless absolute; empty for a save begun (saving).
	Dir string `json:"dir,omitempty"`
	// From is the node it was copied from, for copied and replicated.
	From string `json:"from,omitempty"`
	// Run is the training run that wrote it (checkpoint.Manifest.Run),
	// for saved: a restart of the job resumes from that run's
	// checkpoints alone.
	Run string `json:"run,omitempty"`
}

// HostKey is a node's host key that the launcher refused (package
// sshexec, HostKeyError).
type HostKey struct {
	// Kind is "unknown" (known_hosts does not know the node), "changed"
	// (it records another key) or "revoked" (the key is marked @revoked).
	Kind string `json:"kind"`
	// Fingerprint is the SHA-256 fingerprint of the key the node offered
	// ("SHA256:...").
	Fingerprint string `json:"fingerprint"`
	// Known is, for changed, the fingerprints known_hosts records.
	Known string `json:"known,omitempty"`
}

// Exit is what a worker says of its end, written just before it exits
// (package agent, ReportExit). The exit status alone does not say it: the
// Go runtime exits with status 2 on a fatal error (SIGQUIT, "fatal error:
// out of memory") as gptui does on bad input, and status 1 covers both a
// failed run and one whose log files failed after its last step.
type Exit struct {
	Code int `json:"code"` // the status it exits with
	// BadInput: it stopped on bad input (a config key, a file, a
	// checkpoint): a restart would stop the same way.
	BadInput bool `json:"bad_input,omitempty"`
	// Finished: it did all its work (for training: every step, and its
	// last checkpoint saved); what failed came afterwards, its log files.
	Finished bool   `json:"finished,omitempty"`
	Error    string `json:"error,omitempty"` // its one-line error, if it failed
}

// Health is a node's load, as its agent sees it.
type Health struct {
	CPUPercent float64     `json:"cpu_percent"` // the node's CPU utilisation over the last second, 0–100
	Cores      int         `json:"cores"`
	MemUsed    int64       `json:"mem_used"`    // bytes of the node's memory in use (total − available)
	MemTotal   int64       `json:"mem_total"`   // bytes
	WorkersRSS int64       `json:"workers_rss"` // resident bytes of this job's worker processes on the node
	GPUs       []GPUHealth `json:"gpus,omitempty"`
}

// GPUHealth is one GPU's load, through NVML. A figure NVML cannot give is
// -1.
type GPUHealth struct {
	Index       int     `json:"index"`
	UtilPercent int     `json:"util_percent"`
	MemUsed     int64   `json:"mem_used"`
	MemTotal    int64   `json:"mem_total"`
	PowerW      float64 `json:"power_w"`
	TempC       int     `json:"temp_c"`
}

// Proc is what the agent sees of one worker's process (its process
// group): its pid and the CPU it used over the last second, from
// /proc/<pid>/stat.
type Proc struct {
	PID int `json:"pid"`
	// CPUPercent is the CPU time of the process group over the last
	// second, in percent of one core: 250 is two and a half cores busy.
	// 0 in a worker event "running" (not measured yet).
	CPUPercent float64 `json:"cpu_percent,omitempty"`
}

// Progress is where a worker is: its step and its communicator's
// operations (comm.Progress). Comparing the ranks' tells a stuck rank from
// those waiting for it.
type Progress struct {
	Step     int   `json:"step"`                // the training step it is in
	Ops      int64 `json:"ops"`                 // communicator operations done
	InFlight []Op  `json:"in_flight,omitempty"` // operations running, the longest first
	Last     *Op   `json:"last,omitempty"`      // the operation completed last (WaitS unset)
}

// Op is a communicator operation in flight.
type Op struct {
	Group string  `json:"group"` // "dp", "mp", ...
	Op    string  `json:"op"`    // "AllReduce", ...
	Seq   int64   `json:"seq"`   // its number in the group, the same on every member
	WaitS float64 `json:"wait_s"`
}

// String formats o as "AllReduce #12 (dp)".
func (o Op) String() string { return fmt.Sprintf("%s #%d (%s)", o.Op, o.Seq, o.Group) }

// Ends reports whether e is the last event of a job: done, failed or
// stopped.
func (e Event) Ends() bool {
	return e.Kind == KindJob && (e.State == JobDone || e.State == JobFailed || e.State == JobStopped)
}

// New returns an event of the given kind, stamped now, with no rank.
func New(kind string) Event {
	return Event{V: Version, Kind: kind, Time: time.Now(), Rank: -1}
}

// Writer writes events as JSON lines. It is safe for concurrent use.
type Writer struct {
	mu  sync.Mutex
	w   io.Writer
	err error
}

// NewWriter returns a Writer that writes to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write writes e as one line, setting its version. After the first error
// every Write returns it.
func (w *Writer) Write(e Event) error {
	e.V = Version
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("event: %w", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if _, err := w.w.Write(append(b, '\n')); err != nil {
		w.err = fmt.Errorf("event: %w", err)
	}
	return w.err
}

// Reader reads events written by a Writer.
type Reader struct {
	s *bufio.Scanner
}

// NewReader returns a Reader that reads from r.
func NewReader(r io.Reader) *Reader {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 64<<10), 4<<20)
	return &Reader{s: s}
}

// VersionError is returned for an event of another wire format version.
type VersionError struct{ Got int }

func (e *VersionError) Error() string {
	return fmt.Sprintf("event: the agent speaks event format v%d, this gptui speaks v%d: push the same gptui binary to every node", e.Got, Version)
}

// Next returns the next event. It skips lines that are not JSON objects,
// returns a *VersionError for an event of another version, and io.EOF at
// the end of the stream.
func (r *Reader) Next() (Event, error) {
	for r.s.Scan() {
		e, err := Decode(r.s.Bytes())
		if errors.Is(err, ErrNotEvent) {
			continue
		}
		return e, err
	}
	if err := r.s.Err(); err != nil {
		return Event{}, fmt.Errorf("event: %w", err)
	}
	return Event{}, io.EOF
}

// ErrNotEvent is Decode's error for a line that is not an event's (not a
// JSON object).
var ErrNotEvent = errors.New("event: not an event")

// Decode decodes one line of the wire format (its newline may be there or
// not): ErrNotEvent for a line that is not a JSON object, a *VersionError
// for an event of another version. Reader reads with it, and so does
// whatever follows a file of events (package jobdir).
func Decode(line []byte) (Event, error) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 || line[0] != '{' {
		return Event{}, ErrNotEvent
	}
	var e Event
	if err := json.Unmarshal(line, &e); err != nil {
		return Event{}, ErrNotEvent
	}
	if e.V != Version {
		return Event{}, &VersionError{Got: e.V}
	}
	return e, nil
}
