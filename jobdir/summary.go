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
	State string `json:"state"`
	// Done is the number of steps completed, in the units of MaxSteps and
	// of a checkpoint's step (step_00000008 holds the state after 8
	// steps): the lowest rank's newest logged step plus one; from a
	// restart until its attempt logs a step, the step it resumes from.
	Done     int      `json:"done"`
	MaxSteps int      `json:"max_steps"` // Engine.max_steps
	Loss     float64  `json:"loss"`      // the newest logged loss, kept across a restart until the next attempt logs one
	Nodes    []string `json:"nodes,omitempty"`
	// Lost are the nodes the job lost (or that failed at its setup) and
	// has not had back since, with why: they stay the job's nodes.
	Lost     map[string]string `json:"lost,omitempty"`
	Restarts int               `json:"restarts,omitempty"`
	Started  time.Time         `json:"started"`
	Ended    time.Time         `json:"ended,omitzero"`
	// Message is how the job ended, or the cause of its restart.
	Message string `json:"message,omitempty"`
	// Checkpoint is the newest checkpoint saved and CheckpointNode the
	// node it is on.
	Checkpoint     *event.Checkpoint `json:"checkpoint,omitempty"`
	CheckpointNode string            `json:"checkpoint_node,omitempty"`

	lead   int  // the rank whose metrics give Done and Loss; -1 none yet
	logged bool // this attempt has logged a step
}

// NewSummary returns the summary of a job of maxSteps steps that has not
// started yet.
func NewSummary(maxSteps int, started time.Time) Summary {
	return Summary{State: StateStarting, MaxSteps: maxSteps, Started: started, lead: -1}
}

// Logged reports whether the job's current attempt has logged a step.
func (s *Summary) Logged() bool { return s.logged }

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
			s.Done, s.Loss, s.logged = m.Step+1, m.Loss, true
		}
	case event.KindNode:
		switch e.State {
		case event.NodeReady:
			if !slices.Contains(s.Nodes, e.Node) {
				s.Nodes = append(s.Nodes, e.Node)
			}
			delete(s.Lost, e.Node)
		case event.NodeLost, event.NodeFailed:
			if s.Lost == nil {
				s.Lost = map[string]string{}
			}
			s.Lost[e.Node] = e.Message
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
		case event.JobRestarting, event.JobReplanned:
			if e.State == event.JobRestarting {
				s.State, s.Nodes, s.lead, s.logged = StateRestarting, slices.DeleteFunc(s.Nodes, func(n string) bool { _, lost := s.Lost[n]; return !lost }), -1, false
				s.Restarts++
			}
			if r := e.Restart; r != nil {
				if e.State == event.JobRestarting {
					s.Message = r.Cause
				}
				s.Done = r.Step // the new attempt goes on from there
			}
		case event.JobDone, event.JobFailed, event.JobStopped:
			s.State, s.Message, s.Ended = e.State, e.Message, e.Time
		}
	}
}
