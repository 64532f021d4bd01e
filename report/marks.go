package report

import (
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/gptui/gptui/event"
)

// Kinds of Mark.
const (
	MarkFailure = "failure" // the job failed (a worker failed or was killed), or an attempt of it did
	MarkHang    = "hang"    // the launcher found the job hung
	MarkLost    = "lost"    // a node was lost
	MarkRestart = "restart" // the job was restarted, or resumed, from a step
)

// Mark is an event of the run drawn across every panel at its step: a
// failure, a hang or a lost node at the step the job had reached, a
// restart at the step it resumed from.
type Mark struct {
	Step  int
	Kind  string // MarkFailure, MarkHang, MarkLost or MarkRestart
	Label string // what happened, in a few words
}

// Marker finds the marks of a run in its events (package event), given in
// the order they happened: the job's events "hung", "failed" and
// "restarting" and a node's "lost", each at the step the job had reached
// (the newest step of its metrics or progress events), a restart also at
// the step it resumed from. An attempt's end is marked once: a hang, a
// lost node or a failure, whichever came first. The zero Marker is ready
// to use.
type Marker struct {
	step   int  // the newest step of the attempt
	marked bool // the attempt's end is marked
	marks  []Mark
}

// maxLabel bounds a mark's label, in characters.
const maxLabel = 48

// Add takes the next event of the run.
func (k *Marker) Add(e event.Event) {
	switch e.Kind {
	case event.KindMetrics:
		if e.Metrics != nil {
			k.step = max(k.step, e.Metrics.Step)
		}
	case event.KindProgress:
		if e.Progress != nil {
			k.step = max(k.step, e.Progress.Step-1) // the step it is in is not done
		}
	case event.KindNode:
		if e.State == event.NodeLost {
			k.end(MarkLost, "node "+e.Node+" lost")
		}
	case event.KindJob:
		switch e.State {
		case event.JobHung:
			k.end(MarkHang, fmt.Sprintf("rank %d hung", e.Rank))
		case event.JobFailed:
			label := e.Message
			switch {
			case e.Rank >= 0 && e.Signal != "":
				label = fmt.Sprintf("rank %d killed by %s", e.Rank, e.Signal)
			case e.Rank >= 0:
				label = fmt.Sprintf("rank %d failed, exit code %d", e.Rank, e.Code)
			case label == "":
				label = "the job failed"
			}
			k.end(MarkFailure, label)
		case event.JobRestarting:
			if e.Restart == nil {
				return
			}
			// The attempt had done at least the steps of the checkpoint
			// it saved (its stop may save steps whose records were not
			// read yet).
			k.step = max(k.step, e.Restart.Step)
			k.end(MarkFailure, e.Restart.Cause)
			k.marks = append(k.marks, restartMark(e.Restart))
			k.step, k.marked = e.Restart.Step, false
		case event.JobReplanned:
			// The restart resumes from another step than it named.
			if i := len(k.marks) - 1; e.Restart != nil && i >= 0 && k.marks[i].Kind == MarkRestart {
				k.marks[i] = restartMark(e.Restart)
				k.step = e.Restart.Step
			}
		}
	}
}

// restartMark is the mark of restart r.
func restartMark(r *event.Restart) Mark {
	return Mark{Step: r.Step, Kind: MarkRestart, Label: fmt.Sprintf("restart %d/%d from step %d", r.Count, r.Max, r.Step)}
}

// Resume notes that the run was started again from step (a resume that
// is no automatic restart: 'gptui train --resume', the UI's r): a restart
// mark, and a new attempt.
func (k *Marker) Resume(step int) {
	k.marks = append(k.marks, Mark{Step: step, Kind: MarkRestart, Label: fmt.Sprintf("resumed from step %d", step)})
	k.step, k.marked = step, false
}

// end marks the end of the attempt, unless it is marked already.
func (k *Marker) end(kind, label string) {
	if k.marked {
		return
	}
	k.marked = true
	if r := []rune(label); len(r) > maxLabel {
		label = string(r[:maxLabel-1]) + "…"
	}
	k.marks = append(k.marks, Mark{Step: k.step, Kind: kind, Label: label})
}

// Marks returns the marks found so far, in the order they happened.
func (k *Marker) Marks() []Mark { return slices.Clone(k.marks) }

// ReadMarks reads the marks of a run from an event log: the events of a
// job as JSON lines (event.Writer's format), in the order they happened.
// name names the log in errors.
func ReadMarks(name string, r io.Reader) ([]Mark, error) {
	var k Marker
	rd := event.NewReader(r)
	for {
		e, err := rd.Next()
		if err == io.EOF {
			return k.Marks(), nil
		}
		if err != nil {
			return nil, fmt.Errorf("report: %s: %w", name, err)
		}
		k.Add(e)
	}
}

// LoadMarks reads the marks of the event log at path (ReadMarks).
func LoadMarks(path string) ([]Mark, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	defer f.Close()
	return ReadMarks(path, f)
}
