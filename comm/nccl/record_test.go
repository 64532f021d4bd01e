package nccl

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/kernels/cuda"
)

// TestWatchdogQueriesWithoutLock: the watchdog asks the device about the
// operations in flight without holding the fabric's lock. While its query
// of an AllReduceAsync's event hangs, Progress — which takes the lock, as
// every operation's issue does — still answers; once the query returns,
// the operation is seen done.
func TestWatchdogQueriesWithoutLock(t *testing.T) {
	fk := newFake(t)
	worlds := connect(t, 1, 10*time.Second)
	lib := fk.lib(0)
	var gate atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	var released atomic.Bool
	unblock := func() {
		if released.CompareAndSwap(false, true) {
			close(release)
		}
	}
	done := lib.Done
	lib.Done = func(e cuda.Event) (bool, error) {
		if gate.CompareAndSwap(true, false) { // the first query after the gate opens
			close(entered)
			<-release
		}
		return done(e)
	}
	s, err := lib.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	f, err := New(ctx, worlds[0], Options{Lib: lib, Stream: s, Timeout: 10 * time.Second, Poll: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	t.Cleanup(unblock) // before Close, which waits for the watchdog
	c, err := f.Communicator("dp", []int{0})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	before := f.Progress().Done

	gate.Store(true)
	req := c.AllReduceAsync(fk.float32s(8)) // no Wait yet: only the watchdog queries its events
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the watchdog never asked the device about the AllReduceAsync")
	}
	got := make(chan comm.Progress, 1)
	go func() { got <- f.Progress() }()
	select {
	case <-got:
	case <-time.After(2 * time.Second):
		t.Error("Progress waited for the watchdog's device query: the watchdog holds the fabric's lock across it")
	}
	unblock()
	if err := req.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		p := f.Progress()
		if p.Done > before && len(p.InFlight) == 0 && len(f.ops) == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the AllReduceAsync was never seen done: %+v", p)
		}
	}
	if err := f.Err(); err != nil {
		t.Fatal(err)
	}
}

// TestStaleLookChangesNothing: a look whose operation another look has
// moved on since it began (wait's, while the watchdog queried) is
// discarded: the operation's events, already recycled, are not given
// back twice and the operation is not counted twice.
func TestStaleLookChangesNothing(t *testing.T) {
	f := &Fabric{timeout: time.Minute, initTimeout: time.Minute}
	o := &op{st: comm.OpStatus{Group: "dp", Op: "AllReduce", Seq: 2, Since: time.Now()}, state: queued, pre: 1, post: 2}
	f.ops = []*op{o}
	l := glance(o)
	l.preDone, l.postDone = true, true
	// Another look finishes o first, and its events go to the free list.
	other := glance(o)
	other.preDone, other.postDone = true, true
	if err := f.settle(other, time.Now()); err != nil || o.state != done || f.done != 1 || len(f.events) != 2 {
		t.Fatalf("the first look: %v, state %d, %d done, free events %v", err, o.state, f.done, f.events)
	}
	if err := f.settle(l, time.Now()); err != nil || f.done != 1 || len(f.events) != 2 {
		t.Errorf("the stale look: %v, %d done, free events %v; want it discarded", err, f.done, f.events)
	}
}
