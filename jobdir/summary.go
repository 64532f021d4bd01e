package jobdir

import (
	"slices"
	"time"

	"github.com/gptui/gptui/event"
)

// States of a job, as its summary and `gptui jobs` give them.
const (
	StateStarting   = "starting"   // its nodes are being set up
	StateRunning    = "running"    // its workers run
	StateRestarting = "restarting" // it failed, or was asked to, and restarts from its newest checkpoint
	StateDone       = event.JobDone
	StateFailed     = event.JobFailed
	StateStopped    = event.JobStopped
	// StateDead: the supervisor is gone without having written the job's
	// end (killed, or the machine rebooted); its workers are gone with
	// it. Derived when read (Job.State), never written.
	StateDead = "dead"
)

// Ended reports whether a job in state s has ended.
func Ended(s string) bool {
	return s == StateDone || s == StateFailed || s == StateStopped || s == StateDead
}

// Summary is a job's state at a glance: what `gptui jobs` lists. The
// supervisor keeps it from the job's events (Add) in summary.json.
type Summary struct {
	State    string    `json:"state"`
	Step     int       `json:"step"`      // rank 0's (the lowest rank's) newest logged step
	MaxSteps int       `json:"max_steps"` // Engine.max_steps
	Loss     float64   `json:"loss"`      // its loss
	Nodes    []string  `json:"nodes,omitempty"`
	Restarts int       `json:"restarts,omitempty"`
	Started  time.Time `json:"started"`
	Ended    time.Time `json:"ended,omitzero"`
	// Message is how the job ended, or the cause of its restart.
	Message string `json:"message,omitempty"`
	// Checkpoint is the newest checkpoint saved and CheckpointNode the
	// node it is on.
	Checkpoint     *event.Checkpoint `json:"checkpoint,omitempty"`
	CheckpointNode string            `json:"checkpoint_node,omitempty"`

	lead int // the rank whose metrics give Step and Loss; -1 none yet
}

// NewSummary returns the summary of a job of maxSteps steps that has not
// started yet.
func NewSummary(maxSteps int, started time.Time) Summary {
	return Summary{State: StateStarting, MaxSteps: maxSteps, Started: started, lead: -1}
}

// Add folds e into the summary.
func (s *Summary) Add(e event.Event) {
	switch e.Kind {
	case event.KindMetrics:
		m := e.Metrics
		if m == nil || m.EvalLoss != 0 || e.Rank < 0 {
			return
		}
		if s.lead < 0 || e.Rank < s.lead {
			s.lead = e.Rank
		}
		if e.Rank == s.lead {
			s.Step, s.Loss = m.Step, m.Loss
		}
	case event.KindNode:
		switch e.State {
		case event.NodeReady:
			if !slices.Contains(s.Nodes, e.Node) {
				s.Nodes = append(s.Nodes, e.Node)
			}
		case event.NodeLost, event.NodeFailed:
			s.Nodes = slices.DeleteFunc(s.Nodes, func(n string) bool { return n == e.Node })
		}
	case event.KindCheckpoint:
		if c := e.Checkpoint; e.State == event.CheckpointSaved && c != nil && (s.Checkpoint == nil || c.Step >= s.Checkpoint.Step) {
			cc := *c
			s.Checkpoint, s.CheckpointNode = &cc, e.Node
		}
	case event.KindJob:
		switch e.State {
		case event.JobStarted:
			s.State, s.Message, s.Ended = StateRunning, "", time.Time{}
		case event.JobRestarting:
			s.State, s.Nodes, s.lead, s.Step, s.Loss = StateRestarting, nil, -1, 0, 0
			s.Restarts++
			if e.Restart != nil {
				s.Message = e.Restart.Cause
			}
		case event.JobDone, event.JobFailed, event.JobStopped:
			s.State, s.Message, s.Ended = e.State, e.Message, e.Time
		}
	}
}
