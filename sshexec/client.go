package sshexec

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

// Defaults for ClientConfig fields left zero.
const (
	// DefaultConnectTimeout bounds the TCP connect plus the SSH handshake.
	DefaultConnectTimeout = 10 * time.Second
	// DefaultKeepAlive is the interval between keepalive requests on an
	// idle connection.
	DefaultKeepAlive = 15 * time.Second
	// DefaultMaxSessions is OpenSSH's default MaxSessions: how many
	// sessions sshd allows on one connection.
	DefaultMaxSessions = 10
	// sessionRetry bounds how long opening a session is retried while the
	// server refuses it (it may still count sessions that are closing).
	sessionRetry = 5 * time.Second
	// keepAliveCountMax is how many intervals a keepalive reply may take
	// before the connection is declared dead, as OpenSSH's
	// ServerAliveCountMax.
	keepAliveCountMax = 3
)

// ClientConfig says how Dial connects and authenticates. The zero value
// uses ~/.ssh/known_hosts, refuses unknown hosts, logs in as the current
// user with ~/.ssh/id_ed25519, id_ecdsa, id_rsa (those that exist) and the
// keys of ssh-agent, and gives up after DefaultConnectTimeout.
//
// Only public key authentication is used: never passwords or
// keyboard-interactive prompts, so Dial never waits for a person.
type ClientConfig struct {
	// KnownHostsFile is the OpenSSH known_hosts file host keys are checked
	// against; default ~/.ssh/known_hosts. A missing file knows no hosts.
	KnownHostsFile string
	// AcceptNewHostKeys accepts the key of a host the file does not know
	// and appends it to KnownHostsFile (trust on first use). A key that
	// differs from a recorded one is refused regardless.
	AcceptNewHostKeys bool
	// AcceptHostKey, a SHA-256 fingerprint ("SHA256:...", as ssh-keygen
	// -l prints it), accepts that one key of a host the file does not
	// know and appends it to KnownHostsFile, as AcceptNewHostKeys does
	// for any key: a person compared the fingerprint and said yes. A host
	// offering another key is refused as unknown.
	AcceptHostKey string
	// IdentityFiles are private key files (OpenSSH or PEM format, without
	// a passphrase), tried in order before the agent's keys. Each must
	// exist. When empty, the default files in ~/.ssh that exist are used.
	// A passphrase-protected file is skipped (its key may still be
	// offered by the agent).
	IdentityFiles []string
	// NoAgent disables ssh-agent. Otherwise, when SSH_AUTH_SOCK is set,
	// the agent's keys are offered after IdentityFiles.
	NoAgent bool
	// ConnectTimeout bounds the TCP connect and the SSH handshake
	// together; default DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// KeepAlive is the interval of keepalive requests, which detect a
	// dead node or network: after three unanswered intervals the
	// connection is closed and its sessions fail. Default
	// DefaultKeepAlive; negative disables.
	KeepAlive time.Duration
	// User is the login name; default the current user.
	User string
	// Jump lists the jump hosts (bastions, login hosts) to pass through,
	// in order, as OpenSSH's ProxyJump: Dial connects to the first, from
	// it to the next, and from the last to the node. Each is known,
	// accepted or refused in KnownHostsFile as the node is; each is
	// offered the node's keys, unless its IdentityFiles name some that
	// exist; a jump host without a User is logged in to as the current
	// user (not as User), as ssh does. ConnectTimeout bounds all the
	// hops together. Empty: connect to the node directly.
	Jump []JumpHost
	// MaxSessions is the most sessions the server allows on one
	// connection (sshd's MaxSessions); default DefaultMaxSessions, at
	// least 2. One is kept for killing and signalling commands, so up to
	// MaxSessions-1 commands and pushes run at once on a Client; further
	// ones wait for a free session until their context ends.
	MaxSessions int
}

// Client is an SSH connection to one node, reused for many sessions
// (commands, file pushes). It is safe for concurrent use; see
// ClientConfig.MaxSessions for how many sessions run at once.
type Client struct {
	conn *ssh.Client
	// hops are the clients of the jump hosts conn passes through, first
	// to last; Close closes them after conn.
	hops          []*ssh.Client
	addr          string   // host:port as dialed
	remote, local net.Addr // RemoteAddr and LocalAddr
	// connectTimeout bounds auxiliary requests such as signalling.
	connectTimeout time.Duration
	// slots holds a token per open command or SFTP session; control holds
	// the one for the session that kills or signals a command.
	slots, control chan struct{}

	done      chan struct{} // closed by Close
	closeOnce sync.Once
	closeErr  error
}

// Dial connects to host:port (port 0 means 22), verifies the host key
// against cfg.KnownHostsFile and logs in with public keys.
//
// With cfg.Jump it connects to the first jump host, from there to the
// next and from the last to the node, as ssh -J does; each jump host's
// key is verified and refused as the node's, and an error on the way
// names the jump host ("via jump host bastion:22: ..."). Closing the
// Client closes the connections to the jump hosts too.
//
// A refused host key is reported as a *HostKeyError (a jump host's
// wrapped with its name). Cancelling ctx, or exceeding
// cfg.ConnectTimeout, aborts the connects and the handshakes, of every
// hop.
func Dial(ctx context.Context, host string, port int, cfg ClientConfig) (*Client, error) {
	if port == 0 {
		port = 22
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("ssh %s: %w", addr, err)
	}
	keys, err := loadKeys(cfg)
	if err != nil {
		return nil, fmt.Errorf("ssh %s@%s: %w", cfg.User, addr, err)
	}
	defer keys.close()
	known, err := loadKnownHosts(cfg.KnownHostsFile, cfg.AcceptNewHostKeys)
	if err != nil {
		return nil, fmt.Errorf("ssh %s: %w", addr, err)
	}
	known.acceptKey = cfg.AcceptHostKey

	dialCtx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	// via names the jump host an error happened at, if any.
	via := func(i int, err error) error {
		if i < 0 {
			return err
		}
		return fmt.Errorf("via jump host %s: %w", cfg.Jump[i], err)
	}
	first, hop := addr, -1
	if len(cfg.Jump) > 0 {
		first, hop = cfg.Jump[0].addr(), 0
	}
	var d net.Dialer
	tcp, err := d.DialContext(dialCtx, "tcp", first)
	if err != nil {
		if ctx.Err() == nil && (dialCtx.Err() != nil || isTimeout(err)) {
			return nil, via(hop, fmt.Errorf("connect to %s: timed out after %v", first, cfg.ConnectTimeout))
		}
		return nil, via(hop, fmt.Errorf("connect to %s: %w", first, err))
	}
	// The handshakes have what is left of the timeout; cancelling ctx (or
	// the timeout firing) closes the connection under them. Every hop's
	// connection is carried by this first one.
	deadline, _ := dialCtx.Deadline()
	_ = tcp.SetDeadline(deadline)
	stop := context.AfterFunc(dialCtx, func() { tcp.Close() })

	cd := &chainDialer{ctx: ctx, dialCtx: dialCtx, timeout: cfg.ConnectTimeout, known: known, noAgent: cfg.NoAgent}
	var hops []*ssh.Client // the jump hosts' clients, first to last
	fail := func(err error) (*Client, error) {
		stop()
		closeAll(nil, hops)
		tcp.Close()
		return nil, err
	}
	conn := tcp
	for i, h := range cfg.Jump {
		hc, err := cd.hop(conn, h, keys)
		if err != nil {
			return fail(via(i, err))
		}
		hops = append(hops, hc)
		next := addr
		if i+1 < len(cfg.Jump) {
			next = cfg.Jump[i+1].addr()
		}
		if conn, err = cd.through(hc, next); err != nil {
			return fail(via(i, err))
		}
	}
	sc, err := cd.handshake(conn, addr, hopAddr(conn, addr), cfg.User, keys)
	if err != nil {
		return fail(err)
	}
	remote := sc.RemoteAddr()
	if len(hops) > 0 {
		remote = nodeAddr(dialCtx, sc, addr)
	}
	if !stop() {
		// The handshake finished just as ctx ended or time ran out.
		sc.Close()
		if ctx.Err() != nil {
			return fail(fmt.Errorf("ssh %s: %w", addr, ctx.Err()))
		}
		return fail(fmt.Errorf("ssh %s: handshake timed out after %v (is an SSH server listening there?)", addr, cfg.ConnectTimeout))
	}
	_ = tcp.SetDeadline(time.Time{})

	c := &Client{
		conn:           sc,
		hops:           hops,
		addr:           addr,
		remote:         remote,
		local:          tcp.LocalAddr(),
		connectTimeout: cfg.ConnectTimeout,
		slots:          make(chan struct{}, cfg.MaxSessions-1),
		control:        make(chan struct{}, 1),
		done:           make(chan struct{}),
	}
	if cfg.KeepAlive > 0 {
		go c.keepAlive(cfg.KeepAlive)
	}
	return c, nil
}

// closeAll closes c, if not nil, and then the jump hosts' clients hops,
// last first, and returns c's error.
func closeAll(c *ssh.Client, hops []*ssh.Client) error {
	var err error
	if c != nil {
		err = c.Close()
	}
	for i := len(hops) - 1; i >= 0; i-- {
		hops[i].Close()
	}
	return err
}

// Addr returns the address the client dialed, in host:port form.
func (c *Client) Addr() string { return c.addr }

// RemoteAddr returns the node's end of the connection: the IP address its
// host name resolved to, and the port. For a node reached through jump
// hosts it is the address the node took the connection on (the last jump
// host resolved the name); should the node not say, the name as dialed.
func (c *Client) RemoteAddr() net.Addr { return c.remote }

// LocalAddr returns this machine's end of the connection: the address the
// node sees it connect from (unless a NAT lies between them). Through jump
// hosts it is this machine's end of the connection to the first one.
func (c *Client) LocalAddr() net.Addr { return c.local }

// Close closes the connection, and those to the jump hosts it passes
// through. It does not kill commands still running: close their Sessions
// (or end their contexts) first. A command left running loses its
// standard streams: EOF on standard input, SIGPIPE when it writes. Close
// is idempotent.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		close(c.done)
		c.closeErr = closeAll(c.conn, c.hops)
		if errors.Is(c.closeErr, net.ErrClosed) {
			// The keepalive loop found the connection dead and closed it.
			c.closeErr = nil
		}
	})
	return c.closeErr
}

// keepAlive sends a keepalive request every interval and closes the
// connection when replies stop.
func (c *Client) keepAlive(interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		replied := make(chan error, 1)
		go func() {
			// OpenSSH answers an unknown global request with a failure,
			// which is as good as a success: the peer is alive.
			_, _, err := c.conn.SendRequest("keepalive@openssh.com", true, nil)
			replied <- err
		}()
		timeout := time.NewTimer(keepAliveCountMax * interval)
		select {
		case err := <-replied:
			timeout.Stop()
			if err != nil {
				return // connection already closed
			}
		case <-timeout.C:
			closeAll(c.conn, c.hops)
			return
		case <-c.done:
			timeout.Stop()
			return
		}
	}
}

// openSession opens a session channel once a token of slots (c.slots or
// c.control) is free. The server may refuse a session while it still counts
// ones that are closing, so a refusal is retried for up to sessionRetry.
// release returns the token; call it once the session is closed.
func (c *Client) openSession(ctx context.Context, slots chan struct{}) (s *ssh.Session, release func(), err error) {
	select {
	case slots <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("open session on %s: all %d in use: %w", c.addr, cap(slots), ctx.Err())
	case <-c.done:
		return nil, nil, fmt.Errorf("open session on %s: %w", c.addr, net.ErrClosed)
	}
	var once sync.Once
	release = func() { once.Do(func() { <-slots }) }
	delay := 10 * time.Millisecond
	deadline := time.Now().Add(sessionRetry)
	for {
		s, err := c.conn.NewSession()
		if err == nil {
			return s, release, nil
		}
		var refused *ssh.OpenChannelError
		if !errors.As(err, &refused) {
			release()
			return nil, nil, fmt.Errorf("open session on %s: %w", c.addr, err)
		}
		if time.Now().After(deadline) {
			release()
			return nil, nil, fmt.Errorf("open session on %s: %w (is the server's MaxSessions below ClientConfig.MaxSessions?)", c.addr, err)
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			release()
			return nil, nil, fmt.Errorf("open session on %s: %w (server refused: %v)", c.addr, ctx.Err(), err)
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}

func (cfg ClientConfig) withDefaults() (ClientConfig, error) {
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	if cfg.MaxSessions == 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	cfg.MaxSessions = max(cfg.MaxSessions, 2)
	if cfg.User == "" {
		u, err := currentUser()
		if err != nil {
			return cfg, err
		}
		cfg.User = u
	}
	if cfg.KnownHostsFile == "" || len(cfg.IdentityFiles) == 0 {
		home, err := os.UserHomeDir()
		if err != nil {
			return cfg, fmt.Errorf("default SSH files: %w", err)
		}
		if cfg.KnownHostsFile == "" {
			cfg.KnownHostsFile = filepath.Join(home, ".ssh", "known_hosts")
		}
		if len(cfg.IdentityFiles) == 0 {
			for _, name := range []string{"id_ed25519", "id_ecdsa", "id_rsa"} {
				p := filepath.Join(home, ".ssh", name)
				if _, err := os.Stat(p); err == nil {
					cfg.IdentityFiles = append(cfg.IdentityFiles, p)
				}
			}
		}
	}
	return cfg, nil
}

// currentUser returns the name of the user running gptui, the default
// login name.
func currentUser() (string, error) {
	u, err := user.Current()
	if err != nil {
		return "", fmt.Errorf("current user: %w", err)
	}
	return u.Username, nil
}

// keySet is the keys one Dial offers.
type keySet struct {
	signers []ssh.Signer
	sources []string // per signer: file name or "agent"
	skipped []string // why a file's key is not offered
	agent   net.Conn // open for the handshake's signatures
}

// loadKeys reads cfg.IdentityFiles and asks the agent for its keys.
func loadKeys(cfg ClientConfig) (*keySet, error) {
	ks := &keySet{}
	seen := map[string]bool{}
	add := func(s ssh.Signer, source string) {
		blob := string(s.PublicKey().Marshal())
		if !seen[blob] {
			seen[blob] = true
			ks.signers = append(ks.signers, s)
			ks.sources = append(ks.sources, source)
		}
	}
	for _, f := range cfg.IdentityFiles {
		pem, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("identity file: %w", err)
		}
		s, err := ssh.ParsePrivateKey(pem)
		var pme *ssh.PassphraseMissingError
		switch {
		case errors.As(err, &pme):
			ks.skipped = append(ks.skipped, f+" is passphrase-protected (add it to ssh-agent)")
			continue
		case err != nil:
			return nil, fmt.Errorf("identity file %s: %w", f, err)
		}
		add(s, f)
	}
	if sock := os.Getenv("SSH_AUTH_SOCK"); sock != "" && !cfg.NoAgent {
		conn, err := net.DialTimeout("unix", sock, cfg.ConnectTimeout)
		if err != nil {
			ks.skipped = append(ks.skipped, fmt.Sprintf("ssh-agent at %s unreachable: %v", sock, err))
		} else {
			signers, err := agent.NewClient(conn).Signers()
			if err != nil {
				conn.Close()
				ks.skipped = append(ks.skipped, fmt.Sprintf("ssh-agent at %s: %v", sock, err))
			} else {
				ks.agent = conn
				for _, s := range signers {
					add(s, "agent")
				}
			}
		}
	}
	if len(ks.signers) == 0 {
		return nil, fmt.Errorf("no SSH keys to log in with: %s", ks.describe())
	}
	return ks, nil
}

// describe lists the offered keys and the skipped ones, for errors.
func (ks *keySet) describe() string {
	var parts []string
	for i, s := range ks.signers {
		parts = append(parts, fmt.Sprintf("%s %s (%s)", s.PublicKey().Type(), ssh.FingerprintSHA256(s.PublicKey()), ks.sources[i]))
	}
	if len(parts) == 0 {
		parts = append(parts, "no identity files and no ssh-agent keys")
	}
	for _, s := range ks.skipped {
		parts = append(parts, "skipped: "+s)
	}
	return strings.Join(parts, "; ")
}

func (ks *keySet) close() {
	if ks.agent != nil {
		ks.agent.Close()
	}
}

// isTimeout reports whether err is a network timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded)
}
