package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/event"
)

// saver keeps a run's checkpoints on Engine.save_load's schedule: every
// save_steps steps and after the last, and before a stop. A save is
// synchronous, or with save_load.async a copy of each rank's share that
// the rank writes in the background while training goes on: at most one
// is in flight, the next save waits for it, and its error is the next
// save's, the next collect's or the run's end's.
type saver struct {
	tr      *Trainer
	res     *Result      // its Checkpoint is the last one written
	every   int          // save_steps; 0: no saves
	saved   int          // the last step saved; -1 none
	pending *pendingSave // the save in flight, if any
}

func (tr *Trainer) newSaver(res *Result) *saver {
	return &saver{tr: tr, res: res, every: tr.Cfg.Engine.SaveLoad.SaveSteps, saved: -1}
}

// after saves step when the schedule says so (step is 0-based, the
// checkpoint is named after step+1).
func (s *saver) after(ctx context.Context, step int) error {
	last := step == s.tr.Cfg.Engine.MaxSteps-1
	if s.every > 0 && ((step+1)%s.every == 0 || last) {
		return s.save(ctx, step)
	}
	return nil
}

// saveFinished saves the steps finished before step, unless saving is off,
// none ran or they are saved already: what a stop keeps.
func (s *saver) saveFinished(ctx context.Context, step int) error {
	if s.every > 0 && step > s.tr.start && s.saved != step-1 {
		return s.save(ctx, step-1)
	}
	return nil
}

// save writes the checkpoint of the state after step, whatever ctx says:
// a stop or an interrupt still saves.
func (s *saver) save(ctx context.Context, step int) error {
	tr := s.tr
	ctx = context.WithoutCancel(ctx)
	s.saved = step
	t0 := time.Now()
	if tr.Cfg.Engine.SaveLoad.Async {
		if err := s.collect(true); err != nil {
			return err
		}
		rs, err := tr.beginSave(ctx, step, true)
		if err != nil {
			return fmt.Errorf("saving checkpoint: %w", err)
		}
		var commit func(*rankSave) (string, error)
		if tr.ckpt == nil {
			commit = func(rs *rankSave) (string, error) { return tr.commitSave(context.WithoutCancel(ctx), rs) }
		}
		s.pending = startWrite(rs, time.Since(t0), commit)
		if tr.topo.Rank == 0 {
			tr.log.logf("%s", checkpoint.SavingLine(s.pending.step))
			tr.onCheckpoint(event.CheckpointSaving, s.pending.step, "")
		}
		return nil
	}
	dir, err := tr.Save(ctx, step)
	if err != nil {
		return fmt.Errorf("saving checkpoint: %w", err)
	}
	if dir != "" {
		s.res.Checkpoint = dir
		tr.log.logf("%s", checkpoint.SavedLine(step+1, dir, fmt.Sprintf("blocked the step %.1f ms", ms(time.Since(t0)))))
		tr.onCheckpoint(event.CheckpointSaved, step+1, dir)
	}
	return nil
}

// collect reports the background save, if there is one and it has
// finished or wait is set (then it waits for it), and returns its error.
//
// The ranks commit a save together: without wait, once every rank has
// written its file (one all-reduce of a flag per call while it is in
// flight); every rank calls collect at the same points, so the ranks
// decide alike.
func (s *saver) collect(wait bool) error {
	p := s.pending
	if p == nil {
		return nil
	}
	if !wait {
		// Every rank's answer is the all-reduce's, whatever its own write
		// did: a rank whose write is done must not commit alone.
		all, err := s.tr.allWritten(context.Background(), p.finished())
		if err != nil || !all {
			return err
		}
	}
	if !p.finished() {
		s.tr.log.logf("[checkpoint] waiting for the save of step %d in flight", p.step)
	}
	<-p.done
	s.pending = nil
	if !p.committed {
		p.dir, p.err = s.tr.commitSave(context.Background(), p.rs)
	}
	if p.dir == "" && p.err == nil {
		return nil // rank 0 publishes it
	}
	if p.err != nil {
		return fmt.Errorf("saving checkpoint in the background: %w", p.err)
	}
	s.res.Checkpoint = p.dir
	s.tr.log.logf("%s", checkpoint.SavedLine(p.step, p.dir, fmt.Sprintf("blocked the step %.1f ms; write %.1f ms in background", ms(p.blocked), ms(p.write))))
	s.tr.onCheckpoint(event.CheckpointSaved, p.step, p.dir)
	return nil
}

// pendingSave is a checkpoint being written in the background.
type pendingSave struct {
	rs        *rankSave     // this rank's share of the save
	committed bool          // published by the writer (one process): dir and err are its
	step      int           // the step saved (1-based, as in its directory name)
	blocked   time.Duration // what the snapshot cost the step loop
	done      chan struct{} // closed when dir, err and write are set
	dir       string
	err       error
	write     time.Duration
}

// startWrite writes this rank's file of the parallel save rs in a
// background goroutine, and collect commits it; a single process (commit
// set) publishes it in the goroutine too, its commit needing no other
// rank.
func startWrite(rs *rankSave, blocked time.Duration, commit func(*rankSave) (string, error)) *pendingSave {
	p := &pendingSave{rs: rs, step: rs.step, blocked: blocked, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		t0 := time.Now()
		rs.write()
		if commit != nil {
			p.dir, p.err = commit(rs)
			p.committed = true
		}
		p.write = time.Since(t0)
	}()
	return p
}

// finished reports whether the save has ended, without waiting.
func (p *pendingSave) finished() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}
