package comm

import (
	"fmt"
	"net"
	"sync"
	"time"
)

// refusalEvery is how often a listener reports the connections it refused:
// a refusal after a quiet interval is one line with its address and
// reason; those that follow within refusalEvery of that line are counted
// and reported together, one line per interval (and one when the listener
// closes), so that a flood of connections costs a few lines, not one each.
const refusalEvery = 10 * time.Second

// refusals reports the peers a listener refused through logf (which may be
// nil), as refusalEvery says. Its methods may be called concurrently.
type refusals struct {
	logf  func(format string, args ...any)
	who   string // "comm: master" or "comm: rank 3", starting each line
	what  string // "connection" or "mesh connection"
	every time.Duration

	mu      sync.Mutex
	written time.Time // when the last line was written; zero: none yet
	n       int       // refused since that line, not yet reported
	from    map[string]bool
	last    string // the newest of them: "ADDR: why"
	timer   *time.Timer
	closed  bool
}

func newRefusals(logf func(string, ...any), who, what string) *refusals {
	return &refusals{logf: logf, who: who, what: what, every: refusalEvery, from: map[string]bool{}}
}

// add reports a refused connection from addr, refused because of err.
func (r *refusals) add(addr net.Addr, err error) {
	if r.logf == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	now := time.Now()
	if r.n == 0 && (r.written.IsZero() || now.Sub(r.written) >= r.every) {
		r.written = now
		r.logf("%s: refused a %s from %s: %v", r.who, r.what, addr, err)
		return
	}
	r.n++
	host, _, splitErr := net.SplitHostPort(addr.String())
	if splitErr != nil {
		host = addr.String()
	}
	r.from[host] = true
	r.last = fmt.Sprintf("%s: %v", addr, err)
	if r.timer == nil {
		r.timer = time.AfterFunc(r.written.Add(r.every).Sub(now), r.tick)
	}
}

// tick reports the refusals counted since the last line.
func (r *refusals) tick() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.timer = nil
	if !r.closed {
		r.flush()
	}
}

// flush writes the line of the refusals counted; r.mu is held.
func (r *refusals) flush() {
	if r.n == 0 {
		return
	}
	hosts := "1 address"
	if len(r.from) != 1 {
		hosts = fmt.Sprintf("%d addresses", len(r.from))
	}
	s := "s"
	if r.n == 1 {
		s = ""
	}
	r.logf("%s: refused %d more %s%s from %s in %.0f s (the last from %s)", r.who, r.n, r.what, s, hosts, time.Since(r.written).Seconds(), r.last)
	r.written, r.n = time.Now(), 0
	clear(r.from)
}

// close reports what is left; later refusals are not reported.
func (r *refusals) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	if r.logf != nil {
		r.flush()
	}
}
