package jobdir

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/gptui/gptui/event"
)

// Attach follows the job in the folder dir for a view of it (the terminal
// UI's runner of a detached job): its events are the job's event log from
// offset from on (0: the whole job, replayed) and its samples as they
// come, until the job has ended (see Follow); Stop and Restart go through
// the job's control socket; Detach stops following. Canceling ctx does too.
func Attach(ctx context.Context, dir string, from int64) *Attached {
	r := &Attached{dir: dir}
	r.read.Store(from)
	var fctx context.Context
	fctx, r.cancel = context.WithCancel(ctx)
	r.events = follow(fctx, dir, from, &r.read)
	return r
}

// Attached is a view's hold on a job run by its own supervisor.
type Attached struct {
	dir    string
	events <-chan event.Event
	cancel context.CancelFunc
	read   atomic.Int64 // the event log's offset past the last event sent
}

// Next waits, once Events is closed at the job's end, until the job runs
// again — 'gptui restart', or the dashboard's r in another view, gave it
// a new supervisor that writes on in its event log — and returns what
// follows it from the first event after those already sent. It returns
// ctx's error if ctx ends first. Call it only once Events is closed:
// before, the events still on their way would be sent again.
func (r *Attached) Next(ctx context.Context) (*Attached, error) {
	from := r.read.Load()
	t := time.NewTicker(followEvery)
	defer t.Stop()
	for {
		if fi, err := os.Stat(filepath.Join(r.dir, EventsFile)); err == nil && fi.Size() > from {
			return Attach(ctx, r.dir, from), nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// Events returns the job's events; the channel is closed after the job's
// end, or once the view detaches.
func (r *Attached) Events() <-chan event.Event { return r.events }

// call sends op to the job's supervisor.
func (r *Attached) call(op string) error {
	j, err := Read(r.dir)
	if err != nil {
		return err
	}
	if !j.Alive {
		return fmt.Errorf("job %s is not running (%s)", j.ID, j.State())
	}
	return Call(j.Supervisor.Socket, op)
}

// Stop stops the job as 'gptui stop' does: its workers save their
// finished steps and exit. The events go on to the job's end.
func (r *Attached) Stop() { _ = r.call(OpStop) }

// Restart stops the job's gang with a checkpoint and starts it again from
// it, in the same job.
func (r *Attached) Restart() error { return r.call(OpRestart) }

// Detach stops following the job, which runs on; Events is then closed.
func (r *Attached) Detach() { r.cancel() }

// ID returns the job's id.
func (r *Attached) ID() string { return filepath.Base(r.dir) }
