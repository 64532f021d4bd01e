package tui

import (
	"context"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/ranktable"
)

// Launcher probes the nodes of an inventory and starts jobs on them. The UI
// only renders what it reports: the same launcher serves the headless
// `gptui run --no-tui`.
type Launcher interface {
	// Probe sets up and probes the nodes req names (every node when it
	// names none) and reports on the channel, as events of kinds probe and
	// node (a node event may carry the Probe), what it finds; a node is
	// ready for a job once it reports state ready. It closes the channel
	// when every node asked has answered or failed. A job event in state
	// failed reports a mistake that is no one node's.
	Probe(ctx context.Context, req ProbeRequest) <-chan event.Event
	// Start starts a job. It returns once the job is under way; what
	// happens next arrives on the Runner's Events.
	Start(ctx context.Context, job Job) (Runner, error)
}

// ProbeRequest says which nodes Launcher.Probe sets up.
type ProbeRequest struct {
	// Nodes are the inventory names of the nodes; none means every node.
	Nodes []string
	// AcceptHostKey is the SHA-256 fingerprint of a host key a person
	// checked and accepted on the Nodes screen: with one node in Nodes, a
	// key that known_hosts does not know is trusted and recorded if it
	// has this fingerprint (sshexec.ClientConfig.AcceptHostKey).
	AcceptHostKey string
	// Continues is the id of a failed job whose workdir locks do not
	// refuse the nodes (cluster.Options.Continues): the drop of a lost
	// node sets the nodes left up again for the job that continues it.
	Continues string
}

// Runner is one running job.
type Runner interface {
	// Events returns the job's events. The channel is closed after the
	// job's last event (a job event in state done, failed or stopped), once
	// no worker of the job remains.
	Events() <-chan event.Event
	// Stop asks the job to stop: its workers get SIGTERM, then SIGKILL
	// after a grace period. It does not wait; Events is closed when they
	// are gone. Stop may be called more than once.
	Stop()
}

// DetachedRunner is a Runner whose job runs on its own (a
// DetachingLauncher's; jobdir.Attach's): the UI can leave it running, and
// have it restarted in place.
type DetachedRunner interface {
	Runner
	// Detach stops following the job, which runs on; Events is closed.
	Detach()
	// Restart stops the job's gang with a checkpoint and starts it again
	// from it, in the same job (the events go on).
	Restart() error
	// ID is the job's id, for 'gptui attach ID'.
	ID() string
}

// DetachingLauncher is a Launcher whose jobs run on their own, detached
// from the UI: Start returns a DetachedRunner, and quitting the UI may
// leave the job running.
type DetachingLauncher interface {
	Launcher
	// StartsDetached marks the kind; it does nothing.
	StartsDetached()
}

// Job is what the UI asks a Launcher to start.
type Job struct {
	Config    string           // preset name or config file, as for -c
	Overrides []string         // Section.key=value, as for -o
	Resume    bool             // continue from the newest checkpoint (train --resume)
	Table     *ranktable.Table // the ranks: which devices of which nodes
	TablePath string           // where the rank table was saved, if it was
	JobID     string           // the job's id (jobdir.NewID), which names its jobs/<id> directories
	Resolved  *presets.Config  // Config with Overrides applied, as the UI checked it
	Restarts  cluster.Restarts // the automatic restart policy (--max-restarts, --min-nodes)
	// Nodes names the inventory's nodes the job runs on (those of Table);
	// none means every node.
	Nodes []string
	// Elastic: a restart may leave nodes out (Restarts.MinNodes), so each
	// attempt's ranks come from its nodes, as Table's came from all of
	// them, rather than from Table.
	Elastic bool
	// Continues is the id of the failed job this one resumes in its place
	// (the drop of a lost node; cluster.Options.Continues), or "".
	Continues string
}

// Planner is the hook for the planner (package planner, `gptui plan`):
// given the job as the Job screen has it, it ranks the parallel strategies
// of its config on the rank table's devices as `gptui plan` does. The job
// screen shows the answer under the strategy: the estimate of the config's
// own strategy, the ranked plans (the config's marked), and a plan's
// overrides when the user applies it. cmd/gptui wires it to planner.Search;
// without one the screen says there is no planner.
//
// The UI calls it in a command (tea.Cmd), off its own goroutine, once for
// each new request (the job, the rank table or the nodes changed), and
// keeps the answer in its model: it is never called to draw a frame. It
// must be safe to call from several goroutines.
type Planner func(req PlanRequest) (*PlanReport, error)

// PlanRequest is the job the planner is asked about.
type PlanRequest struct {
	Config    string                  // preset name or config file, as for -c
	Overrides []string                // its -o overrides
	Resolved  *presets.Config         // Config with Overrides applied
	Table     *ranktable.Table        // the ranks of the ready nodes: which devices of which nodes
	Probes    map[string]*event.Probe // what the probes of the ready nodes found, by node name
	// Device is the planner's device profile for the nodes the probes
	// reported ("cpu", "H100-80G", ...; see planDevice).
	Device string
}

// PlanReport is the planner's answer for one job.
type PlanReport struct {
	// Estimate describes the config's own strategy as lines of text ready
	// to show (its memory per device by component, its predicted step and
	// its place in the ranking); Fits says whether it fits and runs.
	Estimate []string
	Fits     bool
	// Plans are the feasible plans, fastest first.
	Plans []PlanRow
	// Rejected is the number of plans that do not fit or cannot run, and
	// Reasons counts them by reason ("3000 out of memory, 23 pipeline").
	Rejected int
	Reasons  string
	// Command is the `gptui plan` command line that lists the same plans
	// and every rejected one with its reason.
	Command string
	// Note is a line on the figures the plans rest on, such as the link
	// bandwidths and whether they were measured.
	Note string
}

// PlanRow is one ranked plan.
type PlanRow struct {
	Strategy   string  // as `gptui plan` prints it: "dp4 mp2 pp4 mb1 full"
	MemBytes   int64   // memory of the fullest device
	StepS      float64 // predicted time of one optimizer step
	TokensPerS float64 // predicted throughput
	MFU        float64 // model FLOPs utilisation, 0 to 1
	Bubble     float64 // the pipeline bubble's share of the step; negative without a pipeline
	CommS      float64 // communication not hidden behind computation, per step
	Current    bool    // the config's own strategy
	// Overrides are the job's -o overrides with this plan applied: the
	// keys the plan changes set (replacing any spelling of them), the
	// others kept. Applying the plan replaces the job's overrides with
	// them.
	Overrides []string
}

// maxBatch bounds how many events one message carries, so that a burst of
// log lines is drawn in a few frames rather than one per line.
const maxBatch = 1024

// Stream ids of eventsMsg: probes count down from probeStream, jobs up
// from 1.
const probeStream = 0

// eventsMsg carries the events read from a stream in one go.
type eventsMsg struct {
	stream int // a probe's (≤ probeStream), or the job's number
	events []event.Event
	closed bool      // the stream has ended
	at     time.Time // when the first of them arrived (zero: at their own times)
}

// startedMsg reports the result of Launcher.Start.
type startedMsg struct {
	job    int
	runner Runner
	err    error
}

// readEvents returns a command that waits for the next event of ch and
// takes whatever else is already there, up to maxBatch events. The model
// calls it again for each eventsMsg until the stream is closed: all events
// reach the model as messages, never from another goroutine.
func readEvents(stream int, ch <-chan event.Event) tea.Cmd {
	return func() tea.Msg {
		ev, ok := <-ch
		if !ok {
			return eventsMsg{stream: stream, closed: true}
		}
		msg := eventsMsg{stream: stream, events: []event.Event{ev}, at: time.Now()}
		for len(msg.events) < maxBatch {
			select {
			case ev, ok := <-ch:
				if !ok {
					msg.closed = true
					return msg
				}
				msg.events = append(msg.events, ev)
			default:
				return msg
			}
		}
		return msg
	}
}
