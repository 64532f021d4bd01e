package nccl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/kernels/cuda"
)

// DefaultPoll is how often the watchdog looks at the operations in flight
// when Options.Poll is zero.
const DefaultPoll = 2 * time.Millisecond

// Options configure [New].
type Options struct {
	// Lib is the library: Real(the backend's device, NCCL) on a GPU.
	Lib *Lib
	// Stream is the rank's compute stream (the backend's): operations are
	// queued on it, after the kernels queued before them.
	Stream cuda.Stream
	// Timeout bounds every operation of a communicator but its first: one
	// that runs this long fails, and the fabric with it. Zero means
	// comm.DefaultTimeout; give the World's.
	Timeout time.Duration
	// InitTimeout bounds making a communicator (ncclCommInitRank, the
	// splits) and each communicator's first operation, inside which NCCL
	// connects to the peers: the ranks come to them at different times
	// (each compiles its kernels, a pipeline's first receive waits through
	// the warm-up). Zero means Timeout; give the World's
	// (comm.Config.InitTimeout: 10 minutes for a job's workers).
	InitTimeout time.Duration
	// Poll is how often the watchdog looks at the operations in flight
	// and at the communicators' asynchronous errors; zero means
	// DefaultPoll.
	Poll time.Duration
	// Halves, when set, finds the backend's bfloat16 activations among an
	// operation's buffers (cuda.Backend.Half): the float32s the engine
	// addresses at p (bytes of them) that are bfloat16s at the address it
	// returns. Sends, receives and gathers move those as ncclBfloat16,
	// and AllReduceBF16Async sums them so; the other sums refuse them
	// (they stay float32, kernels/activations.go), as does a gather
	// between a bfloat16 and a float32 buffer.
	Halves func(p unsafe.Pointer, bytes int) (cuda.Ptr, bool)
}

// ErrClosed is the error of operations after [Fabric.Close].
var ErrClosed = errors.New("nccl: fabric closed")

// OpError is a failed operation: the rank, its communicator and its
// operation, and why. Err wraps context.DeadlineExceeded for an operation
// that ran past the timeout, the context's cause for a canceled one, the
// World's [*comm.PeerError] when a member failed there, and the library's
// [*cuda.Error] for NCCL's own errors.
type OpError struct {
	Rank int           // this process's world rank
	Op   comm.OpStatus // the communicator (Group), operation and number
	Err  error
}

// Error reads "nccl: rank 3: AllReduce #12 (dp): …".
func (e *OpError) Error() string { return fmt.Sprintf("nccl: rank %d: %s: %v", e.Rank, e.Op, e.Err) }

// Unwrap returns e.Err.
func (e *OpError) Unwrap() error { return e.Err }

// Fabric is one rank's NCCL communicators: a [comm.CollectiveFabric]. New
// makes the world communicator, Communicator declares the others, Ready
// splits them off the world communicator, and Close frees them all. Its
// methods are safe for concurrent use; a communicator's operations are
// issued from one goroutine at a time.
type Fabric struct {
	lib           *Lib
	halves        func(unsafe.Pointer, int) (cuda.Ptr, bool)
	w             *comm.World
	boot          *comm.Group // all ranks over TCP: the unique id, the declarations
	compute, side cuda.Stream // side: the stream AllReduceAsync runs on
	timeout, poll time.Duration
	initTimeout   time.Duration // making a communicator, and its first operation

	root Handle // the world communicator, which Ready splits

	stageMu sync.Mutex // held while an operation uses the staging buffer
	stage   cuda.Ptr   // device memory host buffers are staged through
	stageN  int        // its bytes

	mu      sync.Mutex
	decls   []*Comm // Communicator's, in order
	ready   bool
	closed  bool
	err     error         // the first failure, which ends every communicator
	dead    chan struct{} // closed when err is set
	handles []Handle      // the live communicators, for Abort
	events  []cuda.Event  // free events
	record                // the operations issued, for Progress and the watchdog

	stop    chan struct{} // closed by Close: the watchdog ends
	stopped chan struct{} // closed when it has
}

// New joins the NCCL world communicator of w's ranks, on this process's
// GPU (the one opts.Lib drives): rank 0 makes the unique id
// (ncclGetUniqueId) and sends it to the others over w, whose connections
// are authenticated; every rank then joins (ncclCommInitRank). Every rank
// of w must call New, before making any other group of w. It fails
// within the timeout if a rank does not join.
func New(ctx context.Context, w *comm.World, opts Options) (*Fabric, error) {
	if opts.Lib == nil {
		return nil, errors.New("nccl: New: no library")
	}
	f := &Fabric{
		lib: opts.Lib, halves: opts.Halves, w: w, compute: opts.Stream,
		timeout: cmpOr(opts.Timeout, comm.DefaultTimeout), poll: cmpOr(opts.Poll, DefaultPoll),
		initTimeout: cmpOr(opts.InitTimeout, cmpOr(opts.Timeout, comm.DefaultTimeout)),
		dead:        make(chan struct{}), stop: make(chan struct{}), stopped: make(chan struct{}),
	}
	var err error
	if f.boot, err = w.WorldGroup("nccl bootstrap"); err != nil {
		return nil, fmt.Errorf("nccl: %w", err)
	}
	id, err := f.uniqueID(ctx)
	if err != nil {
		return nil, err
	}
	if f.side, err = f.lib.NewStream(); err != nil {
		return nil, fmt.Errorf("nccl: communication stream: %w", err)
	}
	err = f.blocking(ctx, "ncclCommInitRank", func() (err error) {
		f.root, err = f.lib.InitRank(w.Size(), id, w.Rank())
		return err
	})
	if err != nil {
		f.lib.DestroyStream(f.side)
		return nil, err
	}
	f.handles = []Handle{f.root}
	go f.watch()
	return f, nil
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// uniqueID makes the communicator's id on rank 0 and broadcasts it over
// the bootstrap group, a byte per float32 (exact).
func (f *Fabric) uniqueID(ctx context.Context) (cuda.UniqueID, error) {
	var id cuda.UniqueID
	if f.w.Rank() == 0 {
		var err error
		if id, err = f.lib.UniqueID(); err != nil {
			return id, fmt.Errorf("nccl: rank 0: %w", err)
		}
	}
	buf := make([]float32, len(id))
	for i, b := range id {
		buf[i] = float32(b)
	}
	if err := f.boot.Broadcast(ctx, buf, 0); err != nil {
		return id, fmt.Errorf("nccl: sending the unique id: %w", err)
	}
	for i, v := range buf {
		if v < 0 || v > 255 || v != float32(byte(v)) {
			return id, fmt.Errorf("nccl: the unique id from rank 0 has %g at byte %d", v, i)
		}
		id[i] = byte(v)
	}
	return id, nil
}

// blocking runs call, an NCCL call that waits for every rank (making a
// communicator), and gives up when the timeout passes, the World fails or
// ctx ends. Such a call cannot be stopped: it is left behind, and the
// process, whose job has failed, exits.
func (f *Fabric) blocking(ctx context.Context, what string, call func() error) error {
	done := make(chan error, 1)
	go func() { done <- call() }()
	deadline := time.NewTimer(f.initTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * f.poll)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("nccl: rank %d: %s: %w", f.w.Rank(), what, err)
			}
			return nil
		case <-deadline.C:
			return fmt.Errorf("nccl: rank %d: %s: not every rank took part within %v (GPTUI_COMM_INIT_TIMEOUT): %w", f.w.Rank(), what, f.initTimeout, context.DeadlineExceeded)
		case <-ctx.Done():
			return fmt.Errorf("nccl: rank %d: %s: %w", f.w.Rank(), what, context.Cause(ctx))
		case <-tick.C:
			if err := f.w.Err(); err != nil {
				return fmt.Errorf("nccl: rank %d: %s: %w", f.w.Rank(), what, err)
			}
		}
	}
}

// Rank is this process's world rank.
func (f *Fabric) Rank() int { return f.w.Rank() }

// Size is the number of ranks.
func (f *Fabric) Size() int { return f.w.Size() }

// Communicator declares the communicator of the given world ranks
// (ascending, this rank among them). It can be used once Ready has made
// it; until then its operations fail.
func (f *Fabric) Communicator(name string, ranks []int) (comm.Communicator, error) {
	self := -1
	for i, r := range ranks {
		if r < 0 || r >= f.w.Size() {
			return nil, fmt.Errorf("nccl: communicator %q: rank %d is outside the world [0, %d)", name, r, f.w.Size())
		}
		if i > 0 && r <= ranks[i-1] {
			return nil, fmt.Errorf("nccl: communicator %q: ranks %v are not strictly ascending", name, ranks)
		}
		if r == f.w.Rank() {
			self = i
		}
	}
	if self < 0 {
		return nil, fmt.Errorf("nccl: communicator %q: ranks %v do not include this process's rank %d", name, ranks, f.w.Rank())
	}
	if name == "" {
		name = fmt.Sprint(ranks)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ready {
		return nil, fmt.Errorf("nccl: communicator %q declared after Ready", name)
	}
	c := &Comm{f: f, name: name, ranks: slices.Clone(ranks), rank: self}
	f.decls = append(f.decls, c)
	return c, nil
}

// decl is a communicator as a rank declared it.
type decl struct {
	Name  string `json:"name"`
	Ranks []int  `json:"ranks"`
}

// split is one ncclCommSplit of the world communicator, in which every
// rank takes part: a member of the communicator with this colour, or
// none (cuda.SplitNoColor).
type split struct {
	id         string // the communicator's name and its number among the rank's of that name: "pp#1"
	color, key int    // the colour: the members' lowest world rank; the key: this rank's place among them
	decl       int    // this rank's declaration, or -1
}

// Ready makes every communicator declared on every rank: the ranks send
// one another their declarations (over the World), and split the world
// communicator once per communicator name, in the same order on every
// rank (ncclCommSplit is collective over the world): the members of a
// communicator pass the same colour, derived from its member list, and
// their places in it as keys; the other ranks pass no colour. Every rank
// must call Ready once, after declaring all of its communicators; it
// fails, naming the ranks, when their declarations do not fit together.
func (f *Fabric) Ready(ctx context.Context) error {
	f.mu.Lock()
	if f.ready {
		f.mu.Unlock()
		return errors.New("nccl: Ready called twice")
	}
	f.ready = true
	decls := make([]decl, len(f.decls))
	for i, c := range f.decls {
		decls[i] = decl{c.name, c.ranks}
	}
	f.mu.Unlock()
	b, err := json.Marshal(decls)
	if err != nil {
		return fmt.Errorf("nccl: %w", err)
	}
	all, err := f.exchange(ctx, b)
	if err != nil {
		return err
	}
	byRank := make([][]decl, len(all))
	for r, b := range all {
		if err := json.Unmarshal(b, &byRank[r]); err != nil {
			return fmt.Errorf("nccl: rank %d's communicators: %w", r, err)
		}
	}
	splits, err := plan(f.w.Rank(), byRank)
	if err != nil {
		return err
	}
	for _, s := range splits {
		var h Handle
		err := f.blocking(ctx, fmt.Sprintf("ncclCommSplit(color %d, key %d) for %s", s.color, s.key, s.id), func() (err error) {
			h, err = f.lib.Split(f.root, s.color, s.key)
			return err
		})
		if err != nil {
			f.fail(err)
			return err
		}
		f.mu.Lock()
		if h != nil {
			f.handles = append(f.handles, h)
		}
		f.mu.Unlock()
		switch {
		case s.decl < 0 && h != nil:
			err = fmt.Errorf("nccl: rank %d: %s: a split with no colour gave a communicator", f.w.Rank(), s.id)
		case s.decl < 0:
			continue
		case h == nil:
			err = fmt.Errorf("nccl: rank %d: %s: the split gave no communicator", f.w.Rank(), s.id)
		case h.Size() != len(decls[s.decl].Ranks) || h.Rank() != s.key:
			err = fmt.Errorf("nccl: rank %d: %s: the split made rank %d of %d, want %d of %d", f.w.Rank(), s.id, h.Rank(), h.Size(), s.key, len(decls[s.decl].Ranks))
		}
		if err != nil {
			f.fail(err)
			return err
		}
		f.mu.Lock()
		f.decls[s.decl].h = h
		f.mu.Unlock()
	}
	return nil
}

// maxDecls bounds a rank's declarations as sent (bytes of JSON).
const maxDecls = 1 << 20

// exchange all-gathers every rank's b over the bootstrap group, a byte per
// float32, and returns them by rank.
func (f *Fabric) exchange(ctx context.Context, b []byte) ([][]byte, error) {
	n := f.w.Size()
	lens := make([]float32, n)
	if err := f.boot.AllGather(ctx, []float32{float32(len(b))}, lens); err != nil {
		return nil, fmt.Errorf("nccl: exchanging the communicators: %w", err)
	}
	longest := 0
	for r, l := range lens {
		if l < 0 || l > maxDecls || l != float32(int(l)) {
			return nil, fmt.Errorf("nccl: rank %d declares %g bytes of communicators (at most %d)", r, l, maxDecls)
		}
		longest = max(longest, int(l))
	}
	in := make([]float32, max(longest, 1))
	for i, c := range b {
		in[i] = float32(c)
	}
	out := make([]float32, n*len(in))
	if err := f.boot.AllGather(ctx, in, out); err != nil {
		return nil, fmt.Errorf("nccl: exchanging the communicators: %w", err)
	}
	all := make([][]byte, n)
	for r := range all {
		all[r] = make([]byte, int(lens[r]))
		for i := range all[r] {
			all[r][i] = byte(out[r*len(in)+i])
		}
	}
	return all, nil
}

// plan returns the splits rank self takes part in, given every rank's
// declarations: one per communicator id (a name and its number among the
// rank's communicators of that name), in the order the ids first appear
// going through the ranks in order, so the same on every rank. It checks
// that every member of a communicator declared it with the same ranks,
// which also makes the communicators of one id disjoint.
func plan(self int, byRank [][]decl) ([]split, error) {
	ids := make([][]string, len(byRank)) // ids[r][i]: the id of rank r's i-th declaration
	where := map[string]map[int]int{}    // id → rank → its declaration
	var order []string
	for r, ds := range byRank {
		seen := map[string]int{}
		for i, d := range ds {
			id := d.Name
			if n := seen[d.Name]; n > 0 {
				id = fmt.Sprintf("%s#%d", d.Name, n)
			}
			seen[d.Name]++
			ids[r] = append(ids[r], id)
			if where[id] == nil {
				where[id] = map[int]int{}
				order = append(order, id)
			}
			where[id][r] = i
		}
	}
	for r, ds := range byRank {
		for i, d := range ds {
			if !slices.Contains(d.Ranks, r) {
				return nil, fmt.Errorf("nccl: rank %d declared communicator %s with ranks %v, without itself", r, ids[r][i], d.Ranks)
			}
			for _, m := range d.Ranks {
				if m < 0 || m >= len(byRank) {
					return nil, fmt.Errorf("nccl: rank %d declared communicator %s with ranks %v, outside the world of %d", r, ids[r][i], d.Ranks, len(byRank))
				}
				j, ok := where[ids[r][i]][m]
				if !ok {
					return nil, fmt.Errorf("nccl: rank %d declared communicator %s with ranks %v, but rank %d did not declare it (the ranks must create the same communicators in the same order)", r, ids[r][i], d.Ranks, m)
				}
				if other := byRank[m][j].Ranks; !slices.Equal(other, d.Ranks) {
					return nil, fmt.Errorf("nccl: rank %d declared communicator %s with ranks %v, but rank %d with ranks %v", r, ids[r][i], d.Ranks, m, other)
				}
			}
		}
	}
	out := make([]split, len(order))
	for k, id := range order {
		s := split{id: id, color: cuda.SplitNoColor, decl: -1}
		if i, ok := where[id][self]; ok {
			ranks := byRank[self][i].Ranks
			s.color, s.key, s.decl = ranks[0], slices.Index(ranks, self), i
		}
		out[k] = s
	}
	return out, nil
}

// splitsString lists splits as "dp:0/1 mp:- …" (id:colour/key, - for
// none), for tests.
func splitsString(ss []split) string {
	var b strings.Builder
	for i, s := range ss {
		if i > 0 {
			b.WriteByte(' ')
		}
		if s.decl < 0 {
			fmt.Fprintf(&b, "%s:-", s.id)
		} else {
			fmt.Fprintf(&b, "%s:%d/%d", s.id, s.color, s.key)
		}
	}
	return b.String()
}

// fail ends the fabric with err, the first failure: every communicator is
// aborted (ncclCommAbort), which ends the operations queued or running
// on them, and every operation after fails with err.
func (f *Fabric) fail(err error) {
	f.mu.Lock()
	if f.err != nil {
		f.mu.Unlock()
		return
	}
	f.err = err
	close(f.dead)
	hs := f.handles
	f.handles = nil
	f.mu.Unlock()
	for _, h := range hs {
		f.lib.Abort(h)
	}
}

// Err returns the fabric's failure, or nil while it is usable.
func (f *Fabric) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// Close waits, within the timeout, for the operations queued so far, then
// frees every communicator (ncclCommAbort, which does not wait for the
// other ranks), the streams and buffers of the fabric. Operations after
// Close fail with ErrClosed. Close the fabric before the World.
func (f *Fabric) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	f.mu.Unlock()
	for end := time.Now().Add(f.timeout); time.Now().Before(end); time.Sleep(f.poll) {
		f.mu.Lock()
		idle := len(f.ops) == 0 || f.err != nil
		f.mu.Unlock()
		if idle {
			break
		}
	}
	close(f.stop)
	<-f.stopped
	f.fail(ErrClosed)
	f.mu.Lock()
	events := f.events
	f.events = nil
	for _, o := range f.ops {
		events = append(events, o.pre, o.post)
	}
	f.ops = nil
	f.mu.Unlock()
	var errs []error
	for _, e := range events {
		if e != 0 {
			errs = append(errs, f.lib.DestroyEvent(e))
		}
	}
	errs = append(errs, f.lib.DestroyStream(f.side))
	f.stageMu.Lock()
	if f.stage != 0 {
		errs = append(errs, f.lib.Free(f.stage))
		f.stage, f.stageN = 0, 0
	}
	f.stageMu.Unlock()
	return errors.Join(errs...)
}

// The fabric is a comm.CollectiveFabric.
var _ comm.CollectiveFabric = (*Fabric)(nil)
