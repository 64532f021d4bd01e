package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gptui/gptui/comm"
)

// rendezvous is a test double for NCCL's point-to-point semantics, shared
// by the ranks of one in-process job: a send completes only once its
// matching receive has been issued (and the receive once its send has),
// the k-th send from one rank to another on a communicator meeting the
// other's k-th receive from it. The TCP ring buffers sends, so a schedule
// that would hang on GPUs runs on it; under rendezvous it hangs here too,
// and since every rank of the job waits on it, the hang is seen at once:
// when all ranks wait and nothing can match, every waiting operation fails
// with an error that names each rank's operation.
type rendezvous struct {
	mu      sync.Mutex
	size    int                    // ranks in the job
	queues  map[rvChannel]*rvQueue // by channel
	waiting map[int]*rvWait        // by world rank: the operation it waits in
	failed  error                  // the deadlock, once seen
}

// rvChannel is one direction between two members of a communicator.
type rvChannel struct {
	comm     string // the communicator's name and members
	from, to int    // world ranks
}

// rvQueue holds a channel's posted sends and receives not yet matched.
type rvQueue struct {
	sends, recvs []*rvPost
}

// rvPost is a send or receive waiting for its other half.
type rvPost struct {
	buf  []float32
	done bool
	err  error
	w    *rvWait
}

// rvWait is one rank's operation: the posts it waits for.
type rvWait struct {
	rank  int
	what  string
	left  int // posts not yet matched
	wake  chan struct{}
	posts []*rvPost
}

func newRendezvous(size int) *rendezvous {
	return &rendezvous{size: size, queues: map[rvChannel]*rvQueue{}, waiting: map[int]*rvWait{}}
}

// fabric is rank's fabric: w's TCP communicators, whose point-to-point
// operations go through the rendezvous instead.
func (h *rendezvous) fabric(w *comm.World) comm.Fabric {
	return rvFabric{Fabric: w.Fabric(nil), h: h}
}

type rvFabric struct {
	comm.Fabric
	h *rendezvous
}

func (f rvFabric) Communicator(name string, ranks []int) (comm.Communicator, error) {
	c, err := f.Fabric.Communicator(name, ranks)
	if err != nil {
		return nil, err
	}
	return &rvComm{Communicator: c, h: f.h, key: fmt.Sprint(name, ranks), ranks: ranks, rank: f.Rank(), name: name}, nil
}

// rvComm is a communicator whose Send, Recv and Exchange rendezvous.
type rvComm struct {
	comm.Communicator
	h     *rendezvous
	key   string
	name  string
	ranks []int // world ranks of the members
	rank  int   // this world rank
}

func (c *rvComm) Send(ctx context.Context, buf []float32, to int) error {
	return c.Exchange(ctx, []comm.Transfer{{Peer: to, Buf: buf}}, nil)
}

func (c *rvComm) Recv(ctx context.Context, buf []float32, from int) error {
	return c.Exchange(ctx, nil, []comm.Transfer{{Peer: from, Buf: buf}})
}

func (c *rvComm) Exchange(ctx context.Context, sends, recvs []comm.Transfer) error {
	var what []string
	for _, x := range sends {
		what = append(what, fmt.Sprintf("send %d floats to rank %d", len(x.Buf), c.ranks[x.Peer]))
	}
	for _, x := range recvs {
		what = append(what, fmt.Sprintf("receive %d floats from rank %d", len(x.Buf), c.ranks[x.Peer]))
	}
	h := c.h
	h.mu.Lock()
	if h.failed != nil {
		h.mu.Unlock()
		return h.failed
	}
	w := &rvWait{rank: c.rank, what: fmt.Sprintf("%s (%s)", strings.Join(what, ", "), c.name), wake: make(chan struct{}), left: len(sends) + len(recvs)}
	for _, x := range sends {
		w.posts = append(w.posts, h.post(w, rvChannel{c.key, c.rank, c.ranks[x.Peer]}, x.Buf, true))
	}
	for _, x := range recvs {
		w.posts = append(w.posts, h.post(w, rvChannel{c.key, c.ranks[x.Peer], c.rank}, x.Buf, false))
	}
	if w.left == 0 {
		h.mu.Unlock()
		<-w.wake
		return firstErr(w.posts)
	}
	h.waiting[c.rank] = w
	h.checkDeadlock()
	h.mu.Unlock()
	select {
	case <-w.wake:
		return firstErr(w.posts)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func firstErr(posts []*rvPost) error {
	for _, p := range posts {
		if p.err != nil {
			return p.err
		}
	}
	return nil
}

// post adds one half of a transfer on ch, which w counts, and matches it
// with the other half if that is already there. h.mu is held.
func (h *rendezvous) post(w *rvWait, ch rvChannel, buf []float32, send bool) *rvPost {
	q := h.queues[ch]
	if q == nil {
		q = &rvQueue{}
		h.queues[ch] = q
	}
	p := &rvPost{buf: buf, w: w}
	mine, theirs := &q.recvs, &q.sends
	if send {
		mine, theirs = &q.sends, &q.recvs
	}
	if len(*theirs) == 0 {
		*mine = append(*mine, p)
		return p
	}
	o := (*theirs)[0]
	*theirs = (*theirs)[1:]
	src, dst := p, o
	if !send {
		src, dst = o, p
	}
	if len(src.buf) != len(dst.buf) {
		err := fmt.Errorf("rendezvous: rank %d sends %d floats where rank %d receives %d", ch.from, len(src.buf), ch.to, len(dst.buf))
		src.err, dst.err = err, err
	} else {
		copy(dst.buf, src.buf)
	}
	h.complete(p)
	h.complete(o)
	return p
}

// complete marks p matched and wakes its rank when it was the last.
func (h *rendezvous) complete(p *rvPost) {
	p.done = true
	p.w.left--
	if p.w.left == 0 {
		if h.waiting[p.w.rank] == p.w {
			delete(h.waiting, p.w.rank)
		}
		close(p.w.wake)
	}
}

// checkDeadlock fails every waiting operation when all ranks wait.
func (h *rendezvous) checkDeadlock() {
	if len(h.waiting) < h.size {
		return
	}
	var who []string
	for r := range h.size {
		who = append(who, fmt.Sprintf("rank %d waits to %s", r, h.waiting[r].what))
	}
	h.failed = fmt.Errorf("rendezvous deadlock: %s", strings.Join(who, "; "))
	for r, w := range h.waiting {
		for _, p := range w.posts {
			if !p.done {
				p.err = h.failed
			}
		}
		delete(h.waiting, r)
		close(w.wake)
	}
}

// TestParityRendezvous runs every pipeline layout of the parity matrix with
// point-to-point transfers that wait for each other as NCCL's do: each
// schedule still runs to its end and gives the single process's losses.
func TestParityRendezvous(t *testing.T) {
	cases := slices.DeleteFunc(parityCases(), func(c parityCase) bool { return !strings.Contains(c.name, "pp") })
	cases = append(cases, parityCase{"pp4 interleaved vpp2", 4, []string{"Distributed.pp_degree=4", "Distributed.vpp_degree=2", "Model.num_layers=8", "Global.local_batch_size=8", "Global.micro_batch_size=1"}})
	if testing.Short() {
		keep := []string{"pp2 1f1b", "pp2 interleaved vpp2", "mp2 pp2"}
		cases = slices.DeleteFunc(cases, func(c parityCase) bool { return !slices.Contains(keep, c.name) })
	}
	singles := parityReference{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newRendezvous(tc.world)
			checkParity(t, tc, singles, rankOptions{fabric: func(_ int, w *comm.World) comm.Fabric { return h.fabric(w) }})
		})
	}
}

// TestRendezvousCatchesUnpaired: the planted defect of issuing a pipeline
// exchange's send and receive one after the other hangs 1F1B under
// NCCL's semantics, and the rendezvous says so, naming each rank's
// operation, within seconds.
func TestRendezvousCatchesUnpaired(t *testing.T) {
	h := newRendezvous(2)
	o := append(parityOverrides(t), "Distributed.pp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=2")
	start := time.Now()
	errs := startRanks(t, 2, o, rankOptions{
		fabric: func(_ int, w *comm.World) comm.Fabric { return h.fabric(w) },
		edit:   func(tr *Trainer) { tr.pp.split = true },
	}).errs
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "rendezvous deadlock") || !strings.Contains(err.Error(), "rank 0 waits to send") || !strings.Contains(err.Error(), "rank 1 waits to send") {
			t.Errorf("rank %d: %v, want a rendezvous deadlock naming both ranks' sends", r, err)
		}
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the deadlock took %v to show", d)
	}
	t.Logf("rank 0: %v", errs[0])
}
