package engine

import (
	"context"
	"fmt"

	"github.com/gptui/gptui/comm"
)

// StopError is the error of a run that stopped because Options.Stop was
// closed: every rank finished the steps before Step, and the run saved them
// (Checkpoint; empty when saving is off or no step ran). A stop is a
// cancellation: errors.Is(err, context.Canceled) holds.
type StopError struct {
	Step       int    // the first step not run
	Checkpoint string // the checkpoint of the finished steps, on the rank that wrote it
}

func (e *StopError) Error() string {
	if e.Checkpoint != "" {
		return fmt.Sprintf("stopped before step %d; checkpoint %s", e.Step, e.Checkpoint)
	}
	return fmt.Sprintf("stopped before step %d", e.Step)
}

// Is reports that a stop is a cancellation.
func (e *StopError) Is(target error) bool { return target == context.Canceled }

// stopper agrees on stops across the ranks of a job: at each step
// boundary every rank adds its flag (1 when its Stop channel is closed)
// into one all-reduce over the world, so all of them stop before the same
// step however far apart their signals arrived.
type stopper struct {
	stop  <-chan struct{} // nil: never
	world *comm.Group     // every rank; nil for one process or without stop
}

func newStopper(w *comm.World, stop <-chan struct{}) (*stopper, error) {
	s := &stopper{stop: stop}
	if w == nil || w.Size() == 1 || stop == nil {
		return s, nil
	}
	g, err := w.WorldGroup("stop")
	if err != nil {
		return nil, err
	}
	s.world = g
	return s, nil
}

// requested reports whether any rank asked to stop. It runs one 8-byte
// all-reduce over the world per call when the job has more than one rank.
func (s *stopper) requested(ctx context.Context) (bool, error) {
	flag := 0.0
	select {
	case <-s.stop:
		flag = 1
	default:
	}
	if s.world == nil {
		return flag > 0, nil
	}
	n, err := sum64(ctx, s.world, flag, "agreeing on a stop")
	return n > 0, err
}
