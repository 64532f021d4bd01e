package sshexec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

func TestRun(t *testing.T) {
	t.Parallel()
	for _, addr := range testAddrs {
		t.Run(addr, func(t *testing.T) {
			t.Parallel()
			srv, cfg := startNode(t, addr)
			c := dial(t, srv, cfg)
			for _, tc := range []struct {
				cmd              string
				stdout, stderr   string
				code             int
				wantErr          bool
				sameWriterOutput string // when non-empty, run again with one writer for both streams
			}{
				{cmd: "echo hello", stdout: "hello\n"},
				{cmd: "echo $SSH_CONNECTION | cut -d' ' -f3", stdout: addr + "\n"},
				{cmd: "echo oops >&2; exit 3", stderr: "oops\n", code: 3},
				{cmd: "printf 'a\\nb'; false", stdout: "a\nb", code: 1},
				{cmd: "kill -9 $$", code: 128 + 9, wantErr: true},
				{cmd: "echo out; sleep 0.05; echo err >&2", stdout: "out\n", stderr: "err\n", sameWriterOutput: "out\nerr\n"},
				{cmd: "head -c 3000000 /dev/zero | tr '\\0' x | wc -c", stdout: "3000000\n"},
			} {
				var stdout, stderr bytes.Buffer
				code, err := c.Run(context.Background(), tc.cmd, &stdout, &stderr)
				if code != tc.code || (err != nil) != tc.wantErr || stdout.String() != tc.stdout || stderr.String() != tc.stderr {
					t.Errorf("Run(%q) = %d, %v, stdout %q, stderr %q; want %d, error %v, %q, %q",
						tc.cmd, code, err, stdout.String(), stderr.String(), tc.code, tc.wantErr, tc.stdout, tc.stderr)
				}
				if tc.sameWriterOutput != "" {
					var both bytes.Buffer
					if _, err := c.Run(context.Background(), tc.cmd, &both, &both); err != nil || both.String() != tc.sameWriterOutput {
						t.Errorf("Run(%q) with one writer: %v, %q; want %q", tc.cmd, err, both.String(), tc.sameWriterOutput)
					}
				}
			}
			// Nil writers discard.
			if code, err := c.Run(context.Background(), "echo discarded; echo too >&2", nil, nil); code != 0 || err != nil {
				t.Errorf("Run with nil writers = %d, %v", code, err)
			}
		})
	}
}

// TestRunInput: the command reads RunInput's stdin to its end (EOF
// after it), and without stdin it reads nothing.
func TestRunInput(t *testing.T) {
	t.Parallel()
	srv, cfg := startNode(t, "127.0.0.2")
	c := dial(t, srv, cfg)
	in := strings.Repeat("a line of input\n", 1000)
	for _, tc := range []struct {
		stdin io.Reader
		want  string
	}{
		{strings.NewReader(in), fmt.Sprintf("%d\n", len(in))},
		{nil, "0\n"},
	} {
		var out strings.Builder
		code, err := c.RunInput(context.Background(), "wc -c", tc.stdin, &out, nil)
		if code != 0 || err != nil || strings.TrimLeft(out.String(), " ") != tc.want {
			t.Errorf("RunInput(wc -c) = %d, %v, printed %q; want %q", code, err, out.String(), tc.want)
		}
	}
}

// TestRunConcurrent runs more commands at once on one connection than
// sshd allows sessions (10 by default): the extra ones wait their turn.
func TestRunConcurrent(t *testing.T) {
	t.Parallel()
	srv, cfg := startNode(t, "127.0.0.2")
	c := dial(t, srv, cfg)
	const n = 24
	errs := ForEach(context.Background(), n, n, func(ctx context.Context, i int) error {
		var out strings.Builder
		code, err := c.Run(ctx, fmt.Sprintf("sleep 0.1; echo %d", i), &out, nil)
		if err != nil || code != 0 {
			return fmt.Errorf("Run %d = %d, %v", i, code, err)
		}
		if want := fmt.Sprintf("%d\n", i); out.String() != want {
			return fmt.Errorf("Run %d printed %q, want %q", i, out.String(), want)
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		t.Error(err)
	}
}

// processRunning reports whether a process with exactly these arguments
// exists. The test servers run on this machine, so their commands show up
// in the local /proc.
func processRunning(t *testing.T, args ...string) bool {
	t.Helper()
	want := strings.Join(args, "\x00") + "\x00"
	dirs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil || len(dirs) == 0 {
		t.Skip("no /proc to look for remote processes in")
	}
	for _, f := range dirs {
		if b, err := os.ReadFile(f); err == nil && string(b) == want {
			return true
		}
	}
	return false
}

// sleepArg returns a duration of about 100 s for sleep that no other test,
// nor another run of this one, uses, to identify the remote process by.
func sleepArg() string {
	return fmt.Sprintf("100.%09d", mrand.IntN(1e9))
}

// waitGone waits up to 2 s for the process to disappear.
func waitGone(t *testing.T, args ...string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for processRunning(t, args...) {
		if time.Now().After(deadline) {
			t.Errorf("remote process %q still running 2s after cancellation", strings.Join(args, " "))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRunCancel(t *testing.T) {
	t.Parallel()
	srv, cfg := startNode(t, "127.0.0.3")
	c := dial(t, srv, cfg)
	arg := sleepArg()
	for _, tc := range []struct {
		name   string
		cancel func(context.CancelFunc)
		want   error
	}{
		{"cancel", func(cancel context.CancelFunc) { time.AfterFunc(300*time.Millisecond, cancel) }, context.Canceled},
		{"deadline", nil, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			if tc.cancel != nil {
				ctx, cancel = context.WithCancel(context.Background())
				defer cancel()
				tc.cancel(cancel)
			}
			ended := make(chan time.Time, 1)
			go func() { <-ctx.Done(); ended <- time.Now() }()
			var stdout bytes.Buffer
			// The shell, a background child and a foreground child: the
			// whole process group must go.
			code, err := c.Run(ctx, "echo started; sleep "+arg+" & sleep "+arg+"; wait", &stdout, nil)
			d := time.Since(<-ended)
			t.Logf("Run returned %d, %v %v after the context ended", code, err, d)
			if !errors.Is(err, tc.want) || code != -1 {
				t.Errorf("Run = %d, %v; want -1, %v", code, err, tc.want)
			}
			if d > 2*time.Second {
				t.Errorf("Run returned %v after cancellation, want under 2s", d)
			}
			if out := stdout.String(); out != "started\n" && out != "" {
				t.Errorf("stdout %q, want what the command printed before the cancellation", out)
			}
			waitGone(t, "sleep", arg)
		})
	}
	// The connection is still usable.
	var out bytes.Buffer
	if code, err := c.Run(context.Background(), "echo alive", &out, nil); code != 0 || err != nil || out.String() != "alive\n" {
		t.Errorf("Run after cancellations = %d, %v, %q", code, err, out.String())
	}
	// An already-ended context starts nothing.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Run(ctx, "echo no", nil, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Run with a cancelled context: %v", err)
	}
}

// drain reads a session's output streams in the background.
func drain(s *Session) (stdout, stderr func() string) {
	var outB, errB bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _, _ = io.Copy(&outB, s.Stdout) }()
	go func() { defer wg.Done(); _, _ = io.Copy(&errB, s.Stderr) }()
	var once sync.Once
	wait := func() { once.Do(wg.Wait) }
	return func() string { wait(); return outB.String() }, func() string { wait(); return errB.String() }
}

// waitSession is s.Wait, failing the test instead of hanging.
func waitSession(t *testing.T, s *Session) (int, error) {
	t.Helper()
	type result struct {
		code int
		err  error
	}
	done := make(chan result, 1)
	go func() {
		code, err := s.Wait()
		done <- result{code, err}
	}()
	select {
	case r := <-done:
		return r.code, r.err
	case <-time.After(10 * time.Second):
		t.Fatal("Session.Wait still blocked after 10s")
	}
	return 0, nil
}

func TestStart(t *testing.T) {
	t.Parallel()
	srv, cfg := startNode(t, "127.0.0.2")
	c := dial(t, srv, cfg)

	t.Run("stdin stdout stderr exit", func(t *testing.T) {
		s, err := c.Start(context.Background(), "cat; echo done >&2; exit 5")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		stdout, stderr := drain(s)
		if _, err := io.WriteString(s.Stdin, "line 1\nline 2\n"); err != nil {
			t.Fatal(err)
		}
		s.Stdin.Close()
		code, err := waitSession(t, s)
		if code != 5 || err != nil {
			t.Errorf("Wait = %d, %v; want 5, nil", code, err)
		}
		if stdout() != "line 1\nline 2\n" || stderr() != "done\n" {
			t.Errorf("stdout %q, stderr %q", stdout(), stderr())
		}
	})

	arg := sleepArg()
	for _, tc := range []struct {
		name string
		kill func(s *Session, cancel context.CancelFunc)
		want error
	}{
		{"Close", func(s *Session, _ context.CancelFunc) { s.Close() }, ErrSessionClosed},
		{"context", func(_ *Session, cancel context.CancelFunc) { cancel() }, context.Canceled},
	} {
		t.Run("killed by "+tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := c.Start(ctx, "sleep "+arg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			drain(s)
			for deadline := time.Now().Add(3 * time.Second); !processRunning(t, "sleep", arg); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("remote sleep is not running")
				}
			}
			start := time.Now()
			tc.kill(s, cancel)
			code, err := waitSession(t, s)
			d := time.Since(start)
			t.Logf("Wait returned %d, %v %v after the kill", code, err, d)
			if d > 2*time.Second {
				t.Errorf("Wait returned %v after the kill", d)
			}
			if code != -1 || !errors.Is(err, tc.want) {
				t.Errorf("Wait = %d, %v; want -1, %v", code, err, tc.want)
			}
			waitGone(t, "sleep", arg)
		})
	}

	t.Run("Signal", func(t *testing.T) {
		s, err := c.Start(context.Background(), "trap 'echo got TERM; exit 7' TERM; echo ready; while :; do sleep 0.05; done")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		stdout, _ := drain(s)
		time.Sleep(200 * time.Millisecond)
		if err := s.Signal(ssh.SIGTERM); err != nil {
			t.Fatal(err)
		}
		code, err := waitSession(t, s)
		if code != 7 || err != nil || stdout() != "ready\ngot TERM\n" {
			t.Errorf("Wait = %d, %v, stdout %q; want 7, nil, ready and got TERM", code, err, stdout())
		}
		// Close after exit is harmless and Wait keeps its result.
		s.Close()
		if code, err := waitSession(t, s); code != 7 || err != nil {
			t.Errorf("Wait after Close = %d, %v", code, err)
		}
	})
}

// TestSessionLimit fills a Client's sessions with long commands and checks
// that further commands wait, and that the kept session still kills.
func TestSessionLimit(t *testing.T) {
	t.Parallel()
	srv, cfg := startNode(t, "127.0.0.3")
	cfg.MaxSessions = 3 // two for commands, one kept for kills
	c := dial(t, srv, cfg)
	arg := sleepArg()
	var sessions []*Session
	for range 2 {
		s, err := c.Start(context.Background(), "sleep "+arg)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		drain(s)
		sessions = append(sessions, s)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := c.Run(ctx, "true", nil, nil); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "all 2 in use") {
		t.Errorf("Run with every session busy: %v; want it to wait until the deadline", err)
	}

	// Close kills through the kept session although both others are busy;
	// a waiting Run gets the freed one.
	done := make(chan error, 1)
	go func() {
		var out strings.Builder
		_, err := c.Run(context.Background(), "echo waited", &out, nil)
		if err == nil && out.String() != "waited\n" {
			err = fmt.Errorf("printed %q", out.String())
		}
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	sessions[0].Close()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("waiting Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiting Run did not get the freed session")
	}
	sessions[1].Close()
	waitGone(t, "sleep", arg)
}

func TestReadMarker(t *testing.T) {
	const nonce = "abc123"
	marker := pgidMarker + "4242:" + nonce + "\n"
	long := strings.Repeat("x", 10000)
	for _, tc := range []struct {
		name, in string
		pgid     int
		rest     string
	}{
		{"marker first", marker + "err\n", 4242, "err\n"},
		{"startup file output first", "motd\n" + marker + "err", 4242, "motd\nerr"},
		{"long line first", long + "\n" + marker + "err\n", 4242, long + "\nerr\n"},
		{"other nonce", pgidMarker + "4242:zzz\n" + "err\n", 0, pgidMarker + "4242:zzz\nerr\n"},
		{"bad number", pgidMarker + "x:" + nonce + "\nerr\n", 0, pgidMarker + "x:" + nonce + "\nerr\n"},
		{"no marker", "err\n", 0, "err\n"},
		{"empty", "", 0, ""},
		{"marker after the preamble limit", strings.Repeat("y\n", maxPreamble) + marker, 0, strings.Repeat("y\n", maxPreamble) + marker},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pgid, rest := readMarker(strings.NewReader(tc.in), nonce)
			b, err := io.ReadAll(rest)
			if err != nil {
				t.Fatal(err)
			}
			if pgid != tc.pgid || string(b) != tc.rest {
				t.Errorf("readMarker = %d, %.60q; want %d, %.60q", pgid, b, tc.pgid, tc.rest)
			}
		})
	}
}

func TestForEach(t *testing.T) {
	for _, tc := range []struct {
		n, parallel, wantMax int
	}{
		{n: 20, parallel: 3, wantMax: 3},
		{n: 5, parallel: 1, wantMax: 1},
		{n: 6, parallel: 0, wantMax: 6},  // no limit
		{n: 4, parallel: 10, wantMax: 4}, // more slots than work
		{n: 0, parallel: 4, wantMax: 0},
	} {
		t.Run(fmt.Sprintf("n=%d,parallel=%d", tc.n, tc.parallel), func(t *testing.T) {
			var running, peak atomic.Int32
			var calls [32]atomic.Int32
			errs := ForEach(context.Background(), tc.n, tc.parallel, func(ctx context.Context, i int) error {
				calls[i].Add(1)
				now := running.Add(1)
				for {
					p := peak.Load()
					if now <= p || peak.CompareAndSwap(p, now) {
						break
					}
				}
				time.Sleep(30 * time.Millisecond)
				running.Add(-1)
				if i%2 == 1 {
					return fmt.Errorf("odd %d", i)
				}
				return nil
			})
			if len(errs) != tc.n {
				t.Fatalf("got %d errors, want %d", len(errs), tc.n)
			}
			for i, err := range errs {
				if want := i%2 == 1; (err != nil) != want || (want && err.Error() != fmt.Sprintf("odd %d", i)) {
					t.Errorf("errs[%d] = %v", i, err)
				}
				if n := calls[i].Load(); n != 1 {
					t.Errorf("fn(%d) called %d times", i, n)
				}
			}
			if got := int(peak.Load()); got != tc.wantMax {
				t.Errorf("peak parallelism %d, want %d", got, tc.wantMax)
			}
		})
	}
}

func TestForEachCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var started atomic.Int32
	errs := ForEach(ctx, 10, 2, func(ctx context.Context, i int) error {
		if started.Add(1) == 2 {
			cancel() // both slots are busy: nothing else may start
		}
		<-ctx.Done()
		return fmt.Errorf("fn %d: %w", i, ctx.Err())
	})
	if n := started.Load(); n != 2 {
		t.Errorf("%d calls started, want 2", n)
	}
	for i, err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("errs[%d] = %v, want context.Canceled", i, err)
		}
	}
}

// TestForEachNodes dials several nodes in parallel, as the launcher does.
func TestForEachNodes(t *testing.T) {
	t.Parallel()
	type node struct {
		addr string
		cfg  ClientConfig
		port int
	}
	var nodes []node
	for _, addr := range testAddrs {
		srv, cfg := startNode(t, addr)
		nodes = append(nodes, node{addr, cfg, srv.Port})
	}
	outs := make([]string, len(nodes))
	errs := ForEach(context.Background(), len(nodes), 2, func(ctx context.Context, i int) error {
		c, err := Dial(ctx, nodes[i].addr, nodes[i].port, nodes[i].cfg)
		if err != nil {
			return err
		}
		defer c.Close()
		var out strings.Builder
		if _, err := c.Run(ctx, "echo $SSH_CONNECTION | cut -d' ' -f3", &out, nil); err != nil {
			return err
		}
		outs[i] = strings.TrimSpace(out.String())
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for i, n := range nodes {
		if outs[i] != n.addr {
			t.Errorf("node %d answered from %q, want %q", i, outs[i], n.addr)
		}
	}
}
