package comm

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// runner runs one operation at a time for a group's worker: it queues frames
// on the connections, posts receives, and waits, each wait bounded by the
// timeout, the operation's context and the World's end. It remembers what
// the operation has in flight so that a failed operation can be unwound
// before its buffers are given back.
type runner struct {
	g     *Group
	ctx   context.Context
	op    byte
	seq   uint32
	timer *time.Timer
	recvs []recvRef // receives posted by the operation
	sends []sendRef // the last frame the operation queued on each connection
}

type recvRef struct {
	ib *inbox
	it *recvItem
}

type sendRef struct {
	c      *conn
	ticket uint64
}

// canceled is the error of a wait that ended because the operation's
// context did.
type canceled struct{ cause error }

func (e *canceled) Error() string { return e.cause.Error() }
func (e *canceled) Unwrap() error { return e.cause }

// reset prepares the runner for the next operation.
func (p *runner) reset(ctx context.Context) {
	p.ctx = ctx
	clear(p.recvs)
	p.recvs = p.recvs[:0]
	p.sends = p.sends[:0]
	if p.timer == nil {
		p.timer = time.NewTimer(p.g.w.timeout)
	} else {
		p.timer.Reset(p.g.w.timeout)
	}
}

// start begins a collective: it takes the group's next sequence number.
func (p *runner) start(op byte) {
	p.op = op
	p.seq = p.g.collSeq
	p.g.collSeq++
}

// progress restarts the timeout after data moved.
func (p *runner) progress() { p.timer.Reset(p.g.w.timeout) }

// mod returns x modulo the group size, in [0, size).
func (p *runner) mod(x int) int {
	s := p.g.Size()
	return ((x % s) + s) % s
}

// sendTo queues data for group member q as frame index of the operation.
func (p *runner) sendTo(q int, index int, data []byte) (uint64, error) {
	c := p.g.conns[q]
	t, err := c.send(header{op: p.op, group: p.g.id, seq: p.seq, index: uint32(index)}, data)
	if err != nil {
		return 0, err
	}
	p.g.sent.Add(int64(len(data)))
	p.noteSend(c, t)
	return t, nil
}

// noteSend records that the operation queued ticket t on c.
func (p *runner) noteSend(c *conn, t uint64) {
	for i := range p.sends {
		if p.sends[i].c == c {
			p.sends[i].ticket = max(p.sends[i].ticket, t)
			return
		}
	}
	p.sends = append(p.sends, sendRef{c, t})
}

// post registers a receive from group member q: the oldest early frame
// completes it at once, or the reader fills it when its frame comes.
func (p *runner) post(q int, it *recvItem) error {
	ib := p.g.boxes[q]
	ib.mu.Lock()
	if len(ib.unexpected) > 0 {
		f := ib.unexpected[0]
		ib.unexpected[0] = pending{}
		ib.unexpected = ib.unexpected[1:]
		ib.mu.Unlock()
		err := it.apply(f.h, f.buf.b)
		p.g.w.putBuf(f.buf)
		if err != nil {
			pe := p.g.conns[q].peerErr(err)
			it.finish(ib, pe)
			p.g.w.fail(pe)
			return pe
		}
		it.finish(ib, nil)
		if it.err == nil && it.fwd != nil {
			p.noteSend(it.fwd, it.sent)
		}
		return it.err
	}
	it.state.Store(recvPosted)
	ib.posted = append(ib.posted, it)
	ib.mu.Unlock()
	p.recvs = append(p.recvs, recvRef{ib, it})
	return nil
}

// wait waits for a receive from group member q to complete.
func (p *runner) wait(q int, it *recvItem) error {
	c, ib := p.g.conns[q], p.g.boxes[q]
	for {
		bye := c.byeSeen.Load() // before the state: see readLoop
		if it.state.Load() == recvDone {
			if it.err != nil {
				return it.err
			}
			p.g.recvd.Add(int64(len(it.dst)))
			if it.fwd != nil {
				p.g.sent.Add(int64(len(it.dst)))
				p.noteSend(it.fwd, it.sent)
			}
			p.progress()
			return nil
		}
		if bye {
			return c.peerErr(ErrPeerClosed)
		}
		select {
		case <-ib.notify:
		case <-p.g.w.dead:
			return p.g.w.failure()
		case <-p.ctx.Done():
			return &canceled{context.Cause(p.ctx)}
		case <-p.timer.C:
			return c.peerErr(fmt.Errorf("no data for %v in %s #%d: %w",
				p.g.w.timeout, opName(p.op), p.seq, context.DeadlineExceeded))
		}
	}
}

// waitSent waits until the frame with ticket t on c is written.
func (p *runner) waitSent(c *conn, t uint64) error {
	for {
		ok, ch := c.sent(t)
		if ok {
			return nil
		}
		select {
		case <-ch:
			p.progress()
		case <-p.g.w.dead:
			return p.g.w.failure()
		case <-p.ctx.Done():
			return &canceled{context.Cause(p.ctx)}
		case <-p.timer.C:
			return c.peerErr(fmt.Errorf("could not send for %v in %s #%d: %w",
				p.g.w.timeout, opName(p.op), p.seq, context.DeadlineExceeded))
		}
	}
}

// fail unwinds an operation that returned err: it ends the World (the
// members' streams no longer match), withdraws the receives the reader has
// not started, waits for those it is filling and for the writers to be
// done with the operation's frames (they drop them once the World has
// ended), and returns the error for the caller.
func (p *runner) fail(name string, err error) error {
	w := p.g.w
	var ce *canceled
	isCancel := errors.As(err, &ce)
	if isCancel {
		w.abort(fmt.Errorf("%s: %w", name, ce.cause))
	} else {
		w.fail(err)
	}
	for _, r := range p.recvs {
		r.ib.mu.Lock()
		for _, it := range r.ib.posted {
			it.state.Store(recvIdle)
		}
		clear(r.ib.posted)
		r.ib.posted = r.ib.posted[:0]
		r.ib.mu.Unlock()
	}
	for _, r := range p.recvs {
		for r.it.state.Load() == recvTaken {
			<-r.ib.notify
		}
		if f := r.it.fwd; f != nil && r.it.state.Load() == recvDone && r.it.err == nil {
			p.noteSend(f, r.it.sent) // forwarded, but not yet waited for
		}
	}
	for _, s := range p.sends {
		for {
			ok, ch := s.c.sent(s.ticket)
			if ok {
				break
			}
			<-ch
		}
	}
	if isCancel {
		return fmt.Errorf("comm: %s: %w", name, ce.cause)
	}
	return w.failure()
}

// step is one receive of a pipelined ring: the next frame from the
// previous member goes into dst (added when add is set, after src is
// copied there if src is not nil), and is then forwarded to the next member
// when fwd is set. gate is the number of an earlier send (first the
// pipeline's initial frames, then the forwards, in order) that must have
// been written before dst may change, or -1.
type step struct {
	dst, src []byte
	add, fwd bool
	round    bool // with add: the sum rounded to bfloat16
	gate     int
}

// ring runs a pipelined transfer: it sends first to group member to, then
// handles steps, frames received from group member from, in order; to and
// from are -1 where nothing is sent or received. The i-th frame sent
// carries index i, which the receiver checks against its own step count.
// Receives are posted ahead as far as their gates allow, so that the
// reader fills them straight from the socket and forwards them at once.
func (p *runner) ring(from, to int, first [][]byte, steps []step) error {
	var next *conn
	if to >= 0 {
		next = p.g.conns[to]
	}
	firstSent := make([]uint64, len(first))
	for i, d := range first {
		t, err := p.sendTo(to, i, d)
		if err != nil {
			return err
		}
		firstSent[i] = t
	}
	// fwdStep[k] is the step whose forward is send number len(first)+k.
	fwdStep := make([]int, 0, len(steps))
	items := make([]recvItem, len(steps))
	for i := range steps {
		st, it := &steps[i], &items[i]
		it.dst, it.add, it.round, it.op, it.seq, it.index = st.dst, st.add, st.round, p.op, p.seq, uint32(i)
		if st.fwd {
			it.fwd = next
			it.fwdH = header{op: p.op, group: p.g.id, seq: p.seq, index: uint32(len(first) + len(fwdStep))}
			fwdStep = append(fwdStep, i)
		}
	}
	// gateTicket returns the ticket of send number g if it has been queued.
	gateTicket := func(g int) (uint64, bool) {
		if g < len(first) {
			return firstSent[g], true
		}
		it := &items[fwdStep[g-len(first)]]
		if it.state.Load() != recvDone || it.err != nil {
			return 0, false
		}
		return it.sent, true
	}
	ready := func(i int) bool {
		g := steps[i].gate
		if g < 0 {
			return true
		}
		t, ok := gateTicket(g)
		return ok && next.written.Load() >= t
	}
	post := func(i int) error {
		if src := steps[i].src; src != nil {
			copy(steps[i].dst, src)
		}
		return p.post(from, &items[i])
	}
	posted := 0
	for i := range steps {
		for posted < len(steps) && ready(posted) {
			if err := post(posted); err != nil {
				return err
			}
			posted++
		}
		if posted == i {
			t, ok := gateTicket(steps[i].gate)
			if !ok {
				return fmt.Errorf("comm: internal error: step %d waits for send %d, not yet queued", i, steps[i].gate)
			}
			if err := p.waitSent(next, t); err != nil {
				return err
			}
			if err := post(i); err != nil {
				return err
			}
			posted++
		}
		if err := p.wait(from, &items[i]); err != nil {
			return err
		}
	}
	for _, s := range p.sends {
		if err := p.waitSent(s.c, s.ticket); err != nil {
			return err
		}
	}
	return nil
}

// span is the range [lo, hi) of a buffer.
type span struct{ lo, hi int }

// pieces cuts [lo, hi) into pieces of at most per elements.
func pieces(lo, hi, per int) []span {
	var s []span
	for ; lo < hi; lo += per {
		s = append(s, span{lo, min(hi, lo+per)})
	}
	return s
}

func f32Span(b []float32, off int, s span) []byte { return f32Bytes(b[off+s.lo : off+s.hi]) }

// allReduce is a ring reduce-scatter followed by a ring all-gather, both in
// place and pipelined piece by piece. With s members and r this member,
// chunk c of the buffer is elements [c·n/s, (c+1)·n/s). In reduce-scatter
// step k, member r receives chunk r−k−2 from member r−1, adds it into its
// own and passes the sum on; after s−1 steps it holds the full sum of chunk
// r, which it passes on at once as all-gather step 0. In all-gather step k
// it receives the finished chunk r−k−1 and passes it on. Every element is
// thus added along the ring in one fixed order and then copied, so all
// members end with the same bits. With round, buf holds bfloat16 values
// and each sum is rounded to bfloat16 as it is made (AllReduceBF16).
func (p *runner) allReduce(buf []float32, round bool) error {
	if round {
		p.start(opAllReduceBF16)
	} else {
		p.start(opAllReduce)
	}
	s, r, n := p.g.Size(), p.g.rank, len(buf)
	if s == 1 || n == 0 {
		return nil
	}
	per := p.g.w.chunkBytes / 4
	segs := make([][]span, s)
	last := make([][]int, s) // per piece: the number of its latest send
	for c := range s {
		segs[c] = pieces(c*n/s, (c+1)*n/s, per)
		last[c] = make([]int, len(segs[c]))
	}
	var first [][]byte
	c0 := p.mod(r - 1)
	for j, sp := range segs[c0] {
		last[c0][j] = len(first)
		first = append(first, f32Span(buf, 0, sp))
	}
	nsend := len(first)
	steps := make([]step, 0, 2*(n/per+s))
	for k := range s - 1 {
		c := p.mod(r - k - 2)
		for j, sp := range segs[c] {
			steps = append(steps, step{dst: f32Span(buf, 0, sp), add: true, round: round, fwd: true, gate: -1})
			last[c][j] = nsend
			nsend++
		}
	}
	for k := range s - 1 {
		c, fwd := p.mod(r-k-1), k < s-2
		for j, sp := range segs[c] {
			steps = append(steps, step{dst: f32Span(buf, 0, sp), fwd: fwd, gate: last[c][j]})
			if fwd {
				last[c][j] = nsend
				nsend++
			}
		}
	}
	return p.ring(p.mod(r-1), p.mod(r+1), first, steps)
}

// reduceScatter is the reduce-scatter half of allReduce, except that the
// sums accumulate in out (each piece of out is reused once per step, after
// its previous contents have been sent) so that in stays untouched.
func (p *runner) reduceScatter(in, out []float32) error {
	p.start(opReduceScatter)
	s, m := p.g.Size(), len(out)
	if s == 1 {
		copy(out, in)
		return nil
	}
	if m == 0 {
		return nil
	}
	if overlaps(in, out) {
		tmp := make([]float32, m)
		if err := p.reduceScatterInto(in, tmp); err != nil {
			return err
		}
		copy(out, tmp)
		return nil
	}
	return p.reduceScatterInto(in, out)
}

func (p *runner) reduceScatterInto(in, out []float32) error {
	s, r, m := p.g.Size(), p.g.rank, len(out)
	segs := pieces(0, m, p.g.w.chunkBytes/4)
	var first [][]byte
	for _, sp := range segs {
		first = append(first, f32Span(in, p.mod(r-1)*m, sp))
	}
	nsend := len(first)
	last := make([]int, len(segs))
	for j := range last {
		last[j] = -1
	}
	steps := make([]step, 0, (s-1)*len(segs))
	for k := range s - 1 {
		c, fwd := p.mod(r-k-2), k < s-2
		for j, sp := range segs {
			steps = append(steps, step{dst: f32Span(out, 0, sp), src: f32Span(in, c*m, sp), add: true, fwd: fwd, gate: last[j]})
			if fwd {
				last[j] = nsend
				nsend++
			}
		}
	}
	return p.ring(p.mod(r-1), p.mod(r+1), first, steps)
}

// allGather copies in to its place in out and passes the chunks around
// the ring: in step k member r receives chunk r−k−1 and forwards it.
func (p *runner) allGather(in, out []float32) error {
	p.start(opAllGather)
	s, r, m := p.g.Size(), p.g.rank, len(in)
	copy(out[r*m:(r+1)*m], in)
	if s == 1 || m == 0 {
		return nil
	}
	segs := pieces(0, m, p.g.w.chunkBytes/4)
	var first [][]byte
	for _, sp := range segs { // from out: in may be part of it
		first = append(first, f32Span(out, r*m, sp))
	}
	steps := make([]step, 0, (s-1)*len(segs))
	for k := range s - 1 {
		c, fwd := p.mod(r-k-1), k < s-2
		for _, sp := range segs {
			steps = append(steps, step{dst: f32Span(out, c*m, sp), fwd: fwd, gate: -1})
		}
	}
	return p.ring(p.mod(r-1), p.mod(r+1), first, steps)
}

// broadcast pipelines buf along the chain root, root+1, …, root−1.
func (p *runner) broadcast(buf []float32, root int) error {
	p.start(opBroadcast)
	s, r := p.g.Size(), p.g.rank
	if s == 1 || len(buf) == 0 {
		return nil
	}
	segs := pieces(0, len(buf), p.g.w.chunkBytes/4)
	pos := p.mod(r - root)
	if pos == 0 {
		first := make([][]byte, len(segs))
		for j, sp := range segs {
			first[j] = f32Span(buf, 0, sp)
		}
		return p.ring(-1, p.mod(r+1), first, nil)
	}
	to, fwd := p.mod(r+1), pos < s-1
	if !fwd {
		to = -1
	}
	steps := make([]step, len(segs))
	for j, sp := range segs {
		steps[j] = step{dst: f32Span(buf, 0, sp), fwd: fwd, gate: -1}
	}
	return p.ring(p.mod(r-1), to, nil, steps)
}

// p2pPieces cuts a point-to-point buffer into frames; an empty buffer is
// one empty frame, so that Send and Recv always pair up.
func (p *runner) p2pPieces(buf []float32) [][]byte {
	segs := pieces(0, len(buf), p.g.w.chunkBytes/4)
	if len(segs) == 0 {
		return [][]byte{nil}
	}
	b := make([][]byte, len(segs))
	for j, sp := range segs {
		b[j] = f32Span(buf, 0, sp)
	}
	return b
}

func (p *runner) send(buf []float32, to int) error {
	p.op, p.seq = opSendRecv, p.g.sendSeq[to]
	p.g.sendSeq[to]++
	return p.ring(-1, to, p.p2pPieces(buf), nil)
}

func (p *runner) recv(buf []float32, from int) error {
	p.op, p.seq = opSendRecv, p.g.recvSeq[from]
	p.g.recvSeq[from]++
	b := p.p2pPieces(buf)
	steps := make([]step, len(b))
	for j := range b {
		steps[j] = step{dst: b[j], gate: -1}
	}
	return p.ring(from, -1, nil, steps)
}

// barrier is a dissemination barrier: in round k every member signals
// member r+2^k and waits for member r−2^k.
func (p *runner) barrier() error {
	p.start(opBarrier)
	s, r := p.g.Size(), p.g.rank
	for d := 1; d < s; d *= 2 {
		if err := p.ring(p.mod(r-d), p.mod(r+d), [][]byte{nil}, []step{{gate: -1}}); err != nil {
			return err
		}
	}
	return nil
}

// allReduce64 sends the whole buffer to every other member and adds all
// members' buffers in rank order.
func (p *runner) allReduce64(buf []float64) error {
	p.start(opAllReduce64)
	s, r, n := p.g.Size(), p.g.rank, len(buf)
	if s == 1 || n == 0 {
		return nil
	}
	all := make([]float64, s*n)
	copy(all[r*n:], buf)
	segs := pieces(0, 8*n, p.g.w.chunkBytes)
	data := f64Bytes(buf)
	for q := range s {
		if q == r {
			continue
		}
		for j, sp := range segs {
			if _, err := p.sendTo(q, j, data[sp.lo:sp.hi]); err != nil {
				return err
			}
		}
	}
	items := make([]recvItem, (s-1)*len(segs))
	k := 0
	for q := range s {
		if q == r {
			continue
		}
		dst := f64Bytes(all[q*n : (q+1)*n])
		for j, sp := range segs {
			it := &items[k]
			it.dst, it.op, it.seq, it.index = dst[sp.lo:sp.hi], p.op, p.seq, uint32(j)
			if err := p.post(q, it); err != nil {
				return err
			}
			k++
		}
	}
	k = 0
	for q := range s {
		if q == r {
			continue
		}
		for range segs {
			if err := p.wait(q, &items[k]); err != nil {
				return err
			}
			k++
		}
	}
	for _, sr := range p.sends {
		if err := p.waitSent(sr.c, sr.ticket); err != nil {
			return err
		}
	}
	for i := range buf {
		v := all[i]
		for q := 1; q < s; q++ {
			v += all[q*n+i]
		}
		buf[i] = v
	}
	return nil
}
