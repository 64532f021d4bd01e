package nccl

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/kernels/cuda"
)

// The host's record of the operations it issued. NCCL runs them on the
// device, after the kernels queued before them, and says nothing of them
// to the host; the fabric brackets each with two events (pre, post) on its
// stream and a watchdog goroutine asks the device (cuEventQuery) which of
// them have passed, every poll. So the record knows, as far as the host
// can, which operation of which communicator runs now, for how long, and
// which finished last: the same report as the TCP ring's (comm.Progress),
// from which the launcher names a stuck rank. The watchdog also ends the
// fabric (every communicator aborted) on the first of:
//
//   - an operation running longer than the timeout (its pre event passed,
//     its post event not), or a rank inside an NCCL call that long; a
//     communicator's first operation, inside which NCCL connects to the
//     peers, has the longer InitTimeout;
//   - the context of a blocking operation ending before it finished;
//   - an asynchronous error of a communicator (ncclCommGetAsyncError: a
//     peer's connection broke, a peer aborted);
//   - the World failing: its heartbeats notice a member that is gone, and
//     name it (*comm.PeerError), which NCCL cannot.

// The states of an operation.
const (
	issuing = iota // the host is inside the NCCL calls
	queued         // on the stream, behind the work queued before it
	started        // its pre event has passed: it runs on the device
	done           // its post event has passed
)

// op is an operation as the record knows it.
type op struct {
	c         *Comm
	st        comm.OpStatus   // Since: when it was issued, from its start when it started
	ctx       context.Context // a blocking operation's, whose end aborts the fabric; nil for AllReduceAsync
	state     int
	pre, post cuda.Event
}

// record is the bookkeeping of the operations (under Fabric.mu).
type record struct {
	ops  []*op // issued and not seen done, in issue order
	done int64
	busy time.Duration
	last comm.OpStatus
}

// begin records that c issues operation name (before its calls).
func (f *Fabric) begin(c *Comm, name string, ctx context.Context) (*op, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	c.seq++
	o := &op{c: c, st: comm.OpStatus{Group: c.name, Op: name, Seq: c.seq, Since: time.Now()}, ctx: ctx}
	f.ops = append(f.ops, o)
	return o, nil
}

// queue runs issue, which queues o's NCCL calls on stream s, between o's
// pre and post events.
func (f *Fabric) queue(o *op, s cuda.Stream, issue func() error) error {
	pre, err := f.event()
	if err != nil {
		return f.opFailed(o, err)
	}
	post, err := f.event()
	if err != nil {
		f.release(pre)
		return f.opFailed(o, err)
	}
	f.mu.Lock()
	o.pre, o.post = pre, post
	f.mu.Unlock()
	if err := f.lib.Record(pre, s); err != nil {
		return f.opFailed(o, err)
	}
	if err := issue(); err != nil {
		return f.opFailed(o, err)
	}
	if err := f.lib.Record(post, s); err != nil {
		return f.opFailed(o, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	o.state = queued
	return nil
}

// opFailed ends the fabric with o's failure and returns the fabric's
// error (o's, unless another failure came first).
func (f *Fabric) opFailed(o *op, err error) error {
	f.fail(&OpError{Rank: f.w.Rank(), Op: o.st, Err: err})
	return f.Err()
}

// event returns a free event.
func (f *Fabric) event() (cuda.Event, error) {
	f.mu.Lock()
	if n := len(f.events); n > 0 {
		e := f.events[n-1]
		f.events = f.events[:n-1]
		f.mu.Unlock()
		return e, nil
	}
	f.mu.Unlock()
	return f.lib.NewEvent()
}

// release returns an event to the free list.
func (f *Fabric) release(e cuda.Event) {
	f.mu.Lock()
	f.events = append(f.events, e)
	f.mu.Unlock()
}

// look is what one look at an operation in flight found: the operation's
// state and events when the look began (under f.mu), and what the device
// then said of the events (asked without f.mu, so that the queries of a
// sweep over many operations do not hold up the issuing ranks, Progress
// and Wait).
type look struct {
	o         *op
	state     int
	pre, post cuda.Event

	preDone, postDone bool
	err               error // a query's failure
}

// glance begins a look at o (under f.mu).
func glance(o *op) look { return look{o: o, state: o.state, pre: o.pre, post: o.post} }

// query asks the device about l's events, as far as its state needs: the
// pre event of a queued operation, then the post event of one that has
// started. It needs no lock: the events stay o's until o is seen done,
// and settle discards the answers if o has moved on meanwhile.
func (f *Fabric) query(l *look) {
	if l.state == queued {
		if l.preDone, l.err = f.lib.Done(l.pre); l.err != nil || !l.preDone {
			return
		}
	}
	if l.state == queued || l.state == started {
		l.postDone, l.err = f.lib.Done(l.post)
	}
}

// advance asks the device how far o has got (under f.mu) and returns o's
// failure, if it has one: a device error, or running past the timeout.
func (f *Fabric) advance(o *op, now time.Time) error {
	l := glance(o)
	f.query(&l)
	return f.settle(l, now)
}

// settle applies look l, whose queries began at now, to its operation
// (under f.mu) and returns the operation's failure, if it has one: a
// device error, or running past the timeout. A look at an operation that
// another look (wait's, or the watchdog's) has moved on since it began is
// stale and changes nothing: its events may already be another
// operation's.
func (f *Fabric) settle(l look, now time.Time) error {
	o := l.o
	if o.state != l.state || o.pre != l.pre || o.post != l.post {
		return nil
	}
	fail := func(err error) error { return &OpError{Rank: f.w.Rank(), Op: o.st, Err: err} }
	limit, bound := f.timeout, "GPTUI_COMM_TIMEOUT"
	if o.st.Seq == 1 {
		// The communicator's first: NCCL connects inside it.
		limit, bound = f.initTimeout, "GPTUI_COMM_INIT_TIMEOUT, as the communicator's first operation"
	}
	if l.err != nil {
		return fail(l.err)
	}
	switch o.state {
	case issuing:
		if now.Sub(o.st.Since) > limit {
			return fail(fmt.Errorf("inside NCCL for %v (%s; a member of %s is gone or stuck; this rank's NCCL communicators are aborted): %w", limit, bound, o.st.Group, context.DeadlineExceeded))
		}
	case queued:
		if l.preDone {
			o.state, o.st.Since = started, now
		}
	}
	if o.state == started {
		if l.postDone {
			o.state = done
			f.done++
			f.busy += now.Sub(o.st.Since)
			f.last = o.st
			f.events = append(f.events, o.pre, o.post)
			o.pre, o.post = 0, 0
			return nil
		}
		if now.Sub(o.st.Since) > limit {
			return fail(fmt.Errorf("running for %v without finishing (%s; a member of %s is gone or stuck; this rank's NCCL communicators are aborted): %w", limit, bound, o.st.Group, context.DeadlineExceeded))
		}
	}
	if o.state != done && o.ctx != nil && o.ctx.Err() != nil {
		return fail(fmt.Errorf("canceled while in flight, which aborts this rank's NCCL communicators: %w", context.Cause(o.ctx)))
	}
	return nil
}

// sweep advances every operation in flight and drops the finished ones;
// it returns the first failure. It takes f.mu twice, not across the
// device queries: once to glance at the operations in flight, once to
// settle the looks. Operations issued meanwhile wait for the next sweep.
func (f *Fabric) sweep(now time.Time) error {
	f.mu.Lock()
	looks := make([]look, len(f.ops))
	for i, o := range f.ops {
		looks[i] = glance(o)
	}
	f.mu.Unlock()
	for i := range looks {
		f.query(&looks[i])
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var failure error
	for _, l := range looks {
		if failure == nil {
			failure = f.settle(l, now)
		}
	}
	keep := f.ops[:0]
	for _, o := range f.ops {
		if o.state != done {
			keep = append(keep, o)
		}
	}
	clear(f.ops[len(keep):])
	f.ops = keep
	return failure
}

// watch is the watchdog: every poll it sweeps the operations, checks the
// communicators' asynchronous errors and the World, until Close.
func (f *Fabric) watch() {
	defer close(f.stopped)
	t := time.NewTicker(f.poll)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-f.dead:
			return
		case <-t.C:
		}
		if err := f.check(); err != nil {
			f.fail(err)
			return
		}
	}
}

// check is one look of the watchdog.
func (f *Fabric) check() error {
	failure := f.sweep(time.Now())
	f.mu.Lock()
	var oldest *op
	if len(f.ops) > 0 {
		oldest = f.ops[0]
	}
	hs := slices.Clone(f.handles)
	f.mu.Unlock()
	if failure != nil {
		return failure
	}
	if err := f.w.Err(); err != nil {
		if oldest != nil {
			return &OpError{Rank: f.w.Rank(), Op: oldest.st, Err: err}
		}
		return fmt.Errorf("nccl: rank %d: the job's World ended: %w", f.w.Rank(), err)
	}
	for _, h := range hs {
		if err := f.lib.AsyncError(h); err != nil {
			// Name the operation of that communicator this rank waits
			// in, else the oldest it waits in (an error of the world
			// communicator is every communicator's).
			f.mu.Lock()
			var st comm.OpStatus
			for _, o := range f.ops {
				if o.c.handleIs(h) {
					st = o.st
					break
				}
			}
			if st.Op == "" && len(f.ops) > 0 {
				st = f.ops[0].st
			}
			f.mu.Unlock()
			if st.Op == "" {
				return fmt.Errorf("nccl: rank %d: asynchronous error: %w", f.w.Rank(), err)
			}
			return &OpError{Rank: f.w.Rank(), Op: st, Err: err}
		}
	}
	return nil
}

// wait waits on the host until o is done, asking the device itself
// rather than waiting for the watchdog's next look, with ctx: its end
// aborts the fabric, as the operation could not be taken back.
func (f *Fabric) wait(ctx context.Context, o *op) error {
	delay := 10 * time.Microsecond
	t := time.NewTimer(delay)
	defer t.Stop()
	for {
		f.mu.Lock()
		var err error
		if f.err == nil {
			err = f.advance(o, time.Now())
		}
		st, ferr := o.state, f.err
		f.mu.Unlock()
		switch {
		case st == done:
			return nil
		case ferr != nil:
			return ferr
		case err != nil:
			f.fail(err)
			return f.Err()
		}
		select {
		case <-f.dead:
		case <-ctx.Done():
			f.fail(&OpError{Rank: f.w.Rank(), Op: o.st, Err: fmt.Errorf("canceled while in flight, which aborts this rank's NCCL communicators: %w", context.Cause(ctx))})
		case <-t.C:
			delay = min(2*delay, f.poll)
			t.Reset(delay)
		}
	}
}

// Progress returns a snapshot of the fabric's operations, as
// comm.World.Progress does for the TCP ring's: the operations running now
// (on the device, or with the host inside NCCL), the oldest of each
// communicator, the longest-running first. Operations queued behind
// kernels that have not finished are not running: the rank is computing.
func (f *Fabric) Progress() comm.Progress {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := comm.Progress{Done: f.done, Last: f.last, Busy: f.busy}
	seen := map[*Comm]bool{}
	for _, o := range f.ops {
		if (o.state == issuing || o.state == started) && !seen[o.c] {
			seen[o.c] = true
			p.InFlight = append(p.InFlight, o.st)
		}
	}
	slices.SortStableFunc(p.InFlight, func(a, b comm.OpStatus) int { return a.Since.Compare(b.Since) })
	return p
}
