package sshexec

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"flag"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gptui/gptui/internal/sshtest"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/crypto/ssh/knownhosts"
)

// The test servers listen on these loopback addresses; every network
// target in these tests is on 127.0.0.x.
var testAddrs = []string{"127.0.0.2", "127.0.0.3"}

func TestMain(m *testing.M) {
	// The parallel tests mostly wait on their sshd servers and on timers:
	// run up to 8 at once rather than GOMAXPROCS (-parallel on the command
	// line still decides).
	flag.Set("test.parallel", "8")
	os.Exit(m.Run())
}

// startNode starts an sshd on addr and returns it with a ClientConfig that
// trusts its host key and logs in with its user key.
func startNode(t *testing.T, addr string) (*sshtest.Server, ClientConfig) {
	t.Helper()
	srv := sshtest.Start(t, addr)
	kh := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(kh, []byte(srv.KnownHostsLine()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return srv, ClientConfig{
		KnownHostsFile: kh,
		IdentityFiles:  []string{srv.UserKeyFile},
		NoAgent:        true,
		ConnectTimeout: 5 * time.Second,
		User:           srv.User,
	}
}

// dial connects to srv and closes the client when the test ends.
func dial(t *testing.T, srv *sshtest.Server, cfg ClientConfig) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, srv.Addr, srv.Port, cfg)
	if err != nil {
		t.Fatalf("Dial %s: %v\nsshd log:\n%s", srv.HostPort(), err, srv.Log())
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// writeKey writes a new ed25519 private key to dir/name, encrypted when
// passphrase is not empty.
func writeKey(t *testing.T, dir, name, passphrase string) string {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var block *pem.Block
	if passphrase == "" {
		block, err = ssh.MarshalPrivateKey(priv, "test")
	} else {
		block, err = ssh.MarshalPrivateKeyWithPassphrase(priv, "test", []byte(passphrase))
	}
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDialAuth(t *testing.T) {
	t.Parallel()
	srv, good := startNode(t, "127.0.0.2")
	dir := t.TempDir()
	wrong := writeKey(t, dir, "wrong", "")
	locked := writeKey(t, dir, "locked", "secret")
	for _, tc := range []struct {
		name    string
		files   []string
		wantErr string // "" means success
	}{
		{"authorized key", []string{srv.UserKeyFile}, ""},
		{"wrong key first, then the authorized one", []string{wrong, srv.UserKeyFile}, ""},
		{"wrong key only", []string{wrong}, "login refused"},
		{"passphrase-protected key only", []string{locked}, "passphrase-protected"},
		{"missing identity file", []string{filepath.Join(dir, "absent")}, "identity file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			cfg.IdentityFiles = tc.files
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			c, err := Dial(ctx, srv.Addr, srv.Port, cfg)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Dial: %v", err)
				}
				c.Close()
				return
			}
			if err == nil {
				c.Close()
				t.Fatalf("Dial succeeded, want an error containing %q", tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Dial error %q does not contain %q", err, tc.wantErr)
			}
			// No password or keyboard-interactive fallback: refusal is quick.
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("refusal took %v", d)
			}
		})
	}
}

// TestDialAgent logs in with a key held only by an ssh-agent.
func TestDialAgent(t *testing.T) {
	srv, cfg := startNode(t, "127.0.0.3")
	pemBytes, err := os.ReadFile(srv.UserKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	priv, err := ssh.ParseRawPrivateKey(pemBytes)
	if err != nil {
		t.Fatal(err)
	}
	keyring := agent.NewKeyring()
	if err := keyring.Add(agent.AddedKey{PrivateKey: priv}); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				_ = agent.ServeAgent(keyring, conn)
			}()
		}
	}()
	t.Setenv("SSH_AUTH_SOCK", sock)
	t.Setenv("HOME", t.TempDir()) // no default identity files

	cfg.IdentityFiles = nil
	cfg.NoAgent = false
	c := dial(t, srv, cfg)
	var out strings.Builder
	if code, err := c.Run(context.Background(), "echo agent", &out, nil); err != nil || code != 0 || out.String() != "agent\n" {
		t.Fatalf("Run = %d, %v, %q", code, err, out.String())
	}

	cfg.NoAgent = true
	if c, err := Dial(context.Background(), srv.Addr, srv.Port, cfg); err == nil {
		c.Close()
		t.Fatal("Dial with NoAgent and no identity files succeeded")
	} else if !strings.Contains(err.Error(), "no SSH keys") {
		t.Errorf("Dial error %q does not say there are no keys", err)
	}
}

// silentServer accepts TCP connections on 127.0.0.4 and never answers, as
// a hung host would.
func silentServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.4:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// closedPort returns an address on 127.0.0.4 where nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.4:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestDialTimeouts(t *testing.T) {
	t.Parallel()
	cfg := ClientConfig{
		KnownHostsFile: filepath.Join(t.TempDir(), "known_hosts"),
		IdentityFiles:  []string{writeKey(t, t.TempDir(), "id", "")},
		NoAgent:        true,
		ConnectTimeout: 500 * time.Millisecond,
		User:           "nobody",
	}
	for _, tc := range []struct {
		name    string
		addr    func(t *testing.T) string
		cancel  time.Duration // cancel ctx after this long; 0 never
		min     time.Duration
		max     time.Duration
		wantErr string
		wantIs  error
	}{
		{"closed port", closedPort, 0, 0, 400 * time.Millisecond, "connection refused", nil},
		{"connect never completes", unreachable, 0, 450 * time.Millisecond, 1500 * time.Millisecond, "timed out", nil},
		{"server never speaks", silentServer, 0, 450 * time.Millisecond, 1500 * time.Millisecond, "timed out", nil},
		{"cancelled during handshake", silentServer, 100 * time.Millisecond, 50 * time.Millisecond, 400 * time.Millisecond, "", context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addr := tc.addr(t)
			host, port := splitHostPort(t, addr)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel > 0 {
				time.AfterFunc(tc.cancel, cancel)
			}
			cfg := cfg
			if tc.cancel > 0 {
				cfg.ConnectTimeout = 10 * time.Second
			}
			start := time.Now()
			c, err := Dial(ctx, host, port, cfg)
			d := time.Since(start)
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded")
			}
			t.Logf("Dial %s: %v after %v", addr, err, d)
			if d < tc.min || d > tc.max {
				t.Errorf("Dial failed after %v, want between %v and %v", d, tc.min, tc.max)
			}
			if tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not contain %q", err, tc.wantErr)
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("error %q is not %v", err, tc.wantIs)
			}
		})
	}
}

func splitHostPort(t *testing.T, addr string) (string, int) {
	t.Helper()
	tcp, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return tcp.IP.String(), tcp.Port
}

// freezableProxy forwards TCP connections from 127.0.0.4 to target until
// frozen; then it keeps the connections open but passes nothing, like a
// node that lost power behind a switch.
type freezableProxy struct {
	addr   string
	mu     sync.Mutex
	frozen bool
	cond   *sync.Cond
}

func newFreezableProxy(t *testing.T, target string) *freezableProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.4:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezableProxy{addr: l.Addr().String()}
	p.cond = sync.NewCond(&p.mu)
	var conns []net.Conn
	var connsMu sync.Mutex
	t.Cleanup(func() {
		l.Close()
		connsMu.Lock()
		for _, c := range conns {
			c.Close()
		}
		connsMu.Unlock()
		p.mu.Lock()
		p.frozen = false
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			p.mu.Lock()
			for p.frozen {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if n > 0 {
				if _, err := dst.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			connsMu.Lock()
			conns = append(conns, in, out)
			connsMu.Unlock()
			go pipe(in, out)
			go pipe(out, in)
		}
	}()
	return p
}

func (p *freezableProxy) freeze() {
	p.mu.Lock()
	p.frozen = true
	p.mu.Unlock()
}

// TestKeepAliveDetectsDeadNode checks that a node that stops answering
// ends a running session within a few keepalive intervals.
func TestKeepAliveDetectsDeadNode(t *testing.T) {
	t.Parallel()
	srv, cfg := startNode(t, "127.0.0.3")
	proxy := newFreezableProxy(t, srv.HostPort())
	// The known_hosts line names the server's address, not the proxy's.
	line := knownhosts.Line([]string{proxy.addr}, srv.HostKey)
	if err := os.WriteFile(cfg.KnownHostsFile, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.KeepAlive = 100 * time.Millisecond
	host, port := splitHostPort(t, proxy.addr)
	c, err := Dial(context.Background(), host, port, cfg)
	if err != nil {
		t.Fatalf("Dial through proxy: %v", err)
	}
	defer c.Close()
	// cat runs until its standard input closes, which sshd does once the
	// test's proxy drops the connection at cleanup: nothing is left behind
	// although the client cannot kill it.
	s, err := c.Start(context.Background(), "cat")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	go func() { _, _ = io.Copy(io.Discard, s.Stdout) }()
	go func() { _, _ = io.Copy(io.Discard, s.Stderr) }()
	time.Sleep(250 * time.Millisecond) // a few keepalives succeed
	proxy.freeze()
	start := time.Now()
	done := make(chan error, 1)
	go func() { _, err := s.Wait(); done <- err }()
	select {
	case err := <-done:
		d := time.Since(start)
		t.Logf("Wait after freeze: %v after %v", err, d)
		if err == nil {
			t.Error("Wait succeeded on a dead connection")
		}
		if d > 2*time.Second {
			t.Errorf("dead node noticed after %v, want under 2s", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait still blocked 5s after the node stopped answering")
	}
}
