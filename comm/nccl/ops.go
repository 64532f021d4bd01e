package nccl

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/kernels/cuda"
)

// Comm is a communicator of a [Fabric]: comm.Communicator on NCCL.
//
// Every operation is queued on the rank's compute stream, after the
// kernels queued there before it, and the kernels queued after it see its
// result; an operation on buffers in device memory (the backend's) returns
// as soon as it is queued, as comm.Communicator allows. A buffer in host
// memory (a Go slice of scalars) is staged through a device buffer: the
// operation then waits on the host until it is done, and the host reads
// the result when it returns. AllReduceAsync runs on a second stream, the
// communication stream, after an event recorded on the compute stream, so
// that it overlaps the kernels queued after it; its Wait makes the compute
// stream wait for it (an event again), and the host does not wait.
//
// Sums are NCCL's: the same on every member, in an order of its own
// (AllReduce64 is not added in rank order, as the TCP ring's is).
type Comm struct {
	f     *Fabric
	name  string
	ranks []int
	rank  int
	h     Handle // made by Ready (under f.mu)
	seq   int64  // the operations issued (under f.mu)

	sent, recvd atomic.Int64
}

// Rank is this process's member number.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of members.
func (c *Comm) Size() int { return len(c.ranks) }

// Traffic counts the bytes the operations move, as NCCL's ring algorithm
// moves them (an all-reduce of n bytes sends and receives 2(s−1)/s·n).
func (c *Comm) Traffic() comm.Traffic {
	return comm.Traffic{SentBytes: c.sent.Load(), RecvBytes: c.recvd.Load()}
}

func (c *Comm) count(sent, recvd int) {
	c.sent.Add(int64(sent))
	c.recvd.Add(int64(recvd))
}

// ring is the bytes a member moves each way in a ring pass over n bytes:
// (s−1)/s·n.
func (c *Comm) ring(n int) int { return (c.Size() - 1) * n / c.Size() }

// handleIs reports whether h is c's NCCL communicator (under f.mu).
func (c *Comm) handleIs(h Handle) bool { return c.h == h }

// handle returns c's NCCL communicator, or why it cannot be used.
func (c *Comm) handle(name string) (Handle, error) {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	if c.f.err != nil {
		return nil, c.f.err
	}
	if c.h == nil {
		return nil, fmt.Errorf("nccl: %s on %s before Fabric.Ready made it", name, c.name)
	}
	return c.h, nil
}

// buf is a buffer of an operation.
type buf struct {
	host    unsafe.Pointer // where the caller's buffer is
	bytes   int
	in, out bool          // the operation reads it, writes it
	t       cuda.DataType // its elements: F32, F64, or BF16 for the backend's bfloat16 activations
	staged  bool          // host memory, staged through the device
	p       cuda.Ptr      // the address the operation uses
}

func f32(b []float32, in, out bool) buf {
	return buf{host: unsafe.Pointer(unsafe.SliceData(b)), bytes: 4 * len(b), in: in, out: out, t: cuda.F32}
}

// noHalves refuses a reduction over bfloat16 activations (of element
// types t): sums stay float32 (kernels/activations.go).
func noHalves(name string, t []cuda.DataType) error {
	for _, x := range t {
		if x == cuda.BF16 {
			return fmt.Errorf("nccl: %s of bfloat16 activations: sums are float32 (give it float32 buffers)", name)
		}
	}
	return nil
}

// same is the one element type of a gather's buffers.
func same(name string, t []cuda.DataType) (cuda.DataType, error) {
	if t[0] != t[1] {
		return 0, fmt.Errorf("nccl: %s from %s into %s: both buffers must hold one type (bfloat16 activations, or float32s)", name, t[0], t[1])
	}
	return t[0], nil
}

// stageAlign aligns each buffer's place in the staging buffer.
const stageAlign = 256

// do issues operation name of the communicator on bufs: issue queues its
// NCCL calls on stream s with the buffers' device addresses. See [Comm]
// for when it waits.
//
// A buffer among the backend's bfloat16 activations (Options.Halves) is
// passed at its bfloat16s' address, with type BF16 in t.
func (c *Comm) do(ctx context.Context, name string, bufs []buf, issue func(h Handle, p []cuda.Ptr, t []cuda.DataType, s cuda.Stream) error) error {
	f := c.f
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("nccl: %s (%s): %w", name, c.name, context.Cause(ctx))
	}
	h, err := c.handle(name)
	if err != nil {
		return err
	}
	staged := false
	for i := range bufs {
		b := &bufs[i]
		if b.bytes == 0 { // an empty transfer of an Exchange
			continue
		}
		if f.halves != nil && b.t == cuda.F32 {
			if p, ok := f.halves(b.host, b.bytes); ok {
				b.p, b.t = p, cuda.BF16
				continue
			}
		}
		if f.lib.Reachable(b.host) {
			b.p = cuda.Ptr(uintptr(b.host))
		} else {
			b.staged, staged = true, true
		}
	}
	if staged {
		f.stageMu.Lock()
		defer f.stageMu.Unlock()
		if err := f.stageIn(bufs); err != nil {
			f.fail(fmt.Errorf("nccl: rank %d: %s (%s): staging host memory: %w", f.w.Rank(), name, c.name, err))
			return f.Err()
		}
	}
	o, err := f.begin(c, name, ctx)
	if err != nil {
		return err
	}
	p := make([]cuda.Ptr, len(bufs))
	t := make([]cuda.DataType, len(bufs))
	for i, b := range bufs {
		p[i], t[i] = b.p, b.t
	}
	if err := f.queue(o, f.compute, func() error { return issue(h, p, t, f.compute) }); err != nil {
		return err
	}
	if !staged {
		return nil
	}
	if err := f.wait(ctx, o); err != nil {
		return err
	}
	if err := f.stageOut(bufs); err != nil {
		f.fail(&OpError{Rank: f.w.Rank(), Op: o.st, Err: fmt.Errorf("copying the result to the host: %w", err)})
		return f.Err()
	}
	return nil
}

// stageIn places the host buffers of bufs in the staging buffer (grown
// as needed) and copies in those the operation reads (under stageMu).
func (f *Fabric) stageIn(bufs []buf) error {
	total := 0
	for _, b := range bufs {
		if b.staged {
			total += (b.bytes + stageAlign - 1) / stageAlign * stageAlign
		}
	}
	if total > f.stageN {
		if f.stage != 0 {
			if err := f.lib.Free(f.stage); err != nil {
				return err
			}
			f.stage, f.stageN = 0, 0
		}
		p, err := f.lib.Alloc(total)
		if err != nil {
			return err
		}
		f.stage, f.stageN = p, total
	}
	off := 0
	for i := range bufs {
		b := &bufs[i]
		if !b.staged {
			continue
		}
		b.p = f.stage + cuda.Ptr(off)
		off += (b.bytes + stageAlign - 1) / stageAlign * stageAlign
		if b.in {
			if err := f.lib.CopyHtoD(b.p, b.host, b.bytes); err != nil {
				return err
			}
		}
	}
	return nil
}

// stageOut copies the staged buffers the operation wrote back to the host.
func (f *Fabric) stageOut(bufs []buf) error {
	for _, b := range bufs {
		if b.staged && b.out {
			if err := f.lib.CopyDtoH(b.host, b.p, b.bytes); err != nil {
				return err
			}
		}
	}
	return nil
}

// AllReduce replaces b, on every member, with the sum of the members'.
func (c *Comm) AllReduce(ctx context.Context, b []float32) error {
	n := len(b)
	if n == 0 {
		return nil
	}
	err := c.do(ctx, "AllReduce", []buf{f32(b, true, true)}, func(h Handle, p []cuda.Ptr, t []cuda.DataType, s cuda.Stream) error {
		if err := noHalves("AllReduce", t); err != nil {
			return err
		}
		return c.f.lib.AllReduce(h, p[0], p[0], n, cuda.F32, s)
	})
	if err == nil {
		c.count(2*c.ring(4*n), 2*c.ring(4*n))
	}
	return err
}

// AllReduce64 sums a few float64s over the members (ncclFloat64).
func (c *Comm) AllReduce64(ctx context.Context, b []float64) error {
	n := len(b)
	if n == 0 {
		return nil
	}
	bb := buf{host: unsafe.Pointer(unsafe.SliceData(b)), bytes: 8 * n, in: true, out: true, t: cuda.F64}
	err := c.do(ctx, "AllReduce64", []buf{bb}, func(h Handle, p []cuda.Ptr, _ []cuda.DataType, s cuda.Stream) error {
		return c.f.lib.AllReduce(h, p[0], p[0], n, cuda.F64, s)
	})
	if err == nil {
		c.count(2*c.ring(8*n), 2*c.ring(8*n))
	}
	return err
}

// ReduceScatter leaves in out this member's part of the sum of the
// members' in: len(in) = Size()·len(out); out may be that part of in.
func (c *Comm) ReduceScatter(ctx context.Context, in, out []float32) error {
	if len(in) != c.Size()*len(out) {
		return fmt.Errorf("nccl: ReduceScatter: len(in) = %d, want Size·len(out) = %d", len(in), c.Size()*len(out))
	}
	n := len(out)
	if n == 0 {
		return nil
	}
	err := c.do(ctx, "ReduceScatter", []buf{f32(in, true, false), f32(out, false, true)}, func(h Handle, p []cuda.Ptr, t []cuda.DataType, s cuda.Stream) error {
		if err := noHalves("ReduceScatter", t); err != nil {
			return err
		}
		return c.f.lib.ReduceScatter(h, p[0], p[1], n, s)
	})
	if err == nil {
		c.count(c.ring(4*len(in)), c.ring(4*len(in)))
	}
	return err
}

// AllGather concatenates the members' in, in member order, into out:
// len(out) = Size()·len(in); in may be this member's part of out.
func (c *Comm) AllGather(ctx context.Context, in, out []float32) error {
	if len(out) != c.Size()*len(in) {
		return fmt.Errorf("nccl: AllGather: len(out) = %d, want Size·len(in) = %d", len(out), c.Size()*len(in))
	}
	n := len(in)
	if n == 0 {
		return nil
	}
	err := c.do(ctx, "AllGather", []buf{f32(in, true, false), f32(out, false, true)}, func(h Handle, p []cuda.Ptr, t []cuda.DataType, s cuda.Stream) error {
		dt, err := same("AllGather", t)
		if err != nil {
			return err
		}
		return c.f.lib.AllGather(h, p[0], p[1], n, dt, s)
	})
	if err == nil {
		c.count(c.ring(4*len(out)), c.ring(4*len(out)))
	}
	return err
}

// Send sends b to member to. NCCL's send waits, on the device, for the
// matching Recv: two members that each send before they receive deadlock
// (use Exchange).
func (c *Comm) Send(ctx context.Context, b []float32, to int) error {
	if err := c.checkPeer("Send", to, false); err != nil {
		return err
	}
	n := len(b)
	if n == 0 {
		return nil
	}
	err := c.do(ctx, "Send", []buf{f32(b, true, false)}, func(h Handle, p []cuda.Ptr, t []cuda.DataType, s cuda.Stream) error {
		return c.f.lib.Send(h, p[0], n, t[0], to, s)
	})
	if err == nil {
		c.count(4*n, 0)
	}
	return err
}

// Recv receives into b what member from sends.
func (c *Comm) Recv(ctx context.Context, b []float32, from int) error {
	if err := c.checkPeer("Recv", from, false); err != nil {
		return err
	}
	n := len(b)
	if n == 0 {
		return nil
	}
	err := c.do(ctx, "Recv", []buf{f32(b, false, true)}, func(h Handle, p []cuda.Ptr, t []cuda.DataType, s cuda.Stream) error {
		return c.f.lib.Recv(h, p[0], n, t[0], from, s)
	})
	if err == nil {
		c.count(0, 4*n)
	}
	return err
}

// Exchange issues the sends and receives in one ncclGroupStart/End, so
// that none waits for another: NCCL matches the transfers between two
// members in the order each side issues them. A member may exchange with
// itself (a communicator of one).
func (c *Comm) Exchange(ctx context.Context, sends, recvs []comm.Transfer) error {
	var bufs []buf
	nbytes := [2]int{}
	for _, x := range sends {
		if err := c.checkPeer("Exchange", x.Peer, true); err != nil {
			return err
		}
		bufs = append(bufs, f32(x.Buf, true, false))
		nbytes[0] += 4 * len(x.Buf)
	}
	for _, x := range recvs {
		if err := c.checkPeer("Exchange", x.Peer, true); err != nil {
			return err
		}
		bufs = append(bufs, f32(x.Buf, false, true))
		nbytes[1] += 4 * len(x.Buf)
	}
	if nbytes[0]+nbytes[1] == 0 {
		return nil
	}
	lib := c.f.lib
	err := c.do(ctx, "Exchange", bufs, func(h Handle, p []cuda.Ptr, t []cuda.DataType, s cuda.Stream) error {
		if err := lib.GroupStart(); err != nil {
			return err
		}
		var errs []error
		for i, x := range sends {
			if len(x.Buf) > 0 {
				errs = append(errs, lib.Send(h, p[i], len(x.Buf), t[i], x.Peer, s))
			}
		}
		for i, x := range recvs {
			if len(x.Buf) > 0 {
				errs = append(errs, lib.Recv(h, p[len(sends)+i], len(x.Buf), t[len(sends)+i], x.Peer, s))
			}
		}
		return errors.Join(append(errs, lib.GroupEnd())...)
	})
	if err == nil {
		c.count(nbytes[0], nbytes[1])
	}
	return err
}

// checkPeer checks a peer's member number; self allows this member.
func (c *Comm) checkPeer(name string, peer int, self bool) error {
	if peer < 0 || peer >= c.Size() {
		return fmt.Errorf("nccl: %s: peer %d is outside the communicator [0, %d)", name, peer, c.Size())
	}
	if peer == c.rank && !self {
		return fmt.Errorf("nccl: %s: peer %d is this process", name, peer)
	}
	return nil
}

// AllReduceAsync queues AllReduce on the communication stream, after the
// kernels queued so far on the compute stream, and returns at once. A
// buffer in host memory is reduced before it returns.
func (c *Comm) AllReduceAsync(b []float32) comm.Request {
	bb := f32(b, true, true)
	if len(b) > 0 && !c.f.lib.Reachable(bb.host) {
		return &request{err: c.AllReduce(context.Background(), b)}
	}
	return c.allReduceAsync("AllReduce", len(b), cuda.Ptr(uintptr(bb.host)), cuda.F32)
}

// AllReduceBF16Async queues an all-reduce of b, the backend's bfloat16
// activations (Options.Halves), as ncclBfloat16 — NCCL adds in float32
// and stores each partial sum in bfloat16 — on the communication stream,
// as AllReduceAsync does: half its bytes. A buffer that is not bfloat16
// activations is refused.
func (c *Comm) AllReduceBF16Async(b []float32) comm.Request {
	if len(b) == 0 {
		return &request{}
	}
	bb := f32(b, true, true)
	if c.f.halves != nil {
		if p, ok := c.f.halves(bb.host, bb.bytes); ok {
			return c.allReduceAsync("AllReduceBF16", len(b), p, cuda.BF16)
		}
	}
	return &request{err: fmt.Errorf("nccl: AllReduceBF16 (%s) of %d float32s: the buffer is not the backend's bfloat16 activations", c.name, len(b))}
}

// allReduceAsync queues the all-reduce of the n elements of type t at p,
// in place, on the communication stream after the compute stream's
// kernels so far.
func (c *Comm) allReduceAsync(name string, n int, p cuda.Ptr, t cuda.DataType) comm.Request {
	f := c.f
	if n == 0 {
		return &request{}
	}
	h, err := c.handle(name)
	if err != nil {
		return &request{err: err}
	}
	o, err := f.begin(c, name, nil)
	if err != nil {
		return &request{err: err}
	}
	// The communication stream waits for the compute stream's kernels so
	// far; the kernels queued after go on.
	fork, err := f.event()
	if err == nil {
		err = f.lib.Record(fork, f.compute)
		if err == nil {
			err = f.lib.WaitEvent(f.side, fork)
		}
		f.release(fork) // the wait holds the record it saw
	}
	if err != nil {
		return &request{err: f.opFailed(o, err)}
	}
	if err := f.queue(o, f.side, func() error { return f.lib.AllReduce(h, p, p, n, t, f.side) }); err != nil {
		return &request{err: err}
	}
	size := 4
	if t == cuda.BF16 {
		size = 2
	}
	c.count(2*c.ring(size*n), 2*c.ring(size*n))
	return &request{c: c, o: o}
}

// request is AllReduceAsync's Request.
type request struct {
	c   *Comm
	o   *op   // nil: done, with err
	err error // the failure of an operation that did not start
}

// Wait makes the kernels queued on the compute stream from now on wait
// for the reduction (cuStreamWaitEvent) and returns at once: the host
// reads the result after the backend's Sync.
func (r *request) Wait(ctx context.Context) error {
	if r.o == nil {
		return r.err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("nccl: waiting for %s: %w", r.o.st, context.Cause(ctx))
	}
	f := r.c.f
	f.mu.Lock()
	if r.o.state == done {
		f.mu.Unlock()
		return nil
	}
	if f.err != nil {
		f.mu.Unlock()
		return f.err
	}
	err := f.lib.WaitEvent(f.compute, r.o.post) // under mu: the watchdog recycles the event once done
	st := r.o.st
	f.mu.Unlock()
	if err != nil {
		f.fail(&OpError{Rank: f.w.Rank(), Op: st, Err: err})
		return f.Err()
	}
	return nil
}

// Comm is a comm.Communicator.
var _ comm.Communicator = (*Comm)(nil)
