package cluster

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/gptui/gptui/internal/ctxio"
)

// Relayed distribution. The files that every SSH node gets from this
// machine (the gptui executable, and the data files staged there) spread
// as a tree: this machine pushes a file to one node itself, and every node
// that holds a verified copy (SHA-256 equal to this machine's) then
// serves it to the next ones, relayPeers at a time, so that the number of
// copies about doubles each round and this machine's link carries each
// file about once, however many nodes there are.
//
// The coordination is this machine's: a distributor, which the parallel
// setUp goroutines ask for a source (acquire). A node becomes a source
// once its copy is verified (or found there already, same SHA-256). The
// source is the holder serving the fewest nodes, fewer than relayPeers;
// while every holder is busy, the node waits for one. This machine is a
// source only for a file's first copy (while no node holds one and this
// machine is not already pushing it) and as the fallback: a node whose
// relays failed relayTries times, or whose sources all failed it, or that
// cannot fetch at all (no bash, no /dev/tcp in it, no sha256sum), gets a
// direct push (sshexec's Push) — a relay's fault never fails the job. A
// source that failed relaySourceFailures transfers, or whose server
// ended, serves no more. After relayGiveUp failed relays and not one that
// worked, the job pushes everything else directly. Files under
// relayMinBytes (the config, a tokenizer) always go directly: a relay
// costs more round trips than their bytes. A data path a node already
// has is not staged there, and so that node is no source of it (its
// files would have to be hashed first).
//
// Nodes have no SSH credentials for each other; a relay is plain TCP,
// authenticated by a token. This machine starts `gptui agent
// --serve-files` on the source over its SSH connection (one per node, for
// all the files it serves; see package agent's ServeFiles for the
// protocol), which prints the port it listens on; for each transfer it
// makes a 256-bit random token, grants it to the source on that
// session's standard input (with the file's path), waits for the source
// to say the grant is in force, and only then gives the token to the
// destination on the standard input of the fetch: relayFetchScript, run
// by bash (`/dev/tcp`), so that a node without gptui yet can fetch gptui
// itself. The fetch connects to the source at the address this machine
// reaches the source at (as MASTER_ADDR is chosen), presents the token,
// reads the bytes into a temporary file next to the target, checks its
// SHA-256 against this machine's, and renames it into place. Every
// transfer is timed out: by relayStall without a sign of life from the
// source (ServeFiles reports each transfer's progress every second), by
// relayTimeout(size) in all, and at once when the source's server ends.

// Bounds of the relays.
const (
	// relayPeers is how many nodes a node serves at once.
	relayPeers = 2
	// relayTries is how many relays a node tries before this machine
	// pushes the file to it.
	relayTries = 2
	// relaySourceFailures is how many transfers a source may fail before
	// it serves no more.
	relaySourceFailures = 2
	// relayGiveUp is how many relays may fail, none working, before the
	// rest of the job's pushes go directly.
	relayGiveUp = 4
	// relayMinBytes is the smallest file relayed; smaller ones go
	// directly.
	relayMinBytes = 1 << 20
	// relayStall ends a transfer whose source has not reported progress
	// for so long (from the grant: the destination has that long to
	// connect).
	relayStall = 15 * time.Second
	// relayReady bounds the start of a source's server (its port line).
	relayReady = 15 * time.Second
)

// relayTimeout bounds one relayed transfer of size bytes: a minute, and a
// second per MiB (1 MiB/s; relayStall catches a stalled one sooner).
func relayTimeout(size int64) time.Duration {
	return time.Minute + time.Duration(size>>20)*time.Second
}

// testRelayHook, when set by a test, is called at a relay's source's
// reports "sending" and "progress" with the report's first word, the
// source's and destination's names and a function that kills the
// source's server.
var testRelayHook func(stage, src, dst string, kill func())

// distributor spreads the files of one Plan over its SSH nodes (see the
// comment at the top of this file).
type distributor struct {
	relay bool // relaying is on (Options.NoRelay is not set and the executable is one)
	// ctx bounds the sources' servers; cancel, by close, stops them.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	files   map[string]*spread // by local path
	servers map[*node]*relayServer
	failed  int // relays failed, over all files
	relayed int // relays that worked
	nextID  int
	closed  bool
}

// spread is one local file's distribution.
type spread struct {
	local string
	once  sync.Once
	sum   string // hex SHA-256
	size  int64
	err   error

	// The fields below are the distributor's, under its mu.
	holders []*holder
	// direct is how many pushes this machine is making.
	direct int
	// changed is closed and replaced at every change of holders or direct.
	changed chan struct{}
}

// holder is a node that holds a verified copy of a file.
type holder struct {
	n        *node
	remote   string // the file on n, as Push takes it
	active   int    // transfers it serves now
	failures int    // transfers it failed
	dead     bool   // it serves no more
}

// newDistributor returns the distributor of a Plan; relay turns the
// relays on. ctx bounds the sources' servers, which close stops.
func newDistributor(ctx context.Context, relay bool) *distributor {
	d := &distributor{relay: relay, files: map[string]*spread{}, servers: map[*node]*relayServer{}}
	d.ctx, d.cancel = context.WithCancel(ctx)
	return d
}

// close stops the sources' servers: their standard input closed (they
// exit), and killed where they have not within a second.
func (d *distributor) close() {
	if d == nil {
		return
	}
	d.mu.Lock()
	d.closed = true
	var servers []*relayServer
	for _, s := range d.servers {
		servers = append(servers, s)
	}
	d.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.stop()
		}()
	}
	wg.Wait()
	d.cancel()
}

// spreadOf returns the distribution of the local file, hashing it the
// first time.
func (d *distributor) spreadOf(ctx context.Context, local string) (*spread, error) {
	d.mu.Lock()
	sp := d.files[local]
	if sp == nil {
		sp = &spread{local: local, changed: make(chan struct{})}
		d.files[local] = sp
	}
	d.mu.Unlock()
	sp.once.Do(func() {
		f, err := os.Open(local)
		if err != nil {
			sp.err = err
			return
		}
		defer f.Close()
		h := sha256.New()
		sp.size, sp.err = io.Copy(h, ctxio.Reader(ctx, f))
		sp.sum = hex.EncodeToString(h.Sum(nil))
	})
	if sp.err != nil {
		// A failed hash (an interrupted one) is tried again by the next.
		d.mu.Lock()
		if d.files[local] == sp {
			delete(d.files, local)
		}
		d.mu.Unlock()
		return nil, fmt.Errorf("hash %s: %w", local, sp.err)
	}
	return sp, nil
}

// changedLocked wakes the goroutines waiting on sp; d.mu is held.
func (sp *spread) changedLocked() {
	close(sp.changed)
	sp.changed = make(chan struct{})
}

// add makes n, which holds a verified copy of sp's file at remote, a
// source of it.
func (d *distributor) add(sp *spread, n *node, remote string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	sp.holders = append(sp.holders, &holder{n: n, remote: remote})
	sp.changedLocked()
}

// relaying reports whether relays are still tried; d.mu is held.
func (d *distributor) relayingLocked() bool {
	return d.relay && !d.closed && (d.relayed > 0 || d.failed < relayGiveUp)
}

// acquire returns the source of sp's file for a node that has tried the
// holders tried (failed): a holder, or nil for this machine; either way
// with a transfer counted against it until release. direct asks for this
// machine at once. It waits while every holder serves relayPeers nodes,
// or while no node holds the file and this machine is pushing it to one
// (the first copy, or a node's whose relays failed).
func (d *distributor) acquire(ctx context.Context, sp *spread, tried map[*holder]bool, direct bool) (h *holder, err error) {
	for {
		d.mu.Lock()
		if direct || !d.relayingLocked() || len(tried) >= relayTries {
			sp.direct++
			d.mu.Unlock()
			return nil, nil
		}
		live := 0
		for _, c := range sp.holders {
			if c.dead || tried[c] || d.serverDownLocked(c.n) {
				continue
			}
			live++
			if c.active < relayPeers && (h == nil || c.active < h.active) {
				h = c
			}
		}
		switch {
		case h != nil:
			h.active++
			d.mu.Unlock()
			return h, nil
		case live == 0 && (len(tried) > 0 || sp.direct == 0):
			// Its sources failed it and no other node holds the file, or
			// this is the first copy.
			sp.direct++
			d.mu.Unlock()
			return nil, nil
		}
		wait := sp.changed
		d.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// release ends a transfer acquire gave: from h (nil: this machine),
// which failed with err (nil: it worked).
func (d *distributor) release(sp *spread, h *holder, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if h == nil {
		sp.direct--
	} else {
		h.active--
		var re *relayError
		switch {
		case err == nil:
			d.relayed++
		case errors.As(err, &re) && re.source:
			d.failed++
			if h.failures++; h.failures >= relaySourceFailures {
				h.dead = true
			}
		case errors.As(err, &re) && re.destination:
			// Not the relay's fault: the destination cannot fetch.
		default:
			d.failed++
		}
	}
	sp.changedLocked()
}

// serverDownLocked reports whether n's server failed or ended; d.mu is
// held.
func (d *distributor) serverDownLocked(n *node) bool {
	s := d.servers[n]
	if s == nil {
		return false
	}
	select {
	case <-s.down:
		return true
	default:
		return false
	}
}

// push puts the local file on the SSH node n at remote (as Push takes
// it) with mode, relayed from a node that holds it where one can, and
// returns what happened, with notes on the relays that failed. have is
// the hex SHA-256 of the file n holds at remote, as n said in its answer
// to an earlier command (hello, which says it of an executable file
// only); "" when not known. A file with the local file's sum is left as it
// is, its mode included, and costs no session.
func (d *distributor) push(ctx context.Context, n *node, local, remote string, mode os.FileMode, have string) (Push, []string, error) {
	start := time.Now()
	ps := Push{File: remote, From: local}
	direct := func() (Push, error) {
		skipped, err := n.client.Push(ctx, local, remote, mode)
		ps.Skipped, ps.Took = skipped, time.Since(start)
		return ps, err
	}
	if fi, err := os.Stat(local); err == nil {
		ps.Bytes = fi.Size()
	}
	if have != "" {
		sp, err := d.spreadOf(ctx, local)
		if err != nil {
			return ps, nil, err
		}
		if sp.sum == have {
			d.add(sp, n, remote)
			ps.Bytes, ps.Skipped, ps.Took = sp.size, true, time.Since(start)
			return ps, nil, nil
		}
	}
	d.mu.Lock()
	relaying := d.relayingLocked()
	d.mu.Unlock()
	if !relaying || ps.Bytes < relayMinBytes {
		ps, err := direct()
		return ps, nil, err
	}
	sp, err := d.spreadOf(ctx, local)
	if err != nil {
		return ps, nil, err
	}
	ps.Bytes = sp.size
	same, err := n.sameFile(ctx, remote, sp.sum, mode)
	var notes []string
	switch {
	case errors.Is(err, errCannotFetch):
		// No sha256sum there: Push reads the file back instead.
		notes = append(notes, "not relayed: "+err.Error())
		ps, err := direct()
		return ps, notes, err
	case err != nil:
		return ps, nil, err
	case same:
		d.add(sp, n, remote)
		ps.Skipped, ps.Took = true, time.Since(start)
		return ps, nil, nil
	}
	tried := map[*holder]bool{}
	cannot := false
	for {
		h, err := d.acquire(ctx, sp, tried, cannot)
		if err != nil {
			return ps, notes, err
		}
		// The node is a holder before the transfer is released: a node
		// waiting in acquire must not find no holder and no push under
		// way and push this machine's copy again.
		if h == nil {
			ps, err := direct()
			if err == nil {
				d.add(sp, n, remote)
			}
			d.release(sp, nil, err)
			return ps, notes, err
		}
		err = d.relay1(ctx, sp, h, n, remote, mode)
		if err == nil {
			d.add(sp, n, remote)
		}
		d.release(sp, h, err)
		if err == nil {
			ps.Via, ps.Took = h.n.name, time.Since(start)
			return ps, notes, nil
		}
		if ctx.Err() != nil {
			return ps, notes, err
		}
		notes = append(notes, fmt.Sprintf("the relay from %s failed: %v", h.n.name, err))
		tried[h] = true
		var re *relayError
		cannot = errors.As(err, &re) && re.destination
	}
}

// relayError is a failed relay: source says it was the source's fault (it
// failed, died, stalled, sent a wrong copy, could not be reached),
// destination that the destination cannot fetch (no bash, /dev/tcp or
// sha256sum there, or it could not write the file).
type relayError struct {
	source, destination bool
	err                 error
}

func (e *relayError) Error() string { return e.err.Error() }
func (e *relayError) Unwrap() error { return e.err }

// errCannotFetch says that a node cannot fetch a relayed file.
var errCannotFetch = errors.New("the node cannot fetch relayed files")

// relay1 copies sp's file from the holder h to node n at remote with mode:
// h's server is granted a token, which n's fetch presents.
func (d *distributor) relay1(ctx context.Context, sp *spread, h *holder, n *node, remote string, mode os.FileMode) error {
	srv, err := d.server(ctx, h.n)
	if err != nil {
		return &relayError{source: true, err: err}
	}
	tok := newToken()
	d.mu.Lock()
	d.nextID++
	id := fmt.Sprint(d.nextID)
	d.mu.Unlock()
	lines := srv.watch(id)
	defer srv.unwatch(id)
	if err := srv.grant(id, tok, loginPath(h.remote)); err != nil {
		return &relayError{source: true, err: err}
	}
	// The destination gets the token once the grant is in force: one
	// that connected sooner would be refused.
	if err := awaitGrant(ctx, srv, lines, id, relayStall); err != nil {
		return err
	}

	ctx, cancel := context.WithTimeoutCause(ctx, relayTimeout(sp.size), fmt.Errorf("the transfer took over %v", relayTimeout(sp.size)))
	defer cancel()
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	// The watchdog: the source's reports of this transfer.
	var srcErr error
	var watched sync.WaitGroup
	watched.Add(1)
	go func() {
		defer watched.Done()
		stall := time.NewTimer(relayStall)
		defer stall.Stop()
		for {
			select {
			case l := <-lines:
				f := strings.SplitN(l, " ", 3)
				switch f[0] {
				case "sending", "progress":
					if testRelayHook != nil {
						testRelayHook(f[0], h.n.name, n.name, func() { srv.sess.Close() })
					}
				case "failed":
					srcErr = fmt.Errorf("%s failed to send it: %s", h.n.name, f[len(f)-1])
					fail(srcErr)
					return
				case "sent":
					// The rest is the destination's: its own check.
					stall.Stop()
					continue
				}
				stall.Reset(relayStall)
			case <-stall.C:
				srcErr = fmt.Errorf("no progress from %s for %v", h.n.name, relayStall)
				fail(srcErr)
				return
			case <-srv.down:
				srcErr = fmt.Errorf("the server on %s ended: %v", h.n.name, srv.err())
				fail(srcErr)
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	code, msg, err := n.fetch(ctx, srv.host, srv.port, tok, sp.sum, remote, mode)
	fail(nil)
	watched.Wait()
	switch {
	case err == nil && code == 0:
		return nil
	case srcErr != nil:
		return &relayError{source: true, err: srcErr}
	case err != nil:
		return fmt.Errorf("fetch on %s: %w", n.name, context.Cause(ctx))
	}
	return fetchError(code, msg, n.name, h.n.name)
}

// awaitGrant waits for srv's "granted id" on lines, its reports of
// transfer id: for at most within (relayStall), and not past the
// server's end.
func awaitGrant(ctx context.Context, srv *relayServer, lines <-chan string, id string, within time.Duration) error {
	stall := time.NewTimer(within)
	defer stall.Stop()
	for {
		select {
		case l := <-lines:
			if l == "granted "+id {
				return nil
			}
		case <-stall.C:
			return &relayError{source: true, err: fmt.Errorf("%s did not take the grant within %v", srv.n.name, within)}
		case <-srv.down:
			return &relayError{source: true, err: fmt.Errorf("the server on %s ended: %v", srv.n.name, srv.err())}
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// fetchError is the error of relayFetchScript's exit status code, with
// msg its standard error; nil for 0.
func fetchError(code int, msg, dst, src string) error {
	if code == 0 {
		return nil
	}
	err := fmt.Errorf("fetch on %s: exit status %d: %s", dst, code, msg)
	switch code {
	case 70, 71, 72, 74, 76, 77, 126, 127:
		// No sha256sum, /dev/tcp or bash; no token read; the file not
		// written: the destination's part.
		return &relayError{destination: true, err: err}
	case 73, 75:
		// The source not reached, or a wrong copy from it.
		return &relayError{source: true, err: fmt.Errorf("%w (from %s)", err, src)}
	}
	return err
}

// loginPath is the remote path p as a command in the login directory
// takes it: "~/x" is "x" (quoted, ~ is not expanded).
func loginPath(p string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		return rest
	}
	return p
}

// newToken returns 32 random bytes in hex.
func newToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// relayNotes is the notes of a push for its node event: "" for none.
func relayNotes(notes []string) string {
	if len(notes) == 0 {
		return ""
	}
	return " (" + strings.Join(notes, "; ") + ")"
}
