package comm

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// Progress is a snapshot of a World's operations, for telling a slow or
// stuck rank from the ranks that wait for it: compare the snapshots of all
// ranks (each publishes its own).
type Progress struct {
	// Done counts the operations this rank has completed, in all groups.
	Done int64
	// InFlight lists the operations running now, one per group at most,
	// the longest-running first.
	InFlight []OpStatus
	// Last is the operation this rank completed last (zero before the
	// first); its Since is when it started.
	Last OpStatus
	// Busy is the time this rank's operations have run, in all groups,
	// waiting for their peers included: a rank that others wait for spends
	// less of its step in them.
	Busy time.Duration
}

// OpStatus is an operation in flight.
type OpStatus struct {
	Group string    // the group's name (World.NamedGroup), else its ranks, such as "[0 1 2 3]"
	Op    string    // "AllReduce", "Send", ...
	Seq   int64     // the operation's number in its group, from 1: the same on every member
	Since time.Time // when it started running on this rank
}

// String formats s as "AllReduce #12 (dp)".
func (s OpStatus) String() string { return fmt.Sprintf("%s #%d (%s)", s.Op, s.Seq, s.Group) }

// progress is a World's bookkeeping of operations.
type progress struct {
	mu       sync.Mutex
	done     int64
	busy     time.Duration
	last     OpStatus
	inFlight map[*Group]OpStatus
}

// start records that g began its operation number seq.
func (p *progress) start(g *Group, op string, seq int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inFlight == nil {
		p.inFlight = make(map[*Group]OpStatus)
	}
	p.inFlight[g] = OpStatus{Group: g.name, Op: op, Seq: seq, Since: time.Now()}
}

// finish records that g's operation in flight ended.
func (p *progress) finish(g *Group) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.inFlight[g]; ok {
		p.busy += time.Since(s.Since)
		p.last = s
	}
	delete(p.inFlight, g)
	p.done++
}

// Progress returns a snapshot of the World's operations. It is safe to
// call at any time from any goroutine, also after the World has ended.
func (w *World) Progress() Progress {
	p := &w.progress
	p.mu.Lock()
	defer p.mu.Unlock()
	out := Progress{Done: p.done, Last: p.last, Busy: p.busy}
	for _, s := range p.inFlight {
		out.InFlight = append(out.InFlight, s)
	}
	slices.SortFunc(out.InFlight, func(a, b OpStatus) int { return a.Since.Compare(b.Since) })
	return out
}
