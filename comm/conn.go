package comm

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Every frame on a mesh connection starts with a headerSize-byte header
// (little-endian):
//
//	[0]     frame type (frameData, frameHeartbeat, frameBye, frameAbort)
//	[1]     operation code (data frames)
//	[2:4]   zero
//	[4:8]   payload length in bytes
//	[8:16]  group id
//	[16:24] operation sequence number and frame index within the operation
//	        (data frames); the culprit's world rank (abort frames)
//
// followed by the payload. Data frames of one group from one peer arrive in
// the order they were sent and are matched in that order to the receives
// the group posts; the sequence number, index, operation code and length
// are checked against what the receive expects.
const headerSize = 24

// Frame types.
const (
	frameData      = 1
	frameHeartbeat = 2
	frameBye       = 3 // the peer closed its World; nothing follows
	frameAbort     = 4 // the peer's World failed; the payload says why
)

// maxFrame bounds the payload of one frame, so that a corrupt header
// cannot make the reader allocate without limit.
const maxFrame = 1 << 26

// maxAbortMessage bounds the text carried by an abort frame.
const maxAbortMessage = 1024

// Operation codes carried in data frames.
const (
	opAllReduce = iota + 1
	opAllReduce64
	opReduceScatter
	opAllGather
	opBroadcast
	opBarrier
	opSendRecv
	opAllReduceBF16
)

// opName names an operation code for messages.
func opName(op byte) string {
	switch op {
	case opAllReduce:
		return "AllReduce"
	case opAllReduce64:
		return "AllReduce64"
	case opReduceScatter:
		return "ReduceScatter"
	case opAllGather:
		return "AllGather"
	case opBroadcast:
		return "Broadcast"
	case opBarrier:
		return "Barrier"
	case opSendRecv:
		return "Send/Recv"
	case opAllReduceBF16:
		return "AllReduceBF16"
	}
	return fmt.Sprintf("operation %d", op)
}

// header is a decoded frame header.
type header struct {
	typ   byte
	op    byte
	n     uint32 // payload bytes
	group uint64
	seq   uint32
	index uint32
}

func (h *header) put(b *[headerSize]byte) {
	*b = [headerSize]byte{0: h.typ, 1: h.op}
	binary.LittleEndian.PutUint32(b[4:], h.n)
	binary.LittleEndian.PutUint64(b[8:], h.group)
	binary.LittleEndian.PutUint32(b[16:], h.seq)
	binary.LittleEndian.PutUint32(b[20:], h.index)
}

func parseHeader(b *[headerSize]byte) header {
	return header{
		typ:   b[0],
		op:    b[1],
		n:     binary.LittleEndian.Uint32(b[4:]),
		group: binary.LittleEndian.Uint64(b[8:]),
		seq:   binary.LittleEndian.Uint32(b[16:]),
		index: binary.LittleEndian.Uint32(b[20:]),
	}
}

// outFrame is a frame waiting for the writer. data is the caller's memory,
// sent as is; it must stay untouched until the frame's ticket completes.
type outFrame struct {
	h      header
	data   []byte
	ticket uint64
}

// Receive states.
const (
	recvIdle   = iota // not posted (or withdrawn)
	recvPosted        // queued in the inbox
	recvTaken         // the reader is filling it
	recvDone          // complete; err is set
)

// recvItem is a posted receive: the next frame of its group from its peer
// goes into dst (added as float32s when add is set). The reader fills it
// straight from the socket when it is posted before the frame arrives.
type recvItem struct {
	dst   []byte
	add   bool
	round bool // with add: each sum rounded to bfloat16 (AllReduceBF16)
	op    byte
	seq   uint32
	index uint32
	fwd   *conn  // where to forward dst once complete, or nil
	fwdH  header // the forwarded frame's header
	state atomic.Int32
	err   error  // written before state becomes recvDone
	sent  uint64 // the forward's ticket, written before state becomes recvDone
}

// check verifies that the frame h is the one the receive expects.
func (it *recvItem) check(h header) error {
	if h.op == it.op && h.seq == it.seq && h.index == it.index && int(h.n) == len(it.dst) {
		return nil
	}
	return fmt.Errorf("sent %s #%d frame %d (%d bytes) where %s #%d frame %d (%d bytes) was expected: %w",
		opName(h.op), h.seq, h.index, h.n, opName(it.op), it.seq, it.index, len(it.dst), ErrMismatch)
}

// apply completes the receive from a frame that was buffered.
func (it *recvItem) apply(h header, b []byte) error {
	if err := it.check(h); err != nil {
		return err
	}
	if it.add {
		addF32(bytesF32(it.dst), bytesF32(b))
		if it.round {
			roundBF16(bytesF32(it.dst))
		}
	} else {
		copy(it.dst, b)
	}
	return nil
}

// finish completes the receive, forwarding it first if it should be: the
// goroutine that completes it (the reader, mostly) queues the forward at
// once, without waiting for the group's worker to wake up.
func (it *recvItem) finish(ib *inbox, err error) {
	if err == nil && it.fwd != nil {
		it.sent, err = it.fwd.send(it.fwdH, it.dst)
	}
	it.err = err
	it.state.Store(recvDone)
	ib.signal()
}

// pending is a data frame that arrived before its receive was posted.
type pending struct {
	h   header
	buf *frameBuf
}

// inbox holds the traffic of one group from one peer: either receives
// waiting for frames or frames waiting for receives, never both.
type inbox struct {
	mu         sync.Mutex
	posted     []*recvItem
	unexpected []pending
	notify     chan struct{} // capacity 1; signaled on every completion
}

func newInbox() *inbox { return &inbox{notify: make(chan struct{}, 1)} }

func (ib *inbox) signal() {
	select {
	case ib.notify <- struct{}{}:
	default:
	}
}

// popPosted removes and returns the oldest posted receive, marked taken,
// or nil. ib.mu must be held.
func (ib *inbox) popPosted() *recvItem {
	if len(ib.posted) == 0 {
		return nil
	}
	it := ib.posted[0]
	ib.posted[0] = nil
	ib.posted = ib.posted[1:]
	it.state.Store(recvTaken)
	return it
}

// conn is the mesh connection to one peer, shared by all groups: a writer
// goroutine sends queued frames in order (and heartbeats when idle), a
// reader goroutine sorts incoming frames into the groups' inboxes.
type conn struct {
	w    *World
	peer int    // world rank
	addr string // peer's mesh address
	nc   *net.TCPConn

	interrupted atomic.Bool // fail() cut this connection off
	byeSeen     atomic.Bool // the peer closed its World

	wmu      sync.Mutex
	queue    []outFrame
	enq      uint64        // last ticket handed out
	wclosed  bool          // the writer has stopped; send refuses
	progress chan struct{} // closed and replaced when written advances
	written  atomic.Uint64 // tickets up to this one are written or dropped
	wake     chan struct{}

	imu     sync.Mutex
	inboxes map[uint64]*inbox

	scratch      []float32 // reader-only: landing area for added frames
	lastDeadline time.Time // reader-only

	readerDone, writerDone chan struct{}
}

func newConn(w *World, peer int, nc *net.TCPConn) *conn {
	return &conn{
		w:          w,
		peer:       peer,
		addr:       w.addrs[peer],
		nc:         nc,
		progress:   make(chan struct{}),
		wake:       make(chan struct{}, 1),
		inboxes:    make(map[uint64]*inbox),
		scratch:    make([]float32, 64<<10),
		readerDone: make(chan struct{}),
		writerDone: make(chan struct{}),
	}
}

// peerErr wraps err as a *PeerError naming the peer.
func (c *conn) peerErr(err error) *PeerError {
	return &PeerError{Rank: c.peer, Addr: c.addr, Err: err}
}

// inbox returns the group's inbox for this peer, creating it: frames of a
// group may arrive before this process has created the group.
func (c *conn) inbox(group uint64) *inbox {
	c.imu.Lock()
	defer c.imu.Unlock()
	ib := c.inboxes[group]
	if ib == nil {
		ib = newInbox()
		c.inboxes[group] = ib
	}
	return ib
}

// interrupt cuts the connection off after the World failed because of its
// peer: blocked reads and writes return at once.
func (c *conn) interrupt() {
	c.interrupted.Store(true)
	c.nc.SetDeadline(time.Now())
}

// send queues a frame and returns its ticket.
func (c *conn) send(h header, data []byte) (uint64, error) {
	h.typ = frameData
	c.wmu.Lock()
	if c.wclosed {
		c.wmu.Unlock()
		return 0, c.w.failure()
	}
	c.enq++
	t := c.enq
	c.queue = append(c.queue, outFrame{h: h, data: data, ticket: t})
	c.wmu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return t, nil
}

// sent reports whether the frame with ticket t has been written or dropped,
// and otherwise returns a channel that is closed on progress.
func (c *conn) sent(t uint64) (bool, <-chan struct{}) {
	if c.written.Load() >= t {
		return true, nil
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.written.Load() >= t {
		return true, nil
	}
	return false, c.progress
}

func (c *conn) complete(t uint64) {
	c.wmu.Lock()
	if t > c.written.Load() {
		c.written.Store(t)
		close(c.progress)
		c.progress = make(chan struct{})
	}
	c.wmu.Unlock()
}

// writeLoop sends queued frames, and heartbeats while idle, until the
// World ends; then it drops what is left, says goodbye (bye or abort) and
// shuts the sending side down.
func (c *conn) writeLoop() {
	defer close(c.writerDone)
	w := c.w
	var hb [headerSize]byte
	beat := time.NewTimer(w.heartbeat)
	defer beat.Stop()
	intact := true // no write failed part-way through a frame
loop:
	for {
		c.wmu.Lock()
		q := c.queue
		c.queue = nil
		c.wmu.Unlock()
		for i := range q {
			if w.isDead() {
				break loop // the final completion drops the rest
			}
			err := c.writeFrame(&hb, q[i].h, q[i].data)
			c.complete(q[i].ticket)
			if err != nil {
				intact = false
				w.fail(c.peerErr(fmt.Errorf("write: %w", err)))
				break loop
			}
		}
		if len(q) > 0 {
			beat.Reset(w.heartbeat)
			continue
		}
		select {
		case <-c.wake:
		case <-w.dead:
			break loop
		case <-beat.C:
			if err := c.writeFrame(&hb, header{typ: frameHeartbeat}, nil); err != nil {
				intact = false
				w.fail(c.peerErr(fmt.Errorf("write: %w", err)))
				break loop
			}
			beat.Reset(w.heartbeat)
		}
	}
	c.wmu.Lock()
	c.wclosed = true
	c.queue = nil
	last := c.enq
	c.wmu.Unlock()
	c.complete(last)
	if intact && !c.interrupted.Load() {
		err := w.failure()
		if errors.Is(err, ErrClosed) {
			c.writeFrame(&hb, header{typ: frameBye}, nil)
		} else {
			culprit, msg := w.rank, err.Error()
			var pe *PeerError
			if errors.As(err, &pe) {
				culprit, msg = pe.Rank, pe.Err.Error()
			}
			if len(msg) > maxAbortMessage {
				msg = msg[:maxAbortMessage]
			}
			c.writeFrame(&hb, header{typ: frameAbort, index: uint32(culprit)}, []byte(msg))
		}
	}
	c.nc.CloseWrite()
}

// writeFrame writes one frame, header and payload in one system call when
// the kernel takes it, within the timeout.
func (c *conn) writeFrame(hb *[headerSize]byte, h header, data []byte) error {
	h.n = uint32(len(data))
	h.put(hb)
	if err := c.nc.SetWriteDeadline(time.Now().Add(c.w.timeout)); err != nil {
		return err
	}
	bufs := net.Buffers{hb[:], data}
	_, err := bufs.WriteTo(c.nc)
	return err
}

// deadlineReader reads the connection with a deadline of w.silence after
// each read starts, so that a peer that stops sending anything (heartbeats
// included) is noticed.
type deadlineReader struct{ c *conn }

var errInterrupted = errors.New("connection cut off")

func (d deadlineReader) Read(p []byte) (int, error) {
	c := d.c
	if now := time.Now(); now.Sub(c.lastDeadline) > c.w.silence/16 {
		c.nc.SetReadDeadline(now.Add(c.w.silence))
		c.lastDeadline = now
	}
	if c.interrupted.Load() { // after setting the deadline: see interrupt
		return 0, errInterrupted
	}
	return c.nc.Read(p)
}

// readLoop sorts incoming frames until the connection ends.
func (c *conn) readLoop() {
	defer close(c.readerDone)
	br := bufio.NewReaderSize(deadlineReader{c}, 64<<10)
	var hb [headerSize]byte
	for {
		if _, err := io.ReadFull(br, hb[:]); err != nil {
			c.readFailed(err)
			return
		}
		h := parseHeader(&hb)
		switch h.typ {
		case frameHeartbeat:
			if h.n != 0 {
				c.protocolError(fmt.Errorf("heartbeat with %d bytes of payload", h.n))
				return
			}
		case frameBye:
			c.byeSeen.Store(true)
			c.wakeInboxes()
			io.Copy(io.Discard, br) // until the peer's end of stream
			return
		case frameAbort:
			if h.n > maxAbortMessage {
				c.protocolError(fmt.Errorf("abort message of %d bytes", h.n))
				return
			}
			msg := make([]byte, h.n)
			if _, err := io.ReadFull(br, msg); err != nil {
				c.readFailed(err)
				return
			}
			culprit := int(h.index)
			if culprit < 0 || culprit >= c.w.size {
				culprit = c.peer
			}
			c.w.fail(&PeerError{Rank: culprit, Addr: c.w.addrs[culprit],
				Err: fmt.Errorf("reported by rank %d: %s", c.peer, msg)})
		case frameData:
			if h.n > maxFrame {
				c.protocolError(fmt.Errorf("data frame of %d bytes", h.n))
				return
			}
			if err := c.deliver(h, br); err != nil {
				c.readFailed(err)
				return
			}
		default:
			c.protocolError(fmt.Errorf("unknown frame type %d", h.typ))
			return
		}
	}
}

// readErr describes a failed read.
func (c *conn) readErr(err error) error {
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("connection closed (process exited?): %w", err)
	case errors.Is(err, os.ErrDeadlineExceeded) && !c.interrupted.Load():
		return fmt.Errorf("silent for %v (no data, no heartbeat; process hung?): %w", c.w.silence, context.DeadlineExceeded)
	}
	return fmt.Errorf("read: %w", err)
}

// readFailed ends the World because the connection broke, unless the
// World or the peer was closing anyway.
func (c *conn) readFailed(err error) {
	if c.w.isClosing() || c.byeSeen.Load() || c.interrupted.Load() {
		return
	}
	c.w.fail(c.peerErr(c.readErr(err)))
}

func (c *conn) protocolError(err error) {
	c.w.fail(c.peerErr(fmt.Errorf("protocol error: %w", err)))
}

// wakeInboxes wakes every waiter on this peer (after a bye).
func (c *conn) wakeInboxes() {
	c.imu.Lock()
	defer c.imu.Unlock()
	for _, ib := range c.inboxes {
		ib.signal()
	}
}

// deliver hands a data frame to its receive: read straight into the
// destination when the receive is posted, buffered otherwise.
func (c *conn) deliver(h header, r io.Reader) error {
	ib := c.inbox(h.group)
	ib.mu.Lock()
	it := ib.popPosted()
	ib.mu.Unlock()
	if it != nil {
		return c.fill(ib, it, h, r)
	}
	buf := c.w.getBuf(int(h.n))
	if _, err := io.ReadFull(r, buf.b); err != nil {
		c.w.putBuf(buf)
		return err
	}
	ib.mu.Lock()
	it = ib.popPosted() // posted while the payload was read
	if it == nil {
		ib.unexpected = append(ib.unexpected, pending{h: h, buf: buf})
	}
	ib.mu.Unlock()
	if it != nil {
		err := it.apply(h, buf.b)
		c.w.putBuf(buf)
		c.finishChecked(ib, it, err)
	}
	return nil
}

// finishChecked completes a receive; a mismatch also ends the World.
func (c *conn) finishChecked(ib *inbox, it *recvItem, err error) {
	if err != nil {
		pe := c.peerErr(err)
		it.finish(ib, pe)
		c.w.fail(pe)
		return
	}
	it.finish(ib, nil)
}

// fill reads a frame's payload into a posted receive.
func (c *conn) fill(ib *inbox, it *recvItem, h header, r io.Reader) error {
	if err := it.check(h); err != nil {
		_, rerr := io.CopyN(io.Discard, r, int64(h.n)) // stay in step
		c.finishChecked(ib, it, err)
		return rerr
	}
	var err error
	if it.add {
		dst := bytesF32(it.dst)
		for off := 0; off < len(dst) && err == nil; off += len(c.scratch) {
			s := c.scratch[:min(len(c.scratch), len(dst)-off)]
			if _, err = io.ReadFull(r, f32Bytes(s)); err == nil {
				addF32(dst[off:off+len(s)], s)
				if it.round {
					roundBF16(dst[off : off+len(s)])
				}
			}
		}
	} else {
		_, err = io.ReadFull(r, it.dst)
	}
	if err != nil {
		it.finish(ib, c.peerErr(c.readErr(err)))
		return err
	}
	it.finish(ib, nil)
	return nil
}

// frameBuf is a buffer for a frame that arrived before its receive.
type frameBuf struct {
	f []float32 // backing store, for alignment
	b []byte    // the frame's bytes
}
