package report

import (
	"cmp"
	"fmt"
	"image/color"
	"io"
	"os"
	"slices"
	"strings"

	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/gptui/gptui/event"
)

// Kinds of Mark.
const (
	MarkStop    = "stop"    // the job was stopped on request (gptui stop, the UI's s, an interrupt, a requested restart)
	MarkFailure = "failure" // the job failed (a worker failed or was killed), or an attempt of it did
	MarkHang    = "hang"    // the launcher found the job hung
	MarkLost    = "lost"    // a node was lost
	MarkRestart = "restart" // the job was restarted, or resumed, from a step
	MarkDrop    = "drop"    // nodes that stayed unreachable were left out and the job re-planned for the others
	MarkReplan  = "replan"  // the job was re-planned: another strategy, or another step to resume from
)

// Mark is an event of the run drawn across every panel at its step: a
// stop, a failure, a hang or a lost node at the step the job had reached,
// a restart, a drop or a re-plan at the step it resumed from.
type Mark struct {
	Step  int
	Kind  string // one of the Mark* kinds
	Label string // what happened, in a few words
}

// Marker finds the marks of a run in its events (package event), given in
// the order they happened: the job's events "stopped", "hung", "failed",
// "restarting" and "replanned" and a node's "lost", each at the step the
// job had reached (the newest step of its metrics or progress events), a
// restart also at the step it resumed from. An attempt's end is marked
// once: a stop, a hang, a lost node or a failure, whichever came first; a
// restart someone asked for (event.Restart.Requested) ends its attempt
// with a stop, not a failure. A re-plan after nodes were lost or failed
// since the attempt started is a drop of those nodes. The zero Marker is
// ready to use.
type Marker struct {
	step   int      // the newest step of the attempt
	marked bool     // the attempt's end is marked
	down   []string // the nodes lost or failed since the attempt started
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
		switch e.State {
		case event.NodeLost:
			k.nodeDown(e.Node)
			k.end(MarkLost, e.Node)
		case event.NodeFailed:
			k.nodeDown(e.Node)
		case event.NodeReady, event.NodeBack:
			k.down = slices.DeleteFunc(k.down, func(n string) bool { return n == e.Node })
		}
	case event.KindJob:
		switch e.State {
		case event.JobStarted:
			k.down = k.down[:0]
		case event.JobStopped:
			k.end(MarkStop, cmp.Or(e.Message, "the job was stopped"))
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
			if e.Restart.Requested {
				k.end(MarkStop, "stopped for a restart on request")
			} else {
				k.end(MarkFailure, e.Restart.Cause)
			}
			k.marks = append(k.marks, restartMark(e.Restart))
			k.step, k.marked = e.Restart.Step, false
		case event.JobReplanned:
			i := len(k.marks) - 1
			switch {
			case e.Restart != nil && i >= 0 && k.marks[i].Kind == MarkRestart:
				// The restart resumes from another step than it named
				// (not every node could hold that checkpoint).
				was := k.marks[i].Step
				k.marks[i] = restartMark(e.Restart)
				k.step = e.Restart.Step
				k.add(MarkReplan, fmt.Sprintf("resumes from step %d, not %d", e.Restart.Step, was))
			case e.Restart != nil:
			case len(k.down) > 0:
				k.add(MarkDrop, strings.Join(k.down, ", ")+" left out, re-planned")
				k.down = k.down[:0]
			default:
				k.add(MarkReplan, cmp.Or(e.Message, "re-planned"))
			}
		}
	}
}

// nodeDown notes that node was lost, or failed.
func (k *Marker) nodeDown(node string) {
	if node != "" && !slices.Contains(k.down, node) {
		k.down = append(k.down, node)
	}
}

// restartMark is the mark of restart r.
func restartMark(r *event.Restart) Mark {
	label := fmt.Sprintf("automatic, %d of %d", r.Count, r.Max)
	if r.Requested {
		label = "on request (gptui restart, the UI's r)"
	}
	return Mark{Step: r.Step, Kind: MarkRestart, Label: label}
}

// Resume notes that the run was started again from step (a resume that
// is no automatic restart: 'gptui train --resume', the UI's r): a restart
// mark, and a new attempt.
func (k *Marker) Resume(step int) {
	k.marks = append(k.marks, Mark{Step: step, Kind: MarkRestart, Label: "resumed"})
	k.step, k.marked, k.down = step, false, k.down[:0]
}

// end marks the end of the attempt, unless it is marked already.
func (k *Marker) end(kind, label string) {
	if k.marked {
		return
	}
	k.marked = true
	k.add(kind, label)
}

// add adds a mark of kind at the attempt's step.
func (k *Marker) add(kind, label string) {
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

// kindName is how the picture names a kind of mark.
func kindName(kind string) string {
	switch kind {
	case MarkLost:
		return "lost node"
	case MarkReplan:
		return "re-plan"
	}
	return kind
}

// markStyle is how a mark of kind is drawn: a colour of its own, none of
// them a colour of palette, and a dash pattern of its own but for the
// failure's and the stop's, solid lines of different colours.
func markStyle(kind string) draw.LineStyle {
	s := draw.LineStyle{Width: vg.Points(2)}
	switch kind {
	case MarkStop:
		s.Color = color.RGBA{0, 0, 170, 255} // navy
	case MarkFailure:
		s.Color = color.RGBA{220, 0, 0, 255} // red
	case MarkHang:
		s.Color, s.Dashes = color.RGBA{230, 170, 0, 255}, []vg.Length{vg.Points(5), vg.Points(2)} // gold
	case MarkLost:
		s.Color, s.Dashes = color.RGBA{0, 0, 0, 255}, []vg.Length{vg.Points(2), vg.Points(2)} // black
	case MarkDrop:
		s.Color, s.Dashes = color.RGBA{0, 120, 120, 255}, []vg.Length{vg.Points(8), vg.Points(2), vg.Points(2), vg.Points(2)} // teal
	case MarkReplan:
		s.Color, s.Dashes = color.RGBA{190, 0, 190, 255}, []vg.Length{vg.Points(3), vg.Points(3)} // magenta
	default:
		s.Color, s.Dashes = color.RGBA{0, 160, 0, 255}, []vg.Length{vg.Points(6), vg.Points(3)} // green
	}
	return s
}
