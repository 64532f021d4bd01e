package comm

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"
)

// World is this process's membership in a job: its rank, and one TCP
// connection to every other rank. Its methods are safe for concurrent use.
type World struct {
	rank, size int
	addrs      []string // every rank's mesh address
	conns      []*conn  // by world rank; nil for this process
	timeout    time.Duration
	silence    time.Duration // a peer quiet this long has failed
	heartbeat  time.Duration // idle connections send a heartbeat this often
	chunkBytes int
	bufs       sync.Pool // *[]float32 of chunkBytes/4, for early frames

	mu      sync.Mutex
	err     error         // why the World ended: a failure, or ErrClosed
	dead    chan struct{} // closed when err is set
	closing bool          // Close has been called
	groups  map[uint64]*Group
	created map[string]int // groups made per member list

	progress progress // operations done and in flight, for Progress

	closeOnce sync.Once
}

// newWorld starts the connection goroutines of a connected mesh.
func newWorld(cfg Config, addrs []string, ncs []*net.TCPConn) *World {
	w := &World{
		rank:       cfg.Rank,
		size:       cfg.WorldSize,
		addrs:      addrs,
		conns:      make([]*conn, cfg.WorldSize),
		timeout:    cfg.Timeout,
		silence:    cfg.Timeout / 2,
		heartbeat:  cfg.Timeout / 8,
		chunkBytes: cfg.chunkBytes,
		dead:       make(chan struct{}),
		groups:     make(map[uint64]*Group),
		created:    make(map[string]int),
	}
	for r, nc := range ncs {
		if r != w.rank && nc != nil {
			w.conns[r] = newConn(w, r, nc)
		}
	}
	for _, c := range w.conns {
		if c != nil {
			go c.readLoop()
			go c.writeLoop()
		}
	}
	return w
}

// Rank returns this process's rank in the World.
func (w *World) Rank() int { return w.rank }

// Size returns the number of processes in the World.
func (w *World) Size() int { return w.size }

// Err returns why the World ended — a [*PeerError] for a member that
// failed, [ErrClosed] after Close — or nil while it is usable. A data path
// that runs beside the World (package comm/nccl) polls it to fail with the
// World and to name the member that failed.
func (w *World) Err() error { return w.failure() }

// failure returns why the World ended, or nil while it is usable.
func (w *World) failure() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *World) isDead() bool {
	select {
	case <-w.dead:
		return true
	default:
		return false
	}
}

func (w *World) isClosing() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closing
}

// fail ends the World with err (the first failure wins): every waiter
// wakes, writers stop and tell the peers, and the connection of the peer
// that err names is cut off.
func (w *World) fail(err error) {
	w.mu.Lock()
	if w.err != nil {
		w.mu.Unlock()
		return
	}
	w.err = err
	close(w.dead)
	w.mu.Unlock()
	var pe *PeerError
	if errors.As(err, &pe) && pe.Rank != w.rank && w.conns[pe.Rank] != nil {
		w.conns[pe.Rank].interrupt()
	}
}

// abort ends the World because an operation of this process gave up.
func (w *World) abort(cause error) {
	w.fail(fmt.Errorf("comm: rank %d abandoned an operation, which ends the world: %w", w.rank, cause))
}

// Close leaves the World: pending operations fail with ErrClosed, the
// peers are told, and the connections are shut down. To lose no data in
// flight, Close waits for each peer to close its side too, for at most the
// timeout (the ranks of a job normally close together). Operations on the
// World's groups after Close return ErrClosed. Close always returns nil
// (after the first call, too); it exists to satisfy io.Closer.
func (w *World) Close() error {
	w.closeOnce.Do(func() {
		w.mu.Lock()
		if w.err == nil {
			w.err = ErrClosed
			close(w.dead)
		}
		w.closing = true
		groups := make([]*Group, 0, len(w.groups))
		for _, g := range w.groups {
			groups = append(groups, g)
		}
		w.mu.Unlock()
		for _, g := range groups {
			<-g.done
		}
		linger := time.NewTimer(w.timeout)
		defer linger.Stop()
		for _, c := range w.conns {
			if c == nil {
				continue
			}
			<-c.writerDone
			select {
			case <-c.readerDone:
			case <-linger.C:
				c.nc.Close() // the peer is slow to close; stop waiting
				<-c.readerDone
			}
			c.nc.Close()
		}
	})
	return nil
}

// Group returns a communicator for the world ranks listed, which must be
// ascending and include this process's rank. Group(all ranks) spans the
// whole World. Every member must create the same groups in the same order:
// a group is identified by its member list and by how many groups with that
// list the member created before; no messages are exchanged. Each call
// makes a new communicator (with its own operation order), also for a list
// seen before.
func (w *World) Group(ranks []int) (*Group, error) { return w.NamedGroup("", ranks) }

// NamedGroup is Group with a name, such as "dp", by which Progress tells
// the group's operations apart; "" names it by its ranks.
// The name plays no part in matching groups across processes.
func (w *World) NamedGroup(name string, ranks []int) (*Group, error) {
	if len(ranks) == 0 {
		return nil, errors.New("comm: Group: no ranks")
	}
	self := -1
	for i, r := range ranks {
		if r < 0 || r >= w.size {
			return nil, fmt.Errorf("comm: Group: rank %d is outside the world [0, %d)", r, w.size)
		}
		if i > 0 && r <= ranks[i-1] {
			return nil, fmt.Errorf("comm: Group: ranks %v are not strictly ascending", ranks)
		}
		if r == w.rank {
			self = i
		}
	}
	if self < 0 {
		return nil, fmt.Errorf("comm: Group: ranks %v do not include this process's rank %d", ranks, w.rank)
	}
	key := fmt.Sprint(ranks)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return nil, w.err
	}
	n := w.created[key]
	h := fnv.New64a()
	h.Write([]byte(key + "#" + strconv.Itoa(n)))
	id := h.Sum64()
	if _, dup := w.groups[id]; dup {
		return nil, fmt.Errorf("comm: Group: id collision for %v", ranks)
	}
	w.created[key] = n + 1
	if name == "" {
		name = key
	}
	g := newGroup(w, id, name, slices.Clone(ranks), self)
	w.groups[id] = g
	go g.work()
	return g, nil
}

// WorldGroup is NamedGroup(name, every rank): a group of the whole world.
func (w *World) WorldGroup(name string) (*Group, error) {
	all := make([]int, w.Size())
	for i := range all {
		all[i] = i
	}
	return w.NamedGroup(name, all)
}

// getBuf returns a buffer for an n-byte frame that arrived early.
func (w *World) getBuf(n int) *frameBuf {
	if n > w.chunkBytes {
		f := make([]float32, (n+3)/4)
		return &frameBuf{f: f, b: f32Bytes(f)[:n]}
	}
	var f []float32
	if p, ok := w.bufs.Get().(*[]float32); ok {
		f = *p
	} else {
		f = make([]float32, w.chunkBytes/4)
	}
	return &frameBuf{f: f, b: f32Bytes(f)[:n]}
}

// putBuf recycles a buffer from getBuf.
func (w *World) putBuf(b *frameBuf) {
	if 4*len(b.f) == w.chunkBytes {
		f := b.f
		w.bufs.Put(&f)
	}
}
