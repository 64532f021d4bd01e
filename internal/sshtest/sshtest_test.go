package sshtest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// dial logs in to s with its user key, accepting only the given host key.
func dial(t *testing.T, s *Server, hostKey ssh.PublicKey) (*ssh.Client, error) {
	t.Helper()
	pem, err := os.ReadFile(s.UserKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.ParsePrivateKey(pem)
	if err != nil {
		t.Fatalf("parse user key: %v", err)
	}
	return ssh.Dial("tcp", s.HostPort(), &ssh.ClientConfig{
		User:              s.User,
		Auth:              []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback:   ssh.FixedHostKey(hostKey),
		HostKeyAlgorithms: []string{hostKey.Type()},
		Timeout:           5 * time.Second,
	})
}

func run(t *testing.T, c *ssh.Client, cmd string) string {
	t.Helper()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatalf("new session: %v", err)
	}
	defer sess.Close()
	var stderr bytes.Buffer
	sess.Stderr = &stderr
	out, err := sess.Output(cmd)
	if err != nil {
		t.Fatalf("%s: %v: %s", cmd, err, stderr.String())
	}
	if stderr.Len() != 0 {
		t.Errorf("%s: unexpected standard error %q", cmd, stderr.String())
	}
	return string(out)
}

func TestStartAndLogin(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"127.0.0.2", "127.0.0.3"} {
		t.Run(addr, func(t *testing.T) {
			t.Parallel()
			s := Start(t, addr)
			if s.Addr != addr || s.Port <= 0 {
				t.Fatalf("server at %s:%d, want %s:<port>", s.Addr, s.Port, addr)
			}
			for _, key := range s.HostKeys {
				c, err := dial(t, s, key)
				if err != nil {
					t.Fatalf("dial with %s host key: %v\n%s", key.Type(), err, s.Log())
				}
				if got := strings.TrimSpace(run(t, c, "id -un")); got != s.User {
					t.Errorf("remote user %q, want %q", got, s.User)
				}
				// The server's peer address must be the loopback address we
				// asked for, not 127.0.0.1.
				if got := strings.Fields(run(t, c, "echo $SSH_CONNECTION"))[2]; got != addr {
					t.Errorf("server address %s, want %s", got, addr)
				}
				c.Close()
			}
		})
	}
}

func TestKnownHostsLine(t *testing.T) {
	t.Parallel()
	s := Start(t, "127.0.0.2")
	line := s.KnownHostsLine()
	f := t.TempDir() + "/known_hosts"
	if err := os.WriteFile(f, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cb, err := knownhosts.New(f)
	if err != nil {
		t.Fatalf("parse %q: %v", line, err)
	}
	remote := &net.TCPAddr{IP: net.ParseIP(s.Addr), Port: s.Port}
	if err := cb(s.HostPort(), remote, s.HostKey); err != nil {
		t.Errorf("known_hosts line %q does not match the host key: %v", line, err)
	}
	if err := cb(s.HostPort(), remote, s.HostKeys[1]); err == nil {
		t.Errorf("known_hosts line %q matches a different key", line)
	}
}

func TestRotateHostKey(t *testing.T) {
	t.Parallel()
	s := Start(t, "127.0.0.3")
	old, port := s.HostKey, s.Port
	s.RotateHostKey(t)
	if s.Port != port {
		t.Fatalf("port changed from %d to %d", port, s.Port)
	}
	if bytes.Equal(old.Marshal(), s.HostKey.Marshal()) {
		t.Fatal("host key did not change")
	}
	if c, err := dial(t, s, old); err == nil {
		c.Close()
		t.Fatal("login accepting only the old host key succeeded")
	}
	c, err := dial(t, s, s.HostKey)
	if err != nil {
		t.Fatalf("dial with the new host key: %v", err)
	}
	c.Close()
}

func TestStopIsIdempotent(t *testing.T) {
	t.Parallel()
	s := Start(t, "127.0.0.2")
	s.Stop()
	s.Stop()
	if c, err := net.DialTimeout("tcp", s.HostPort(), time.Second); err == nil {
		c.Close()
		t.Fatalf("%s still accepts connections after Stop", s.HostPort())
	}
}

// recorder is a testing.TB that records how a test would have ended.
type recorder struct {
	testing.TB
	ended string // "skip" or "fatal"
	msg   string
}

// stop ends the goroutine as t.Skip and t.Fatal do, through a panic the
// caller recovers.
type stop struct{}

func (r *recorder) Skipf(format string, args ...any) {
	r.ended, r.msg = "skip", fmt.Sprintf(format, args...)
	panic(stop{})
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.ended, r.msg = "fatal", fmt.Sprintf(format, args...)
	panic(stop{})
}

func (r *recorder) Helper() {}

func TestMissingSSHD(t *testing.T) {
	for _, tc := range []struct {
		ci, want string
	}{
		{"", "skip"},
		{"true", "fatal"},
	} {
		t.Run("CI="+tc.ci, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			r := &recorder{TB: t}
			func() {
				defer func() {
					if v := recover(); v != nil && v != (stop{}) {
						panic(v)
					}
				}()
				start(r, "127.0.0.2", filepath.Join(t.TempDir(), "no-sshd"))
			}()
			if r.ended != tc.want || !strings.Contains(r.msg, "openssh-server") {
				t.Errorf("ended with %s %q, want %s naming openssh-server", r.ended, r.msg, tc.want)
			}
		})
	}
}

// TestStopWithOpenConnection checks that a client the test did not close
// does not keep Stop waiting for sshd's per-connection process.
func TestStopWithOpenConnection(t *testing.T) {
	t.Parallel()
	s := Start(t, "127.0.0.3")
	c, err := dial(t, s, s.HostKey)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	run(t, c, "true")
	start := time.Now()
	s.Stop()
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Stop took %v with a connection open", d)
	}
}

// TestLimitFileSize: with the file size limited, a session's write past
// the limit fails and leaves the file at the limit; a connection made
// after the limit is lifted writes it whole.
func TestLimitFileSize(t *testing.T) {
	t.Parallel()
	s := Start(t, "127.0.0.2")
	file := filepath.Join(t.TempDir(), "f")
	write := func() (int64, error) {
		c, err := dial(t, s, s.HostKey)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		sess, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		err = sess.Run("head -c 5000 /dev/zero > " + file)
		fi, serr := os.Stat(file)
		if serr != nil {
			t.Fatal(serr)
		}
		return fi.Size(), err
	}
	s.LimitFileSize(t, 1000)
	if size, err := write(); err == nil || size != 1000 {
		t.Errorf("limited to 1000 bytes: %d bytes written, %v; want 1000 and an error", size, err)
	}
	s.LimitFileSize(t, -1)
	if size, err := write(); err != nil || size != 5000 {
		t.Errorf("limit lifted: %d bytes written, %v; want 5000", size, err)
	}
}
