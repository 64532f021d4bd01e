// Package sshtest runs a real OpenSSH server for tests.
//
// [Start] launches /usr/sbin/sshd in the foreground on a free port of a
// loopback address (127.0.0.2, 127.0.0.3, ... all work on Linux without
// configuration), with freshly generated host keys and a freshly generated
// user key pair authorized for the current user, and stops it when the test
// ends. Everything the server needs lives in a temporary directory; nothing
// under /etc/ssh or ~/.ssh is read or written. Sessions run the user's
// login shell without ~/.bashrc, whose output would otherwise mix with the
// commands'.
//
// When sshd runs as root it needs its privilege separation directory
// (/run/sshd); Start creates it when it is missing, as the distribution's
// service unit would.
package sshtest

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// SSHD is the OpenSSH server binary that Start runs. sshd re-executes itself
// for every connection, so the path must be absolute.
const SSHD = "/usr/sbin/sshd"

// startTimeout bounds how long Start waits for sshd to accept connections.
const startTimeout = 10 * time.Second

// Server is a running sshd. Its fields describe it and must not be modified.
type Server struct {
	// Addr is the loopback address the server listens on, e.g. "127.0.0.2".
	Addr string
	// Port is the TCP port the server listens on.
	Port int
	// User is the login name the user key is authorized for: the user
	// running the test.
	User string
	// HostKey is the server's ed25519 host key.
	HostKey ssh.PublicKey
	// HostKeys holds every host key the server offers, HostKey first
	// followed by an ECDSA P-256 key, as a stock OpenSSH installation
	// offers several key types.
	HostKeys []ssh.PublicKey
	// UserKeyFile is the path of the unencrypted OpenSSH-format private
	// key (ed25519) whose public half is authorized for User.
	UserKeyFile string
	// UserKey is the public half of UserKeyFile.
	UserKey ssh.PublicKey
	// Dir is the temporary directory holding the server's configuration,
	// keys, pid file and authorized_keys.
	Dir string

	t    testing.TB
	sshd string
	// ns is the network namespace sshd runs in (StartIn); "" for this
	// process's.
	ns  string
	mu  sync.Mutex
	cmd *exec.Cmd
	log *lockedBuffer
	// exited is closed when cmd has been waited for.
	exited chan struct{}
}

// Start starts sshd on a free port of addr, a loopback IP address such as
// "127.0.0.2", and registers its shutdown with t.Cleanup.
//
// If /usr/sbin/sshd is missing the test is skipped, unless the CI
// environment variable is set, in which case it fails: CI must run these
// tests. Any other problem fails the test, with sshd's log.
func Start(t testing.TB, addr string) *Server {
	t.Helper()
	return start(t, addr, SSHD)
}

func start(t testing.TB, addr, sshd string) *Server {
	t.Helper()
	if _, err := os.Stat(sshd); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("sshtest: %s not found (install openssh-server to run this test): %v", sshd, err)
		}
		t.Fatalf("sshtest: %s not found and CI is set; install openssh-server: %v", sshd, err)
	}
	ip := net.ParseIP(addr)
	if ip == nil || !ip.IsLoopback() {
		t.Fatalf("sshtest: address %q is not a loopback IP address", addr)
	}
	u, err := user.Current()
	if err != nil {
		t.Fatalf("sshtest: current user: %v", err)
	}
	if os.Geteuid() == 0 {
		// sshd refuses to start as root without its privsep chroot directory.
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			t.Fatalf("sshtest: create privilege separation directory: %v", err)
		}
	}

	s := &Server{Addr: addr, User: u.Username, Dir: t.TempDir(), t: t, sshd: sshd}
	if err := s.writeUserKey(); err != nil {
		t.Fatalf("sshtest: %v", err)
	}
	if err := s.writeHostKeys(); err != nil {
		t.Fatalf("sshtest: %v", err)
	}
	t.Cleanup(s.Stop)

	// A port picked by the kernel can be taken by someone else before sshd
	// binds it; try a few times.
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort(addr)
		if err != nil {
			t.Fatalf("sshtest: %v", err)
		}
		s.Port = port
		if lastErr = s.run(); lastErr == nil {
			return s
		}
	}
	t.Fatalf("sshtest: start sshd on %s: %v\nsshd log:\n%s", addr, lastErr, s.Log())
	return nil
}

// KnownHostsLine returns an OpenSSH known_hosts line for the server's
// ed25519 host key, e.g. "[127.0.0.2]:40123 ssh-ed25519 AAAA...".
func (s *Server) KnownHostsLine() string {
	return knownhosts.Line([]string{s.HostPort()}, s.HostKey)
}

// HostPort returns the server's address in host:port form.
func (s *Server) HostPort() string {
	return net.JoinHostPort(s.Addr, strconv.Itoa(s.Port))
}

// Log returns what sshd has written to its standard error so far.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.log == nil {
		return ""
	}
	return s.log.String()
}

// Stop stops the server's listening process. Sessions already open keep
// their per-connection sshd processes until the clients disconnect. Stop is
// safe to call more than once; Start registers it with t.Cleanup.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
	if s.t.Failed() {
		s.t.Logf("sshtest: sshd on %s log:\n%s", s.HostPort(), s.Log())
	}
}

// LimitFileSize makes the files that the server's new sessions write
// fail beyond bytes (the soft RLIMIT_FSIZE of the listening sshd, which
// the processes of every later session inherit: a write past it fails
// with EFBIG, and a process that does not ignore SIGXFSZ is killed), as
// they would on a disk that fills up; bytes < 0 lifts the limit. Sessions
// already open keep the limit they started with. Linux only.
func (s *Server) LimitFileSize(t testing.TB, bytes int64) {
	t.Helper()
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		t.Fatalf("sshtest: LimitFileSize: the server on %s is stopped", s.HostPort())
	}
	if err := limitFileSize(cmd.Process.Pid, bytes); err != nil {
		t.Fatalf("sshtest: limiting the file size of sshd on %s: %v", s.HostPort(), err)
	}
}

// RotateHostKey stops the server, replaces its host keys with new ones and
// starts it again on the same port, as a reinstalled node would look to a
// client that knew the old keys. HostKey and HostKeys are updated.
func (s *Server) RotateHostKey(t testing.TB) {
	t.Helper()
	s.Stop()
	if err := s.writeHostKeys(); err != nil {
		t.Fatalf("sshtest: %v", err)
	}
	var err error
	// The old listener is gone, but give the kernel a moment if the port
	// is briefly unavailable.
	for attempt := 0; attempt < 5; attempt++ {
		if err = s.run(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("sshtest: restart sshd on %s: %v\nsshd log:\n%s", s.HostPort(), err, s.Log())
}

// run writes the configuration for s.Port and runs sshd until it accepts
// connections — in s.ns when set, which this process's namespace may not
// reach: then until sshd says it listens.
func (s *Server) run() error {
	config := filepath.Join(s.Dir, "sshd_config")
	if err := os.WriteFile(config, []byte(s.config()), 0o600); err != nil {
		return fmt.Errorf("write sshd_config: %w", err)
	}
	s.mu.Lock()
	if s.log == nil {
		s.log = &lockedBuffer{}
	}
	log := s.log
	s.mu.Unlock()
	cmd := exec.Command(s.sshd, "-D", "-e", "-f", config)
	ready := s.probe
	if s.ns != "" {
		// ip netns exec replaces itself with sshd: the process is sshd's.
		cmd = exec.Command("ip", "netns", "exec", s.ns, s.sshd, "-D", "-e", "-f", config)
		listening := fmt.Sprintf("Server listening on %s port %d.", s.Addr, s.Port)
		ready = func() error {
			if !strings.Contains(log.String(), listening) {
				return errors.New("not listening yet")
			}
			return nil
		}
	}
	cmd.Stdout = log
	cmd.Stderr = log
	// sshd does not need the test's environment (SSH_AUTH_SOCK and so on).
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = sysProcAttr()
	// sshd's per-connection processes inherit its standard error; a client
	// the test forgot to close must not keep Wait (and so Stop) blocked.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run %s: %w", s.sshd, err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()

	deadline := time.Now().Add(startTimeout)
	for {
		if err := ready(); err == nil {
			return nil
		}
		select {
		case <-exited:
			s.mu.Lock()
			s.cmd = nil
			s.mu.Unlock()
			return fmt.Errorf("sshd exited: %v: %s", waitErr, strings.TrimSpace(log.String()))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("sshd did not accept connections on %s within %v", s.HostPort(), startTimeout)
		}
	}
}

// probe connects to the server and reads its identification banner, which
// proves that sshd (and not some other process) owns the port.
func (s *Server) probe() error {
	conn, err := net.DialTimeout("tcp", s.HostPort(), time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "SSH-2.0-") {
		return fmt.Errorf("unexpected banner %q", line)
	}
	return nil
}

func (s *Server) config() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("ListenAddress %s", s.HostPort())
	p("HostKey %s", filepath.Join(s.Dir, "ssh_host_ed25519_key"))
	p("HostKey %s", filepath.Join(s.Dir, "ssh_host_ecdsa_key"))
	p("PidFile %s", filepath.Join(s.Dir, "sshd.pid"))
	p("AuthorizedKeysFile %s", filepath.Join(s.Dir, "authorized_keys"))
	p("PermitRootLogin prohibit-password")
	p("StrictModes no")
	p("UsePAM no")
	p("PubkeyAuthentication yes")
	p("PasswordAuthentication no")
	p("KbdInteractiveAuthentication no")
	p("UseDNS no")
	p("PrintMotd no")
	p("PrintLastLog no")
	p("MaxStartups 100")
	p("LogLevel VERBOSE")
	p("Subsystem sftp internal-sftp")
	// bash reads ~/.bashrc even for a non-interactive command when sshd
	// starts it, unless SHLVL shows it is not the first shell: keep the
	// test user's startup files (which may print, or be slow) out of the
	// sessions.
	p("SetEnv SHLVL=1")
	return b.String()
}

func (s *Server) writeUserKey() error {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("generate user key: %w", err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		return fmt.Errorf("user public key: %w", err)
	}
	s.UserKeyFile = filepath.Join(s.Dir, "id_ed25519")
	if err := writePrivateKey(s.UserKeyFile, priv, "sshtest user key"); err != nil {
		return err
	}
	if err := os.WriteFile(s.UserKeyFile+".pub", ssh.MarshalAuthorizedKey(sshPub), 0o644); err != nil {
		return fmt.Errorf("write user public key: %w", err)
	}
	auth := filepath.Join(s.Dir, "authorized_keys")
	if err := os.WriteFile(auth, ssh.MarshalAuthorizedKey(sshPub), 0o600); err != nil {
		return fmt.Errorf("write authorized_keys: %w", err)
	}
	s.UserKey = sshPub
	return nil
}

func (s *Server) writeHostKeys() error {
	_, edPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("generate host key: %w", err)
	}
	ecPriv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate host key: %w", err)
	}
	var keys []ssh.PublicKey
	for _, k := range []struct {
		file string
		priv any
		pub  any
	}{
		{"ssh_host_ed25519_key", edPriv, edPriv.Public()},
		{"ssh_host_ecdsa_key", ecPriv, ecPriv.Public()},
	} {
		if err := writePrivateKey(filepath.Join(s.Dir, k.file), k.priv, "sshtest host key"); err != nil {
			return err
		}
		pub, err := ssh.NewPublicKey(k.pub)
		if err != nil {
			return fmt.Errorf("host public key: %w", err)
		}
		keys = append(keys, pub)
	}
	s.HostKey, s.HostKeys = keys[0], keys
	return nil
}

// writePrivateKey writes key in OpenSSH format with mode 0600, which sshd
// and ssh both insist on.
func writePrivateKey(path string, key any, comment string) error {
	block, err := ssh.MarshalPrivateKey(key, comment)
	if err != nil {
		return fmt.Errorf("marshal private key: %w", err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return fmt.Errorf("write private key: %w", err)
	}
	return nil
}

// freePort asks the kernel for a free TCP port on addr.
func freePort(addr string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return 0, fmt.Errorf("find a free port on %s: %w", addr, err)
	}
	defer l.Close()
	tcp, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return 0, errors.New("find a free port: listener address is not TCP")
	}
	return tcp.Port, nil
}

// lockedBuffer is a bytes.Buffer safe for the concurrent writes of sshd's
// output copier and reads from the test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
