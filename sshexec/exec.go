package sshexec

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
)

// ErrSessionClosed is the error Session.Wait returns after Close killed the
// command.
var ErrSessionClosed = errors.New("session closed")

const (
	// killTimeout bounds the extra session that kills or signals a
	// command's process group.
	killTimeout = time.Second
	// pgidMarker starts the line the command wrapper prints on standard
	// error: pgidMarker, the process group id, ':', a per-command nonce.
	pgidMarker = "gptui-sshexec-pgid="
	// maxPreamble bounds the standard error read while looking for the
	// marker line (shell startup files may print before it).
	maxPreamble = 64 << 10
)

// How remote commands are stopped.
//
// sshd starts each command in a new session (setsid), so the login shell
// leads a process group holding everything the command starts, unless a
// program moves itself elsewhere (setsid, job control). A command is sent
// to the login shell as
//
//	printf 'gptui-sshexec-pgid=%s:NONCE\n' "$$" >&2
//	CMD
//
// and the marker line is taken out of standard error. Killing or
// signalling the command runs `kill -s SIG -- -PGID` in a second session.
// SSH's own "signal" request is not enough: it reaches only the shell, and
// OpenSSH ignores it for root logins (it requires privilege separation,
// which sshd skips for root). It is still sent where the process group is
// unknown: a login shell that is not POSIX-like, or a forced command.

// Run runs cmd on the node through the user's login shell (which must be
// POSIX-like: sh, bash, dash, zsh), copying its standard output and error
// to stdout and stderr (either may be nil to discard; they may be the same
// writer). It returns when the command has exited and its output has been
// copied. While all of the Client's sessions are busy (see
// ClientConfig.MaxSessions), Run waits for one until ctx ends.
//
// A command that exits, with any status, yields its exit status and a nil
// error. err is non-nil when the command could not be started, was killed
// by a signal (exitCode is then 128 plus the signal number, as a shell
// reports it), the connection was lost, or ctx ended; exitCode is -1 in the
// last cases.
//
// When ctx ends Run kills the command's whole process group on the node
// (SIGKILL, through a second session that may take up to a second), closes
// the session and returns, without waiting for the command's output.
// Nothing is written to stdout or stderr after Run returns.
func (c *Client) Run(ctx context.Context, cmd string, stdout, stderr io.Writer) (exitCode int, err error) {
	return c.RunInput(ctx, cmd, nil, stdout, stderr)
}

// RunInput is Run with stdin copied to the command's standard input,
// which then ends (EOF); a nil stdin is Run's, an empty one. RunInput
// returns once the copy has ended too: a copy the node stops taking fails,
// and unless the command exited with a non-zero status RunInput returns
// that error. stdin is for input the command reads to its end.
func (c *Client) RunInput(ctx context.Context, cmd string, stdin io.Reader, stdout, stderr io.Writer) (exitCode int, err error) {
	if err := ctx.Err(); err != nil {
		return -1, fmt.Errorf("run %q on %s: %w", cmd, c.addr, err)
	}
	out := newGatedWriter(stdout)
	errw := out
	if stderr != stdout {
		errw = newGatedWriter(stderr)
	}
	// Stop copying before returning, so that the caller owns its writers
	// again even if the node never answers the close.
	defer errw.close()
	defer out.close()

	s, release, err := c.openSession(ctx, c.slots)
	if err != nil {
		return -1, fmt.Errorf("run %q: %w", cmd, err)
	}
	defer release()
	defer s.Close()
	s.Stdin, s.Stdout = stdin, out
	rawStderr, err := s.StderrPipe()
	if err != nil {
		return -1, fmt.Errorf("run %q on %s: %w", cmd, c.addr, err)
	}
	p := newProc(c, s, release, cmd)
	if err := p.start(rawStderr, errw); err != nil {
		return -1, err
	}
	select {
	case <-p.exited:
		return p.exitCode, p.exitErr
	case <-ctx.Done():
		p.kill()
		return -1, fmt.Errorf("run %q on %s: %w", cmd, c.addr, ctx.Err())
	}
}

// proc is a remote command started by Run or Start.
type proc struct {
	c       *Client
	s       *ssh.Session
	release func() // returns the session's slot
	cmd     string
	nonce   string

	ready  chan struct{} // closed once the marker was looked for
	pgid   int           // the process group; 0 if unknown (valid after ready)
	stderr io.Reader     // standard error less the marker (valid after ready)

	exited   chan struct{} // closed when exitCode and exitErr are set
	exitCode int
	exitErr  error
}

func newProc(c *Client, s *ssh.Session, release func(), cmd string) *proc {
	return &proc{
		c:       c,
		s:       s,
		release: release,
		cmd:     cmd,
		nonce:   randomSuffix(),
		ready:   make(chan struct{}),
		exited:  make(chan struct{}),
	}
}

// start starts the command wrapped to report its process group.
// rawStderr is the session's standard error pipe. When stderr is not nil,
// standard error less the marker line is copied to it, and the command
// counts as exited only once that copy is done; otherwise p.stderr is left
// for the caller to read.
func (p *proc) start(rawStderr io.Reader, stderr io.Writer) error {
	s := p.s
	wrapped := "printf '" + pgidMarker + "%s:" + p.nonce + "\\n' \"$$\" >&2\n" + p.cmd
	if err := s.Start(wrapped); err != nil {
		s.Close()
		p.release()
		return fmt.Errorf("start %q on %s: %w", p.cmd, p.c.addr, err)
	}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		p.pgid, p.stderr = readMarker(rawStderr, p.nonce)
		close(p.ready)
		if stderr != nil {
			_, _ = io.Copy(stderr, p.stderr)
		}
	}()
	go func() {
		err := s.Wait()
		if stderr != nil {
			<-copied
		}
		p.exitCode, p.exitErr = p.c.exitResult(p.cmd, err)
		close(p.exited)
		// The server has closed the channel: its session is free.
		p.s.Close()
		p.release()
	}()
	return nil
}

// readMarker reads r up to and including the marker line with nonce and
// returns the process group id it names, and a reader of r's content less
// that line. If r ends, or maxPreamble bytes pass, without the marker, the
// id is 0.
func readMarker(r io.Reader, nonce string) (pgid int, rest io.Reader) {
	br := bufio.NewReaderSize(r, 4096)
	var before bytes.Buffer
	suffix := ":" + nonce + "\n"
	for before.Len() < maxPreamble {
		line, err := br.ReadSlice('\n')
		if err == nil && bytes.HasPrefix(line, []byte(pgidMarker)) && bytes.HasSuffix(line, []byte(suffix)) {
			id := line[len(pgidMarker) : len(line)-len(suffix)]
			if n, err := strconv.Atoi(string(id)); err == nil && n > 1 {
				pgid = n
				break
			}
		}
		before.Write(line)
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			break
		}
	}
	return pgid, io.MultiReader(&before, br)
}

// signal sends sig to the command's process group, waiting at most until
// ctx ends for the group to be known; without it, the signal goes to the
// login shell by SSH's signal request.
func (p *proc) signal(ctx context.Context, sig ssh.Signal) error {
	if !validSignal(sig) {
		return fmt.Errorf("invalid signal name %q", sig)
	}
	select {
	case <-p.ready:
	case <-p.exited:
		return nil
	case <-ctx.Done():
	}
	select {
	case <-p.exited:
		return nil // nothing to signal (and the group id may be reused)
	default:
	}
	pgid := 0
	select {
	case <-p.ready:
		pgid = p.pgid
	default:
	}
	if pgid == 0 {
		return p.s.Signal(sig)
	}
	s, release, err := p.c.openSession(ctx, p.c.control)
	if err != nil {
		_ = p.s.Signal(sig)
		return err
	}
	defer release()
	defer s.Close()
	var out bytes.Buffer
	w := newGatedWriter(&out) // serializes the two copiers
	s.Stdout, s.Stderr = w, w
	done := make(chan error, 1)
	go func() { done <- s.Run(fmt.Sprintf("kill -s %s -- -%d", sig, pgid)) }()
	select {
	case err := <-done:
		if err != nil {
			w.close()
			return fmt.Errorf("kill -s %s -- -%d: %w: %s", sig, pgid, err, strings.TrimSpace(out.String()))
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("kill -s %s -- -%d: %w", sig, pgid, ctx.Err())
	}
}

// kill kills the command's process group, giving up after killTimeout,
// and closes the session.
func (p *proc) kill() {
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	_ = p.signal(ctx, ssh.SIGKILL)
	_ = p.s.Close()
	p.release()
}

// validSignal reports whether sig is a plausible signal name (such as
// "TERM"), safe to put in a command line.
func validSignal(sig ssh.Signal) bool {
	if sig == "" {
		return false
	}
	for _, r := range sig {
		if (r < 'A' || r > 'Z') && (r < '0' || r > '9') {
			return false
		}
	}
	return true
}

// exitResult turns what ssh.Session.Wait returned into Run's results.
func (c *Client) exitResult(cmd string, err error) (int, error) {
	var exitErr *ssh.ExitError
	var missing *ssh.ExitMissingError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exitErr) && exitErr.Signal() != "":
		return exitErr.ExitStatus(), fmt.Errorf("%q on %s killed by signal %s", cmd, c.addr, exitErr.Signal())
	case errors.As(err, &exitErr):
		return exitErr.ExitStatus(), nil
	case errors.As(err, &missing), errors.Is(err, io.EOF):
		return -1, fmt.Errorf("%q on %s: no exit status (connection lost?): %w", cmd, c.addr, err)
	}
	return -1, fmt.Errorf("run %q on %s: %w", cmd, c.addr, err)
}

// Session is a command running on a node, started by Client.Start.
//
// Stdout and Stderr must both be read, concurrently, until EOF, or the
// command stalls once the SSH flow-control window (a few megabytes) fills.
type Session struct {
	// Stdin is the command's standard input. Closing it sends EOF, which
	// a worker can take as the signal to exit.
	Stdin io.WriteCloser
	// Stdout is the command's standard output.
	Stdout io.Reader
	// Stderr is the command's standard error.
	Stderr io.Reader

	p    *proc
	stop func() bool // stops the ctx watch

	killOnce sync.Once
	killed   chan struct{} // closed when Close or ctx killed the command
	killErr  error
}

// Start starts cmd on the node through the login shell and returns without
// waiting for it. The command holds one of the Client's sessions until it
// exits or is closed; Start waits for a free one as Run does. The command's process group is killed (SIGKILL) when ctx
// ends or Close is called; see Run.
func (c *Client) Start(ctx context.Context, cmd string) (*Session, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("start %q on %s: %w", cmd, c.addr, err)
	}
	s, release, err := c.openSession(ctx, c.slots)
	if err != nil {
		return nil, fmt.Errorf("start %q: %w", cmd, err)
	}
	p := newProc(c, s, release, cmd)
	sess := &Session{p: p, killed: make(chan struct{})}
	var rawStderr io.Reader
	if sess.Stdin, err = s.StdinPipe(); err == nil {
		if sess.Stdout, err = s.StdoutPipe(); err == nil {
			rawStderr, err = s.StderrPipe()
		}
	}
	if err != nil {
		s.Close()
		release()
		return nil, fmt.Errorf("start %q on %s: %w", cmd, c.addr, err)
	}
	if err := p.start(rawStderr, nil); err != nil {
		return nil, err
	}
	sess.Stderr = readyReader{p}
	sess.stop = context.AfterFunc(ctx, func() {
		sess.kill(fmt.Errorf("%q on %s: %w", cmd, c.addr, ctx.Err()))
	})
	return sess, nil
}

// readyReader reads a proc's standard error once the marker is out of it.
type readyReader struct{ p *proc }

func (r readyReader) Read(b []byte) (int, error) {
	<-r.p.ready
	return r.p.stderr.Read(b)
}

// Wait waits for the command to exit and returns as Run does. If Close or
// the end of Start's context killed the command first, Wait returns -1 and
// an error (ErrSessionClosed, or one wrapping the context's error) without
// waiting for the node.
func (s *Session) Wait() (exitCode int, err error) {
	select {
	case <-s.p.exited:
	case <-s.killed:
	}
	select {
	case <-s.killed:
		if s.killErr != nil {
			return -1, s.killErr
		}
	default:
	}
	s.stop()
	return s.p.exitCode, s.p.exitErr
}

// Signal sends sig (for example ssh.SIGTERM, to ask a worker to shut down
// cleanly) to the command's process group, through a second session.
func (s *Session) Signal(sig ssh.Signal) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.p.c.connectTimeout)
	defer cancel()
	if err := s.p.signal(ctx, sig); err != nil {
		return fmt.Errorf("signal %s to %q on %s: %w", sig, s.p.cmd, s.p.c.addr, err)
	}
	return nil
}

// Close kills the command's process group unless the command has already
// exited, and releases the session. It is safe to call more than once and
// concurrently with Wait.
func (s *Session) Close() error {
	s.kill(fmt.Errorf("%q on %s: %w", s.p.cmd, s.p.c.addr, ErrSessionClosed))
	s.stop()
	return nil
}

func (s *Session) kill(cause error) {
	s.killOnce.Do(func() {
		select {
		case <-s.p.exited:
		default:
			s.killErr = cause
			close(s.killed)
			s.p.kill()
			return
		}
		close(s.killed)
	})
}

// gatedWriter passes writes to w until closed, then drops them; the mutex
// also serializes the stdout and stderr copiers when they share a writer.
type gatedWriter struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func newGatedWriter(w io.Writer) *gatedWriter { return &gatedWriter{w: w} }

func (g *gatedWriter) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || g.w == nil {
		return len(p), nil
	}
	return g.w.Write(p)
}

func (g *gatedWriter) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// ForEach calls fn(ctx, i) for i in [0, n), at most parallel calls at a time
// (parallel < 1 means no limit), and returns when all calls have returned.
// The result has one entry per index: fn's error, or ctx's error for an
// index that was not started because ctx ended. errors.Join(errs...) is nil
// when every call succeeded.
func ForEach(ctx context.Context, n, parallel int, fn func(ctx context.Context, i int) error) []error {
	errs := make([]error, n)
	if parallel < 1 || parallel > n {
		parallel = n
	}
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if err := ctx.Err(); err != nil {
			for j := i; j < n; j++ {
				errs[j] = err
			}
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = fn(ctx, i)
		}()
	}
	wg.Wait()
	return errs
}
