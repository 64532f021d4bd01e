package tui

import (
	"context"

	tea "charm.land/bubbletea/v2"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/ranktable"
)

// Launcher probes the nodes of an inventory and starts jobs on them. The UI
// only renders what it reports: the same launcher serves the headless
// `gptui run --no-tui`.
type Launcher interface {
	// Probe probes every node and reports on the channel, as events of
	// kinds probe and node (a node event may carry the Probe), what it
	// finds; it closes the channel when every node has answered or failed.
	// A job event in state failed reports a mistake that is no one node's.
	Probe(ctx context.Context) <-chan event.Event
	// Start starts a job. It returns once the job is under way; what
	// happens next arrives on the Runner's Events.
	Start(ctx context.Context, job Job) (Runner, error)
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

// Job is what the UI asks a Launcher to start.
type Job struct {
	Config    string           // preset name or config file, as for -c
	Overrides []string         // Section.key=value, as for -o
	Resume    bool             // continue from the newest checkpoint (train --resume)
	Table     *ranktable.Table // the ranks: which devices of which nodes
	TablePath string           // where the rank table was saved, if it was
	Resolved  *presets.Config  // Config with Overrides applied, as the UI checked it
}

// Planner is the hook for the planner (package planner, `gptui plan`):
// given the resolved config, the rank table and what the probes found
// (keyed by node name), it returns its per-device memory estimate as
// lines of text ready to show, and whether the job fits. The job screen
// shows them under the strategy. cmd/gptui wires it to planner.Estimate;
// without one the screen says there is no estimate.
type Planner func(cfg *presets.Config, table *ranktable.Table, probes map[string]*event.Probe) (lines []string, fits bool, err error)

// maxBatch bounds how many events one message carries, so that a burst of
// log lines is drawn in a few frames rather than one per line.
const maxBatch = 1024

// Stream ids of eventsMsg: the probe stream, and jobs from 1 on.
const probeStream = 0

// eventsMsg carries the events read from a stream in one go.
type eventsMsg struct {
	stream int // probeStream, or the job's number
	events []event.Event
	closed bool // the stream has ended
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
		msg := eventsMsg{stream: stream, events: []event.Event{ev}}
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
