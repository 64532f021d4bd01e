package nccl

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/kernels/cuda"
)

// ready makes the communicator name of all ranks on every rank.
func ready(t *testing.T, rs []*rank, name string) []comm.Communicator {
	t.Helper()
	cs := make([]comm.Communicator, len(rs))
	mustAll(t, len(rs), func(r int) error {
		c, err := rs[r].f.Communicator(name, allRanks(len(rs)))
		if err != nil {
			return err
		}
		cs[r] = c
		return rs[r].f.Ready(context.Background())
	})
	return cs
}

// aborted reports whether every NCCL communicator of fk's ranks rs is
// aborted.
func aborted(fk *fake, rs []*rank) bool {
	fk.mu.Lock()
	defer fk.mu.Unlock()
	for _, r := range rs {
		if !r.f.root.(*fhandle).aborted {
			return false
		}
		for _, c := range r.f.decls {
			if c.h != nil && !c.h.(*fhandle).aborted {
				return false
			}
		}
	}
	return true
}

// TestUnpairedSendsTimeOut: two pipeline neighbours that each send before
// they receive hang on NCCL (a send waits for its receive); the host
// returns at once, the record shows both in the Send, and the watchdog
// ends the fabric after the timeout with an error naming the rank, the
// communicator and the operation, every communicator aborted. The same
// exchange as one Exchange goes through.
func TestUnpairedSendsTimeOut(t *testing.T) {
	const timeout = 300 * time.Millisecond
	fk := newFake(t)
	rs := fabrics(t, fk, 2, timeout)
	cs := ready(t, rs, "pp")
	ctx := context.Background()

	mustAll(t, 2, func(r int) error {
		send, recv := rs[r].Float32s(5), rs[r].Float32s(5)
		send[0] = float32(r + 1)
		if err := cs[r].Exchange(ctx, []comm.Transfer{{Peer: 1 - r, Buf: send}}, []comm.Transfer{{Peer: 1 - r, Buf: recv}}); err != nil {
			return err
		}
		if err := rs[r].Sync(); err != nil {
			return err
		}
		if recv[0] != float32(2-r) {
			t.Errorf("rank %d received %g, want %d", r, recv[0], 2-r)
		}
		return nil
	})

	t0 := time.Now()
	mustAll(t, 2, func(r int) error {
		// Device buffers: queued, so the host goes on at once.
		if err := cs[r].Send(ctx, rs[r].Float32s(5), 1-r); err != nil {
			return err
		}
		return cs[r].Recv(ctx, rs[r].Float32s(5), 1-r)
	})
	if d := time.Since(t0); d > timeout/2 {
		t.Errorf("issuing took %v: the host waited", d)
	}
	time.Sleep(timeout / 3)
	for r, rk := range rs {
		p := rk.f.Progress()
		if len(p.InFlight) != 1 || p.InFlight[0].String() != "Send #2 (pp)" || p.Last.String() != "Exchange #1 (pp)" || p.Done != 1 {
			t.Errorf("rank %d's progress in the hang: %+v", r, p)
		}
	}
	for r, rk := range rs {
		var err error
		for end := time.Now().Add(10 * timeout); err == nil && time.Now().Before(end); time.Sleep(timeout / 10) {
			err = rk.f.Err()
		}
		var oe *OpError
		if !errors.As(err, &oe) || oe.Rank != r || oe.Op.String() != "Send #2 (pp)" || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("rank %d: %v, want a timeout of Send #2 (pp)", r, err)
		}
		if !strings.Contains(err.Error(), "nccl: rank ") || !strings.Contains(err.Error(), "Send #2 (pp)") {
			t.Errorf("rank %d: %q does not name the rank and operation", r, err)
		}
		// Every later operation fails with it, without calling NCCL.
		if err2 := cs[r].AllReduce(ctx, rs[r].Float32s(3)); !errors.Is(err2, context.DeadlineExceeded) {
			t.Errorf("rank %d: an operation after the failure: %v", r, err2)
		}
	}
	if !aborted(fk, rs) {
		t.Error("not every communicator was aborted")
	}
	if len(fk.calls) > 0 {
		t.Errorf("NCCL calls on aborted communicators: %v", fk.calls)
	}
}

// TestFirstOperationInitTimeout: a communicator's first operation, inside
// which NCCL connects to the peers, has the InitTimeout, not the steady
// Timeout: two pipeline neighbours whose first operations are unpaired
// sends are still waiting well past the Timeout, and fail once the
// InitTimeout has passed, the error saying which bound it was.
func TestFirstOperationInitTimeout(t *testing.T) {
	const timeout, initTimeout = 200 * time.Millisecond, 1500 * time.Millisecond
	fk := newFake(t)
	rs := fabricsWith(t, fk, 2, Options{Timeout: timeout, InitTimeout: initTimeout})
	cs := ready(t, rs, "pp")
	ctx := context.Background()
	t0 := time.Now()
	mustAll(t, 2, func(r int) error {
		return cs[r].Send(ctx, rs[r].Float32s(5), 1-r)
	})
	time.Sleep(4 * timeout)
	for r, rk := range rs {
		if err := rk.f.Err(); err != nil {
			t.Fatalf("rank %d failed %v after its first operation began, within the init timeout %v: %v", r, time.Since(t0), initTimeout, err)
		}
	}
	for r, rk := range rs {
		var err error
		for end := time.Now().Add(3 * initTimeout); err == nil && time.Now().Before(end); time.Sleep(timeout / 4) {
			err = rk.f.Err()
		}
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "Send #1 (pp)") || !strings.Contains(err.Error(), initTimeout.String()) {
			t.Fatalf("rank %d: %v, want Send #1 (pp) timed out after %v", r, err, initTimeout)
		}
		if d := time.Since(t0); d < initTimeout {
			t.Errorf("rank %d failed after %v, before the init timeout %v", r, d, initTimeout)
		}
	}
}

// TestAsyncErrorAborts: a rank that aborts its communicators (as a
// failing process does) gives its peers, over a network, an asynchronous
// ncclRemoteError: their watchdog sees it while an operation waits, and
// their fabric fails naming that operation, long before the timeout.
func TestAsyncErrorAborts(t *testing.T) {
	fk := newFake(t)
	fk.remoteErrors = true
	rs := fabrics(t, fk, 3, time.Minute)
	cs := ready(t, rs, "dp")
	ctx := context.Background()
	// Ranks 0 and 1 all-reduce; rank 2 fails instead.
	for r := range 2 {
		if err := cs[r].AllReduce(ctx, rs[r].Float32s(8)); err != nil {
			t.Fatal(err)
		}
	}
	rs[2].f.fail(errors.New("rank 2 failed"))
	for r := range 2 {
		err := rs[r].Sync()
		for end := time.Now().Add(10 * time.Second); err == nil && time.Now().Before(end); time.Sleep(time.Millisecond) {
			err = rs[r].f.Err()
		}
		var oe *OpError
		var ce *cuda.Error
		if !errors.As(err, &oe) || oe.Op.String() != "AllReduce #1 (dp)" || !errors.As(err, &ce) || ce.Name != "ncclRemoteError" {
			t.Errorf("rank %d: %v, want ncclRemoteError in AllReduce #1 (dp)", r, err)
		}
	}
}

// TestWorldFailureNamesPeer: when the TCP World fails because a member is
// gone, the fabric fails with it, wrapping the World's PeerError, which
// names that member (NCCL cannot), and the operation it waited in.
func TestWorldFailureNamesPeer(t *testing.T) {
	fk := newFake(t)
	rs := fabrics(t, fk, 3, 2*time.Second)
	cs := ready(t, rs, "dp")
	ctx := context.Background()
	if err := cs[0].AllReduce(ctx, rs[0].Float32s(8)); err != nil {
		t.Fatal(err)
	}
	// Rank 0 waits on rank 2 in the control plane too; rank 2 leaves.
	g, err := rs[0].w.Group([]int{0, 2})
	if err != nil {
		t.Fatal(err)
	}
	go g.AllReduce64(ctx, []float64{1})
	time.Sleep(50 * time.Millisecond)
	rs[2].w.Close()
	err = nil
	for end := time.Now().Add(10 * time.Second); err == nil && time.Now().Before(end); time.Sleep(time.Millisecond) {
		err = rs[0].f.Err()
	}
	var pe *comm.PeerError
	var oe *OpError
	if !errors.As(err, &pe) || pe.Rank != 2 || !errors.As(err, &oe) || oe.Op.String() != "AllReduce #1 (dp)" {
		t.Errorf("rank 0: %v, want rank 2's PeerError in AllReduce #1 (dp)", err)
	}
	if !aborted(fk, rs[:1]) {
		t.Error("rank 0's communicators were not aborted")
	}
}

// TestCancelAborts: canceling the context of a blocking operation in
// flight (a host buffer, so the host waits) aborts the fabric: the
// operation could not be taken back on the other members.
func TestCancelAborts(t *testing.T) {
	fk := newFake(t)
	rs := fabrics(t, fk, 2, time.Minute)
	cs := ready(t, rs, "mp")
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		time.Sleep(50 * time.Millisecond)
		cancel(errors.New("interrupted"))
	}()
	err := cs[0].AllReduce64(ctx, []float64{1, 2}) // rank 1 never joins
	var oe *OpError
	if !errors.As(err, &oe) || oe.Op.String() != "AllReduce64 #1 (mp)" || !strings.Contains(err.Error(), "interrupted") {
		t.Errorf("canceled: %v", err)
	}
	if !aborted(fk, rs[:1]) {
		t.Error("rank 0's communicators were not aborted")
	}
}

// TestCallErrors: an NCCL call that fails ends the fabric with the
// library's error, naming the operation; a communicator used before Ready,
// declared after it, or with bad arguments fails without ending it.
func TestCallErrors(t *testing.T) {
	fk := newFake(t)
	rs := fabrics(t, fk, 2, time.Minute)
	c, err := rs[0].f.Communicator("dp", []int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AllReduce(context.Background(), rs[0].Float32s(2)); err == nil || !strings.Contains(err.Error(), "before Fabric.Ready") {
		t.Errorf("before Ready: %v", err)
	}
	for _, bad := range [][]int{{1}, {1, 0}, {0, 2}} {
		if _, err := rs[0].f.Communicator("x", bad); err == nil {
			t.Errorf("ranks %v accepted", bad)
		}
	}
	c1, _ := rs[1].f.Communicator("dp", []int{0, 1})
	mustAll(t, 2, func(r int) error { return rs[r].f.Ready(context.Background()) })
	if _, err := rs[0].f.Communicator("late", []int{0, 1}); err == nil {
		t.Error("a communicator declared after Ready was accepted")
	}
	if err := c.ReduceScatter(context.Background(), make([]float32, 3), make([]float32, 2)); err == nil || rs[0].f.Err() != nil {
		t.Errorf("ReduceScatter 3 into 2: %v, fabric %v", err, rs[0].f.Err())
	}
	if err := c.Send(context.Background(), make([]float32, 3), 0); err == nil || rs[0].f.Err() != nil {
		t.Errorf("Send to oneself: %v, fabric %v", err, rs[0].f.Err())
	}
	fk.inject = func(rank int, call string) error {
		if call == "ncclAllReduce" {
			return &cuda.Error{Op: call, Code: 1, Name: "ncclUnhandledCudaError"}
		}
		return nil
	}
	err = c1.AllReduce(context.Background(), rs[1].Float32s(2))
	var oe *OpError
	var ce *cuda.Error
	if !errors.As(err, &oe) || oe.Op.String() != "AllReduce #1 (dp)" || oe.Rank != 1 || !errors.As(err, &ce) || ce.Code != 1 {
		t.Errorf("a failed ncclAllReduce: %v", err)
	}
	if !aborted(fk, rs[1:]) {
		t.Error("rank 1's communicators were not aborted")
	}
}

// TestPlan: the splits come from the ranks' declarations in one order for
// every rank; declarations that do not fit together are refused, naming
// the ranks.
func TestPlan(t *testing.T) {
	d := func(name string, ranks ...int) decl { return decl{name, ranks} }
	// pp4 with the tied embedding between its ends, and pp's second
	// communicator of the same name.
	all := [][]decl{
		{d("pp", 0, 1, 2, 3), d("pp", 0, 1, 2, 3), d("tied", 0, 3)},
		{d("pp", 0, 1, 2, 3), d("pp", 0, 1, 2, 3)},
		{d("pp", 0, 1, 2, 3), d("pp", 0, 1, 2, 3)},
		{d("pp", 0, 1, 2, 3), d("pp", 0, 1, 2, 3), d("tied", 0, 3)},
	}
	for r, want := range []string{"pp:0/0 pp#1:0/0 tied:0/0", "pp:0/1 pp#1:0/1 tied:-", "pp:0/2 pp#1:0/2 tied:-", "pp:0/3 pp#1:0/3 tied:0/1"} {
		ss, err := plan(r, all)
		if err != nil || splitsString(ss) != want {
			t.Errorf("rank %d: %s (%v), want %s", r, splitsString(ss), err, want)
		}
	}
	for _, tc := range []struct {
		all  [][]decl
		want string
	}{
		{[][]decl{{d("dp", 0, 1)}, {}}, "rank 0 declared communicator dp with ranks [0 1], but rank 1 did not declare it"},
		{[][]decl{{d("dp", 0, 1)}, {d("dp", 1)}}, "rank 0 declared communicator dp with ranks [0 1], but rank 1 with ranks [1]"},
		{[][]decl{{d("dp", 0, 1)}, {d("dp", 0, 1), d("dp", 0, 1)}}, "rank 1 declared communicator dp#1 with ranks [0 1], but rank 0 did not declare it"},
		{[][]decl{{d("dp", 1)}, {d("dp", 1)}}, "rank 0 declared communicator dp with ranks [1], without itself"},
		{[][]decl{{d("dp", 0, 2)}, {}}, "outside the world of 2"},
	} {
		if _, err := plan(0, tc.all); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.all, err, tc.want)
		}
	}
}
