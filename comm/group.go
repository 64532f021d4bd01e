package comm

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// Group is a communicator for a subset of the World's ranks, made by
// [World.Group]. Members are numbered 0..Size()-1 in ascending world-rank
// order; roots and peers are given as these group-relative numbers.
//
// The operations of a group run one at a time, in the order they were
// issued, on one goroutine of the group; every member must issue the same
// operations in the same order (for Send and Recv: the two members
// involved, in the same order relative to the group's other operations).
// The methods are safe for concurrent use, but operations issued from
// several goroutines at once are ordered by whichever issues first, which
// then must be the same on every member.
//
// A buffer given to an operation belongs to the group until the operation
// is done: until the blocking form returns, or the asynchronous form's
// Request.Wait returns nil or an error other than the Wait context's.
type Group struct {
	w     *World
	id    uint64
	name  string // for diagnostics: World.NamedGroup
	ranks []int
	rank  int
	conns []*conn  // by group rank; nil for this process
	boxes []*inbox // by group rank; nil for this process

	mu    sync.Mutex
	queue []*request
	wake  chan struct{}
	done  chan struct{} // closed when the worker has stopped

	// Worker-only sequence numbers: collectives, and point-to-point frames
	// per peer and direction.
	collSeq          uint32
	sendSeq, recvSeq []uint32
	opSeq            int64 // operations run, for Progress

	sent, recvd atomic.Int64
}

func newGroup(w *World, id uint64, name string, ranks []int, self int) *Group {
	g := &Group{
		w:       w,
		id:      id,
		name:    name,
		ranks:   ranks,
		rank:    self,
		conns:   make([]*conn, len(ranks)),
		boxes:   make([]*inbox, len(ranks)),
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		sendSeq: make([]uint32, len(ranks)),
		recvSeq: make([]uint32, len(ranks)),
	}
	for i, r := range ranks {
		if i != self {
			g.conns[i] = w.conns[r]
			g.boxes[i] = g.conns[i].inbox(id)
		}
	}
	return g
}

// Rank returns this process's index in the group.
func (g *Group) Rank() int { return g.rank }

// Size returns the number of members.
func (g *Group) Size() int { return len(g.ranks) }

// Ranks returns the members' world ranks, ascending.
func (g *Group) Ranks() []int { return slices.Clone(g.ranks) }

// Traffic returns the payload bytes this process has sent and received
// through the group so far. A ring all-reduce of n bytes on s members sends
// and receives 2(s−1)/s·n bytes per member (up to the rounding of the
// chunks when s does not divide the length).
func (g *Group) Traffic() Traffic {
	return Traffic{SentBytes: g.sent.Load(), RecvBytes: g.recvd.Load()}
}

// request is an operation issued on a group: queued for the group's worker,
// which runs the operations one by one.
type request struct {
	name string
	ctx  context.Context // the blocking form's context; Background otherwise
	run  func(*runner) error
	done chan struct{}
	err  error // set before done is closed
}

// Wait implements [Request]. A Wait that returns ctx's error leaves the
// operation running (its buffers still belong to the group); Wait may be
// called again, and by several goroutines.
func (r *request) Wait(ctx context.Context) error {
	select {
	case <-r.done:
		return r.err
	default:
	}
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return fmt.Errorf("comm: waiting for %s: %w", r.name, context.Cause(ctx))
	}
}

func (r *request) finish(err error) {
	r.err = err
	close(r.done)
}

// issue queues an operation for the group's worker.
func (g *Group) issue(ctx context.Context, name string, run func(*runner) error) *request {
	r := &request{name: name, ctx: ctx, run: run, done: make(chan struct{})}
	g.mu.Lock()
	if err := g.w.failure(); err != nil {
		g.mu.Unlock()
		r.finish(err)
		return r
	}
	g.queue = append(g.queue, r)
	g.mu.Unlock()
	select {
	case g.wake <- struct{}{}:
	default:
	}
	return r
}

// failed returns a Request that is already done with err.
func failed(name string, err error) *request {
	r := &request{name: name, done: make(chan struct{})}
	r.finish(err)
	return r
}

// do runs an operation and waits for it. If ctx ends first, the World is
// aborted (the operation may already be under way on the other members),
// which makes the operation end promptly.
func (g *Group) do(ctx context.Context, name string, run func(*runner) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("comm: %s: %w", name, context.Cause(ctx))
	}
	r := g.issue(ctx, name, run)
	select {
	case <-r.done:
	case <-ctx.Done():
		g.w.abort(fmt.Errorf("%s: %w", name, context.Cause(ctx)))
		<-r.done
	}
	return r.err
}

// next returns the next operation to run, or nil when the World has ended
// and nothing is left.
func (g *Group) next() *request {
	for {
		g.mu.Lock()
		if len(g.queue) > 0 {
			r := g.queue[0]
			g.queue[0] = nil
			g.queue = g.queue[1:]
			g.mu.Unlock()
			return r
		}
		g.mu.Unlock()
		select {
		case <-g.wake:
		case <-g.w.dead:
			g.mu.Lock()
			empty := len(g.queue) == 0
			g.mu.Unlock()
			if empty {
				return nil
			}
		}
	}
}

// work runs the group's operations one by one until the World ends.
func (g *Group) work() {
	defer close(g.done)
	p := &runner{g: g}
	for r := g.next(); r != nil; r = g.next() {
		if err := g.w.failure(); err != nil {
			r.finish(err)
			continue
		}
		p.reset(r.ctx)
		g.opSeq++
		g.w.progress.start(g, r.name, g.opSeq)
		err := r.run(p)
		g.w.progress.finish(g)
		if err != nil {
			err = p.fail(r.name, err)
		}
		r.finish(err)
	}
}

// checkLen returns an error for a call whose arguments fail the check ok.
func checkLen(name string, ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf("comm: %s: "+format, append([]any{name}, args...)...)
}

// AllReduce replaces buf, on every member, with the element-wise sum of
// all members' buf (same length on every member). The result is bit-for-bit
// the same on every member. It is a ring all-reduce (reduce-scatter, then
// all-gather) in pieces of about 1 MiB, so that large buffers stream: each
// member sends and receives 2(s−1)/s·4·len(buf) bytes.
func (g *Group) AllReduce(ctx context.Context, buf []float32) error {
	return g.do(ctx, "AllReduce", func(p *runner) error { return p.allReduce(buf, false) })
}

// AllReduceAsync starts AllReduce and returns at once.
func (g *Group) AllReduceAsync(buf []float32) Request {
	return g.issue(context.Background(), "AllReduce", func(p *runner) error { return p.allReduce(buf, false) })
}

// AllReduceBF16Async starts an all-reduce of buf, whose elements are
// bfloat16 values (a CPU backend's bfloat16 activations: float32s
// rounded to bfloat16), and returns at once: as AllReduce, but each sum
// the ring makes is rounded to the nearest bfloat16, ties to even, as
// NCCL's bfloat16 all-reduce adds in float32 and stores each partial sum
// in bfloat16 — so buf holds bfloat16 values again. The elements travel
// as float32s: the same bytes as AllReduce.
func (g *Group) AllReduceBF16Async(buf []float32) Request {
	return g.issue(context.Background(), "AllReduceBF16", func(p *runner) error { return p.allReduce(buf, true) })
}

// AllReduce64 replaces buf, on every member, with the element-wise sum of
// all members' buf, added in rank order (so the result equals a plain loop
// over the members). It is meant for a few scalars such as loss sums: every
// member sends its whole buffer to every other one.
func (g *Group) AllReduce64(ctx context.Context, buf []float64) error {
	return g.do(ctx, "AllReduce64", func(p *runner) error { return p.allReduce64(buf) })
}

// ReduceScatter sums the members' in element-wise and leaves this member's
// part of the sum in out: len(in) must be Size()·len(out), and
// out = Σ over members of in[Rank()·len(out) : (Rank()+1)·len(out)].
// in is not modified; out may be that part of in itself.
func (g *Group) ReduceScatter(ctx context.Context, in, out []float32) error {
	if err := checkLen("ReduceScatter", len(in) == g.Size()*len(out), "len(in) = %d, want Size·len(out) = %d", len(in), g.Size()*len(out)); err != nil {
		return err
	}
	return g.do(ctx, "ReduceScatter", func(p *runner) error { return p.reduceScatter(in, out) })
}

// ReduceScatterAsync starts ReduceScatter and returns at once.
func (g *Group) ReduceScatterAsync(in, out []float32) Request {
	if err := checkLen("ReduceScatter", len(in) == g.Size()*len(out), "len(in) = %d, want Size·len(out) = %d", len(in), g.Size()*len(out)); err != nil {
		return failed("ReduceScatter", err)
	}
	return g.issue(context.Background(), "ReduceScatter", func(p *runner) error { return p.reduceScatter(in, out) })
}

// AllGather concatenates the members' in, in rank order, into out on every
// member: len(out) must be Size()·len(in), and out[r·len(in):(r+1)·len(in)]
// receives member r's in. in may be this member's part of out itself.
func (g *Group) AllGather(ctx context.Context, in, out []float32) error {
	if err := checkLen("AllGather", len(out) == g.Size()*len(in), "len(out) = %d, want Size·len(in) = %d", len(out), g.Size()*len(in)); err != nil {
		return err
	}
	return g.do(ctx, "AllGather", func(p *runner) error { return p.allGather(in, out) })
}

// AllGatherAsync starts AllGather and returns at once.
func (g *Group) AllGatherAsync(in, out []float32) Request {
	if err := checkLen("AllGather", len(out) == g.Size()*len(in), "len(out) = %d, want Size·len(in) = %d", len(out), g.Size()*len(in)); err != nil {
		return failed("AllGather", err)
	}
	return g.issue(context.Background(), "AllGather", func(p *runner) error { return p.allGather(in, out) })
}

// Broadcast copies root's buf into buf on every other member (root is a
// group rank). The buffers are pipelined along a chain starting at root.
func (g *Group) Broadcast(ctx context.Context, buf []float32, root int) error {
	if err := checkLen("Broadcast", root >= 0 && root < g.Size(), "root %d is outside the group [0, %d)", root, g.Size()); err != nil {
		return err
	}
	return g.do(ctx, "Broadcast", func(p *runner) error { return p.broadcast(buf, root) })
}

// Send sends buf to group member to. It returns once the data is handed to
// the operating system (it does not wait for the matching Recv).
func (g *Group) Send(ctx context.Context, buf []float32, to int) error {
	if err := g.checkPeer("Send", to); err != nil {
		return err
	}
	return g.do(ctx, "Send", func(p *runner) error { return p.send(buf, to) })
}

// Recv receives into buf what group member from sends with Send; the
// lengths must match.
func (g *Group) Recv(ctx context.Context, buf []float32, from int) error {
	if err := g.checkPeer("Recv", from); err != nil {
		return err
	}
	return g.do(ctx, "Recv", func(p *runner) error { return p.recv(buf, from) })
}

// Exchange sends each of sends to its member and receives each of recvs
// from its member, as one operation: what a pipeline stage trades with its
// neighbours between two passes (NCCL's grouped sends and receives). The
// sends to one member arrive in the order listed, and so are the receives
// from one member matched. Over TCP the sends are buffered, so it is the
// sends, then the receives.
func (g *Group) Exchange(ctx context.Context, sends, recvs []Transfer) error {
	for _, x := range sends {
		if err := g.checkPeer("Exchange", x.Peer); err != nil {
			return err
		}
	}
	for _, x := range recvs {
		if err := g.checkPeer("Exchange", x.Peer); err != nil {
			return err
		}
	}
	return g.do(ctx, "Exchange", func(p *runner) error {
		for _, x := range sends {
			if err := p.send(x.Buf, x.Peer); err != nil {
				return err
			}
		}
		for _, x := range recvs {
			if err := p.recv(x.Buf, x.Peer); err != nil {
				return err
			}
		}
		return nil
	})
}

func (g *Group) checkPeer(name string, peer int) error {
	if peer < 0 || peer >= g.Size() {
		return fmt.Errorf("comm: %s: peer %d is outside the group [0, %d)", name, peer, g.Size())
	}
	if peer == g.rank {
		return fmt.Errorf("comm: %s: peer %d is this process", name, peer)
	}
	return nil
}

// Barrier returns once every member has called it (a dissemination
// barrier: ⌈log₂ Size⌉ rounds of empty messages).
func (g *Group) Barrier(ctx context.Context) error {
	return g.do(ctx, "Barrier", func(p *runner) error { return p.barrier() })
}
