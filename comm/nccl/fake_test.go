package nccl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"unsafe"

	"github.com/gptui/gptui/half"
	"github.com/gptui/gptui/kernels/cuda"
)

// fake is NCCL and the CUDA driver for the ranks of one test, all in this
// process, on the CPU: a test double for the library this machine lacks,
// built to behave like the real one where the fabric depends on it, and
// to fail where it fails:
//
//   - ncclCommInitRank waits until every rank of the id has joined, and
//     refuses a second rank with the same number or another size;
//   - ncclCommSplit is collective over the parent: it waits until every
//     member of the parent has called its split of the same number, and
//     refuses a negative colour other than NCCL_SPLIT_NOCOLOR;
//   - operations run on streams, one goroutine each, in order; a
//     collective waits, on its stream, for every member's; a send waits
//     for the matching receive (the n-th send from a to b meets b's n-th
//     receive from a), so two members that each send before they receive
//     hang, as on a GPU, while a group (ncclGroupStart/End) posts all of
//     its sends and receives before it waits;
//   - events mark places in streams; cuStreamWaitEvent makes a stream
//     wait for the record the event had when it was called;
//   - "device memory" is Go memory registered with the fake (alloc), and
//     an operation on anything else fails, as an illegal address would;
//   - ncclCommAbort ends the aborted rank's waiting operations, and a
//     communicator used after it fails; with remoteErrors set, the other
//     members then get an asynchronous ncclRemoteError, as over a network
//     (otherwise they hang, as over NVLink).
//
// Every split is logged, for the tests of colours and keys.
type fake struct {
	mu     sync.Mutex
	cond   *sync.Cond
	closed bool

	remoteErrors bool
	inject       func(rank int, call string) error // a failure of an NCCL call, or nil

	ids    int
	inits  map[cuda.UniqueID]*initRv
	spans  []span
	events map[cuda.Event]*fevent
	nextEv cuda.Event
	splits []splitCall
	calls  []string // NCCL calls on aborted communicators
	wg     sync.WaitGroup
}

type span struct {
	lo uintptr
	b  []byte
}

type fevent struct{ gen, done int64 }

// splitCall is one rank's ncclCommSplit.
type splitCall struct {
	world, n   int // the caller's world rank; its split number
	color, key int
}

type initRv struct {
	nranks int
	c      *fcomm
	in     []bool
	joined int
}

// fcomm is a communicator: its members' handles and the operations in
// rendezvous.
type fcomm struct {
	hs     []*fhandle
	world  []int // the members' world ranks
	colls  map[int]*collSlot
	p2p    map[[2]int]*p2pQueue // [from, to]
	splits map[int]*splitSlot
}

// fhandle is one member's communicator: a Handle.
type fhandle struct {
	c             *fcomm
	rank          int
	worldRank     int
	nColl, nSplit int // collectives and splits issued
	aborted       bool
	async         error
}

// newComm makes a communicator of the given world ranks (under mu).
func (f *fake) newComm(world []int) *fcomm {
	c := &fcomm{hs: make([]*fhandle, len(world)), world: world, colls: map[int]*collSlot{}, p2p: map[[2]int]*p2pQueue{}, splits: map[int]*splitSlot{}}
	for i := range world {
		c.hs[i] = &fhandle{c: c, rank: i, worldRank: world[i]}
	}
	return c
}

func (h *fhandle) Rank() int { return h.rank }
func (h *fhandle) Size() int { return len(h.c.hs) }

type collSlot struct {
	kind    string
	args    []collArgs
	arrived int
	done    bool
	err     error
}

type collArgs struct {
	send, recv cuda.Ptr
	count      int
	t          cuda.DataType
}

type p2pQueue struct {
	sends, recvs []*p2pPart
}

type p2pPart struct {
	h     *fhandle
	send  bool
	p     cuda.Ptr
	count int
	peer  int
	done  bool
	err   error
}

type splitSlot struct {
	calls   map[int][2]int // rank → color, key
	results map[int]*fhandle
	done    bool
}

func newFake(t testing.TB) *fake {
	f := &fake{inits: map[cuda.UniqueID]*initRv{}, events: map[cuda.Event]*fevent{}}
	f.cond = sync.NewCond(&f.mu)
	t.Cleanup(f.close)
	return f
}

// close ends every wait (the test is over) and the streams' goroutines.
func (f *fake) close() {
	f.mu.Lock()
	f.closed = true
	f.cond.Broadcast()
	f.mu.Unlock()
	f.wg.Wait()
}

var errClosed = errors.New("fake: the test ended")

// wait waits on the fake's condition until ok or the test ends (under mu).
func (f *fake) wait(ok func() bool) error {
	for !ok() {
		if f.closed {
			return errClosed
		}
		f.cond.Wait()
	}
	return nil
}

// alloc registers n bytes of Go memory as device memory.
func (f *fake) alloc(n int) []byte {
	b := make([]byte, max(n, 1))
	f.mu.Lock()
	f.spans = append(f.spans, span{uintptr(unsafe.Pointer(&b[0])), b})
	f.mu.Unlock()
	return b[:n]
}

func (f *fake) float32s(n int) []float32 {
	b := f.alloc(4 * n)
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

func (f *fake) float64s(n int) []float64 {
	b := f.alloc(8 * n)
	return unsafe.Slice((*float64)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

// mem returns the device memory [p, p+n) (under mu).
func (f *fake) mem(p cuda.Ptr, n int) ([]byte, error) {
	for _, s := range f.spans {
		if uintptr(p) >= s.lo && uintptr(p)+uintptr(n) <= s.lo+uintptr(len(s.b)) {
			o := int(uintptr(p) - s.lo)
			return s.b[o : o+n], nil
		}
	}
	return nil, fmt.Errorf("fake: %d bytes at %#x are not device memory (an illegal address on a GPU)", n, uintptr(p))
}

// fstream is a stream: a queue of work that one goroutine runs in order.
type fstream struct {
	f      *fake
	q      []func()
	queued int // items ever queued
	ran    int // items finished
	dead   bool
}

// lib returns the library as world rank rank sees it.
func (f *fake) lib(rank int) *Lib {
	var group *[]*p2pPart // between GroupStart and GroupEnd
	var groupS *fstream
	streams := map[cuda.Stream]*fstream{}
	var nextS cuda.Stream
	stream := func(s cuda.Stream) (*fstream, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		st := streams[s]
		if st == nil || st.dead {
			return nil, fmt.Errorf("fake: no stream %d", s)
		}
		return st, nil
	}
	call := func(name string, h Handle) (*fhandle, error) {
		if f.inject != nil {
			if err := f.inject(rank, name); err != nil {
				return nil, err
			}
		}
		if h == nil {
			return nil, nil
		}
		fh := h.(*fhandle)
		f.mu.Lock()
		defer f.mu.Unlock()
		if fh.aborted {
			f.calls = append(f.calls, name)
			return nil, &cuda.Error{Op: name, Code: 4, Name: "ncclInvalidArgument", Msg: "fake: communicator used after ncclCommAbort"}
		}
		return fh, nil
	}
	// push queues work on stream s.
	push := func(st *fstream, work func()) {
		f.mu.Lock()
		st.q = append(st.q, work)
		st.queued++
		f.cond.Broadcast()
		f.mu.Unlock()
	}
	// enqueue queues one NCCL operation (a group of parts, or a collective).
	p2p := func(s cuda.Stream, part *p2pPart) error {
		if group != nil {
			st, err := stream(s)
			if err != nil {
				return err
			}
			if groupS != nil && groupS != st {
				return errors.New("fake: a group on two streams")
			}
			groupS = st
			*group = append(*group, part)
			return nil
		}
		st, err := stream(s)
		if err != nil {
			return err
		}
		push(st, func() { f.runParts([]*p2pPart{part}) })
		return nil
	}
	coll := func(name string, h Handle, a collArgs, s cuda.Stream) error {
		fh, err := call(name, h)
		if err != nil {
			return err
		}
		st, err := stream(s)
		if err != nil {
			return err
		}
		f.mu.Lock()
		k := fh.nColl
		fh.nColl++
		f.mu.Unlock()
		push(st, func() { f.runColl(fh, k, name, a) })
		return nil
	}
	return &Lib{
		UniqueID: func() (cuda.UniqueID, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.ids++
			var id cuda.UniqueID
			binary.LittleEndian.PutUint64(id[:], uint64(f.ids))
			copy(id[8:], "fake nccl id")
			return id, nil
		},
		InitRank: func(nranks int, id cuda.UniqueID, r int) (Handle, error) {
			if _, err := call("ncclCommInitRank", nil); err != nil {
				return nil, err
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			rv := f.inits[id]
			if rv == nil {
				rv = &initRv{nranks: nranks, in: make([]bool, nranks)}
				rv.c = f.newComm(make([]int, nranks))
				f.inits[id] = rv
			}
			if rv.nranks != nranks || r < 0 || r >= nranks {
				return nil, &cuda.Error{Op: "ncclCommInitRank", Code: 4, Name: "ncclInvalidArgument", Msg: fmt.Sprintf("fake: rank %d of %d joins a communicator of %d", r, nranks, rv.nranks)}
			}
			if rv.in[r] {
				return nil, &cuda.Error{Op: "ncclCommInitRank", Code: 5, Name: "ncclInvalidUsage", Msg: fmt.Sprintf("fake: rank %d joined twice", r)}
			}
			rv.in[r] = true
			rv.joined++
			rv.c.world[r] = rank
			rv.c.hs[r].worldRank = rank
			f.cond.Broadcast()
			if err := f.wait(func() bool { return rv.joined == nranks }); err != nil {
				return nil, err
			}
			return rv.c.hs[r], nil
		},
		Split: func(h Handle, color, key int) (Handle, error) {
			fh, err := call("ncclCommSplit", h)
			if err != nil {
				return nil, err
			}
			if color < 0 && color != cuda.SplitNoColor {
				return nil, &cuda.Error{Op: "ncclCommSplit", Code: 4, Name: "ncclInvalidArgument", Msg: fmt.Sprintf("fake: colour %d", color)}
			}
			return f.split(fh, color, key)
		},
		AsyncError: func(h Handle) error {
			fh := h.(*fhandle)
			f.mu.Lock()
			defer f.mu.Unlock()
			if fh.aborted {
				f.calls = append(f.calls, "ncclCommGetAsyncError")
				return &cuda.Error{Op: "ncclCommGetAsyncError", Code: 4, Name: "ncclInvalidArgument", Msg: "fake: communicator used after ncclCommAbort"}
			}
			return fh.async
		},
		Abort: func(h Handle) error {
			fh := h.(*fhandle)
			f.mu.Lock()
			defer f.mu.Unlock()
			if fh.aborted {
				f.calls = append(f.calls, "ncclCommAbort")
				return &cuda.Error{Op: "ncclCommAbort", Code: 4, Name: "ncclInvalidArgument", Msg: "fake: communicator aborted twice"}
			}
			fh.aborted = true
			// Its posted sends and receives will never be matched.
			for _, q := range fh.c.p2p {
				drop := func(p *p2pPart) bool { return p.h == fh }
				q.sends = slices.DeleteFunc(q.sends, drop)
				q.recvs = slices.DeleteFunc(q.recvs, drop)
			}
			if f.remoteErrors {
				for _, o := range fh.c.hs {
					if o != fh && !o.aborted && o.async == nil {
						o.async = &cuda.Error{Op: "ncclCommGetAsyncError", Code: 6, Name: "ncclRemoteError", Msg: fmt.Sprintf("fake: rank %d of the communicator aborted", fh.rank)}
					}
				}
			}
			f.cond.Broadcast()
			return nil
		},
		GroupStart: func() error {
			if group != nil {
				return errors.New("fake: nested groups")
			}
			group, groupS = &[]*p2pPart{}, nil
			return nil
		},
		GroupEnd: func() error {
			if group == nil {
				return errors.New("fake: ncclGroupEnd without ncclGroupStart")
			}
			parts, st := *group, groupS
			group, groupS = nil, nil
			if len(parts) == 0 {
				return nil
			}
			push(st, func() { f.runParts(parts) })
			return nil
		},
		AllReduce: func(h Handle, send, recv cuda.Ptr, n int, t cuda.DataType, s cuda.Stream) error {
			return coll("ncclAllReduce", h, collArgs{send, recv, n, t}, s)
		},
		ReduceScatter: func(h Handle, send, recv cuda.Ptr, n int, s cuda.Stream) error {
			return coll("ncclReduceScatter", h, collArgs{send, recv, n, cuda.F32}, s)
		},
		AllGather: func(h Handle, send, recv cuda.Ptr, n int, t cuda.DataType, s cuda.Stream) error {
			return coll("ncclAllGather", h, collArgs{send, recv, n, t}, s)
		},
		Send: func(h Handle, p cuda.Ptr, n int, t cuda.DataType, peer int, s cuda.Stream) error {
			if t != cuda.F32 {
				return fmt.Errorf("fake ncclSend of %s: the fake moves float32s", t)
			}
			fh, err := call("ncclSend", h)
			if err != nil {
				return err
			}
			return p2p(s, &p2pPart{send: true, p: p, count: n, peer: peer, h: fh})
		},
		Recv: func(h Handle, p cuda.Ptr, n int, t cuda.DataType, peer int, s cuda.Stream) error {
			if t != cuda.F32 {
				return fmt.Errorf("fake ncclRecv of %s: the fake moves float32s", t)
			}
			fh, err := call("ncclRecv", h)
			if err != nil {
				return err
			}
			return p2p(s, &p2pPart{p: p, count: n, peer: peer, h: fh})
		},
		NewStream: func() (cuda.Stream, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			nextS++
			st := &fstream{f: f}
			streams[nextS] = st
			f.wg.Add(1)
			go f.run(st)
			return nextS, nil
		},
		DestroyStream: func(s cuda.Stream) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			st := streams[s]
			if st == nil {
				return fmt.Errorf("fake: no stream %d", s)
			}
			st.dead = true
			delete(streams, s)
			f.cond.Broadcast()
			return nil
		},
		NewEvent: func() (cuda.Event, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.nextEv++
			f.events[f.nextEv] = &fevent{}
			return f.nextEv, nil
		},
		DestroyEvent: func(e cuda.Event) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.events[e] == nil {
				return fmt.Errorf("fake: no event %d", e)
			}
			delete(f.events, e)
			return nil
		},
		Record: func(e cuda.Event, s cuda.Stream) error {
			st, err := stream(s)
			if err != nil {
				return err
			}
			f.mu.Lock()
			ev := f.events[e]
			if ev == nil {
				f.mu.Unlock()
				return fmt.Errorf("fake: no event %d", e)
			}
			ev.gen++
			g := ev.gen
			f.mu.Unlock()
			push(st, func() {
				ev.done = max(ev.done, g)
			})
			return nil
		},
		Done: func(e cuda.Event) (bool, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			ev := f.events[e]
			if ev == nil {
				return false, fmt.Errorf("fake: no event %d", e)
			}
			return ev.done >= ev.gen, nil
		},
		WaitEvent: func(s cuda.Stream, e cuda.Event) error {
			st, err := stream(s)
			if err != nil {
				return err
			}
			f.mu.Lock()
			ev := f.events[e]
			if ev == nil {
				f.mu.Unlock()
				return fmt.Errorf("fake: no event %d", e)
			}
			g := ev.gen
			f.mu.Unlock()
			push(st, func() { f.wait(func() bool { return ev.done >= g }) })
			return nil
		},
		Reachable: func(p unsafe.Pointer) bool {
			f.mu.Lock()
			defer f.mu.Unlock()
			_, err := f.mem(cuda.Ptr(uintptr(p)), 1)
			return err == nil
		},
		Alloc: func(n int) (cuda.Ptr, error) {
			b := f.alloc(n)
			return cuda.Ptr(uintptr(unsafe.Pointer(unsafe.SliceData(b)))), nil
		},
		Free: func(p cuda.Ptr) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			i := slices.IndexFunc(f.spans, func(s span) bool { return s.lo == uintptr(p) })
			if i < 0 {
				return fmt.Errorf("fake: free of %#x, not allocated", uintptr(p))
			}
			f.spans = slices.Delete(f.spans, i, i+1)
			return nil
		},
		// The copies run on the legacy default stream: after every
		// stream's work queued before them.
		CopyHtoD: func(dst cuda.Ptr, src unsafe.Pointer, n int) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			if err := f.drain(streams); err != nil {
				return err
			}
			d, err := f.mem(dst, n)
			if err != nil {
				return err
			}
			copy(d, unsafe.Slice((*byte)(src), n))
			return nil
		},
		CopyDtoH: func(dst unsafe.Pointer, src cuda.Ptr, n int) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			if err := f.drain(streams); err != nil {
				return err
			}
			s, err := f.mem(src, n)
			if err != nil {
				return err
			}
			copy(unsafe.Slice((*byte)(dst), n), s)
			return nil
		},
	}
}

// drain waits until the streams have run everything queued (under mu).
func (f *fake) drain(streams map[cuda.Stream]*fstream) error {
	for _, st := range streams {
		n := st.queued
		if err := f.wait(func() bool { return st.ran >= n }); err != nil {
			return err
		}
	}
	return nil
}

// syncStream waits until stream s of lib has run everything queued.
func (f *fake) syncStream(l *Lib, s cuda.Stream) error {
	e, err := l.NewEvent()
	if err != nil {
		return err
	}
	defer l.DestroyEvent(e)
	if err := l.Record(e, s); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ev := f.events[e]
	return f.wait(func() bool { return ev.done >= ev.gen })
}

// run is a stream's goroutine.
func (f *fake) run(st *fstream) {
	defer f.wg.Done()
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		if err := f.wait(func() bool { return len(st.q) > 0 || st.dead }); err != nil {
			return
		}
		if len(st.q) == 0 {
			return // destroyed, and done
		}
		work := st.q[0]
		st.q = st.q[1:]
		work() // under mu; blocking work waits on cond
		st.ran++
		f.cond.Broadcast()
	}
}

// runParts posts a group's sends and receives, then waits until every one
// has met its match (on the stream, under mu).
func (f *fake) runParts(parts []*p2pPart) {
	for _, p := range parts {
		c := p.h.c
		if p.h.aborted { // the kernel exits at once
			p.done = true
			continue
		}
		if p.peer < 0 || p.peer >= len(c.hs) {
			p.done, p.err = true, fmt.Errorf("fake: peer %d", p.peer)
			continue
		}
		from, to := p.h.rank, p.peer
		if !p.send {
			from, to = p.peer, p.h.rank
		}
		q := c.p2p[[2]int{from, to}]
		if q == nil {
			q = &p2pQueue{}
			c.p2p[[2]int{from, to}] = q
		}
		if p.send {
			q.sends = append(q.sends, p)
		} else {
			q.recvs = append(q.recvs, p)
		}
		for len(q.sends) > 0 && len(q.recvs) > 0 {
			s, r := q.sends[0], q.recvs[0]
			q.sends, q.recvs = q.sends[1:], q.recvs[1:]
			var err error
			if s.count != r.count {
				err = fmt.Errorf("fake: a send of %d elements met a receive of %d", s.count, r.count)
			} else if src, e := f.mem(s.p, 4*s.count); e != nil {
				err = e
			} else if dst, e := f.mem(r.p, 4*r.count); e != nil {
				err = e
			} else {
				copy(dst, src)
			}
			s.done, s.err, r.done, r.err = true, err, true, err
		}
	}
	f.cond.Broadcast()
	for _, p := range parts {
		f.wait(func() bool { return p.done || p.h.aborted })
		if p.err != nil && p.h.async == nil {
			p.h.async = &cuda.Error{Op: "ncclGroupEnd", Code: 5, Name: "ncclInvalidUsage", Msg: p.err.Error()}
		}
	}
}

// runColl is member h's k-th collective on its stream: it waits for every
// member's, and the last to arrive computes them all (under mu).
func (f *fake) runColl(h *fhandle, k int, kind string, a collArgs) {
	c := h.c
	if h.aborted { // the kernel exits at once
		return
	}
	s := c.colls[k]
	if s == nil {
		s = &collSlot{kind: kind, args: make([]collArgs, len(c.hs))}
		c.colls[k] = s
	}
	s.args[h.rank] = a
	s.arrived++
	if s.kind != kind {
		s.err = fmt.Errorf("fake: collective %d is %s on one member, %s on another", k, s.kind, kind)
	}
	if s.arrived == len(c.hs) {
		if s.err == nil {
			s.err = f.compute(s)
		}
		s.done = true
		delete(c.colls, k)
		f.cond.Broadcast()
	}
	f.wait(func() bool { return s.done || h.aborted })
	if s.err != nil && h.async == nil {
		h.async = &cuda.Error{Op: kind, Code: 5, Name: "ncclInvalidUsage", Msg: s.err.Error()}
	}
}

// compute runs a collective whose members have all arrived.
func (f *fake) compute(s *collSlot) error {
	n := len(s.args)
	a0 := s.args[0]
	size := 4
	switch {
	case a0.t == cuda.F64:
		size = 8
	case a0.t == cuda.BF16 && s.kind == "ncclAllReduce":
		size = 2 // bfloat16 sums (AllReduceBF16Async)
	}
	for _, a := range s.args {
		if a.count != a0.count || a.t != a0.t {
			return fmt.Errorf("fake: %s of %d %v on one member, %d %v on another", s.kind, a0.count, a0.t, a.count, a.t)
		}
	}
	get := func(b []byte, i int) float64 {
		switch size {
		case 8:
			return math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
		case 2:
			return float64(half.BF16ToF32(binary.LittleEndian.Uint16(b[2*i:])))
		}
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	}
	put := func(b []byte, i int, v float64) {
		switch size {
		case 8:
			binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
		case 2:
			binary.LittleEndian.PutUint16(b[2*i:], half.F32ToBF16(float32(v)))
		default:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
		}
	}
	in, out := a0.count, a0.count
	switch s.kind {
	case "ncclReduceScatter":
		in = n * a0.count
	case "ncclAllGather":
		out = n * a0.count
	}
	sends := make([][]byte, n)
	for r, a := range s.args {
		b, err := f.mem(a.send, size*in)
		if err != nil {
			return err
		}
		sends[r] = slices.Clone(b) // in place: read everything before writing
	}
	for r, a := range s.args {
		dst, err := f.mem(a.recv, size*out)
		if err != nil {
			return err
		}
		for i := 0; i < out; i++ {
			var v float64
			switch s.kind {
			case "ncclAllReduce":
				for m := range n { // in float32 for F32, as a GPU adds; BF16 each sum stored in bfloat16
					switch size {
					case 4:
						v = float64(float32(v) + float32(get(sends[m], i)))
					case 2:
						v = float64(half.BF16ToF32(half.F32ToBF16(float32(v) + float32(get(sends[m], i)))))
					default:
						v += get(sends[m], i)
					}
				}
			case "ncclReduceScatter":
				for m := range n {
					v = float64(float32(v) + float32(get(sends[m], r*out+i)))
				}
			case "ncclAllGather":
				v = get(sends[i/a0.count], i%a0.count)
			}
			put(dst, i, v)
		}
	}
	return nil
}

// split is member h's next split of its communicator: it waits for every
// member's and the last to arrive makes the new communicators.
func (f *fake) split(h *fhandle, color, key int) (Handle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := h.c
	k := h.nSplit
	h.nSplit++
	f.splits = append(f.splits, splitCall{world: h.worldRank, n: k, color: color, key: key})
	s := c.splits[k]
	if s == nil {
		s = &splitSlot{calls: map[int][2]int{}, results: map[int]*fhandle{}}
		c.splits[k] = s
	}
	s.calls[h.rank] = [2]int{color, key}
	if len(s.calls) == len(c.hs) {
		byColor := map[int][]int{}
		for r, ck := range s.calls {
			if ck[0] != cuda.SplitNoColor {
				byColor[ck[0]] = append(byColor[ck[0]], r)
			}
		}
		for _, rs := range byColor {
			slices.SortFunc(rs, func(a, b int) int {
				if d := s.calls[a][1] - s.calls[b][1]; d != 0 {
					return d
				}
				return a - b
			})
			world := make([]int, len(rs))
			for i, r := range rs {
				world[i] = c.hs[r].worldRank
			}
			nc := f.newComm(world)
			for i, r := range rs {
				s.results[r] = nc.hs[i]
			}
		}
		s.done = true
		f.cond.Broadcast()
	}
	if err := f.wait(func() bool { return s.done || h.aborted }); err != nil {
		return nil, err
	}
	if !s.done {
		return nil, &cuda.Error{Op: "ncclCommSplit", Code: 5, Name: "ncclInvalidUsage", Msg: "fake: aborted"}
	}
	if r := s.results[h.rank]; r != nil {
		return r, nil
	}
	return nil, nil
}
