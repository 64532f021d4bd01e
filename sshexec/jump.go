package sshexec

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// JumpHost is a host that the SSH connection to a node passes through: a
// bastion or login host, one hop of OpenSSH's ProxyJump.
type JumpHost struct {
	Name string // the host as written, without user, port or brackets
	Host string // the address to reach: HostName from ~/.ssh/config, else Name
	User string // the login name there; empty for the current user
	Port int    // the SSH port, 22 unless given
	// IdentityFiles are the private key files that ~/.ssh/config gives
	// the jump host, ~ expanded; Dial offers those of them that exist
	// (and the agent's keys) there. When none does, the jump host is
	// offered the node's keys.
	IdentityFiles []string
}

// String returns the jump host as [user@]name:port, as messages name it.
func (h JumpHost) String() string {
	s := net.JoinHostPort(h.Name, strconv.Itoa(h.port()))
	if h.User != "" {
		s = h.User + "@" + s
	}
	return s
}

// addr returns the address to dial, in host:port form.
func (h JumpHost) addr() string {
	host := h.Host
	if host == "" {
		host = h.Name
	}
	return net.JoinHostPort(host, strconv.Itoa(h.port()))
}

func (h JumpHost) port() int {
	if h.Port == 0 {
		return 22
	}
	return h.Port
}

// ParseJump parses a list of jump hosts as OpenSSH's ProxyJump and
// gptui's jump= take it: [user@]host[:port] items (an IPv6 address with a
// port written [addr]:port, an item may start with ssh://) separated by
// commas, the first the one connected to first; "none" is none. Each host
// is looked up in cfg, which may be nil, for its HostName, User, Port and
// IdentityFile, as ssh does (its own ProxyJump is not followed).
func ParseJump(s string, cfg *SSHConfig) ([]JumpHost, error) {
	if strings.EqualFold(s, "none") {
		return nil, nil
	}
	var hops []JumpHost
	for item := range strings.SplitSeq(s, ",") {
		spec, _ := strings.CutPrefix(item, "ssh://")
		if spec == "" {
			return nil, errors.New("an empty jump host; separate [user@]host[:port] items with single commas")
		}
		user, host, port, err := splitInventoryHost(spec)
		if err != nil {
			return nil, err
		}
		hc := cfg.Lookup(host)
		h := JumpHost{Name: host, Host: host, User: user, Port: port, IdentityFiles: hc.IdentityFiles}
		if hc.HostName != "" {
			h.Host = hc.HostName
		}
		if h.User == "" {
			h.User = hc.User
		}
		if h.Port == 0 {
			h.Port = hc.Port
		}
		if h.Port == 0 {
			h.Port = 22
		}
		hops = append(hops, h)
	}
	return hops, nil
}

// chainDialer makes the SSH connections of one Dial: to the jump hosts,
// if any, and to the node.
type chainDialer struct {
	// ctx is Dial's context; dialCtx is it with the connect timeout.
	ctx, dialCtx context.Context
	timeout      time.Duration
	known        *knownHosts
	noAgent      bool
}

// timedOut reports whether err, which ended a connect or handshake, came
// from the connect timeout: the deadline of the first connection may
// surface past a jump host as a closed connection, before dialCtx is done.
func (d *chainDialer) timedOut(err error) bool {
	deadline, _ := d.dialCtx.Deadline()
	return d.dialCtx.Err() != nil || isTimeout(err) || !time.Now().Before(deadline)
}

// handshake runs the SSH handshake as user with the server at addr
// (host:port) over conn, offering keys. It does not close conn on
// failure. A refused host key is a *HostKeyError.
func (d *chainDialer) handshake(conn net.Conn, addr string, remote net.Addr, user string, keys *keySet) (*ssh.Client, error) {
	var hostKeyErr *HostKeyError
	check := d.known.hostKeyCallback()
	sshCfg := &ssh.ClientConfig{
		User: user,
		Auth: []ssh.AuthMethod{ssh.PublicKeysCallback(func() ([]ssh.Signer, error) {
			return keys.signers, nil
		})},
		HostKeyCallback: func(hostport string, _ net.Addr, key ssh.PublicKey) error {
			err := check(hostport, remote, key)
			if !errors.As(err, &hostKeyErr) {
				hostKeyErr = nil
			}
			return err
		},
		HostKeyAlgorithms: d.known.algorithms(addr, remote),
		ClientVersion:     "SSH-2.0-gptui",
	}
	sc, chans, reqs, err := ssh.NewClientConn(conn, addr, sshCfg)
	if err != nil {
		switch {
		case hostKeyErr != nil:
			return nil, hostKeyErr
		case d.ctx.Err() != nil:
			return nil, fmt.Errorf("ssh %s: %w", addr, d.ctx.Err())
		case d.timedOut(err):
			return nil, fmt.Errorf("ssh %s: handshake timed out after %v (is an SSH server listening there?)", addr, d.timeout)
		case strings.Contains(err.Error(), "unable to authenticate"):
			return nil, fmt.Errorf("ssh %s@%s: login refused; offered %s: %w", user, addr, keys.describe(), err)
		}
		return nil, fmt.Errorf("ssh %s: %w", addr, err)
	}
	return ssh.NewClient(sc, chans, reqs), nil
}

// hop logs in to the jump host h over conn, with its own keys when its
// configuration names some that exist, else with the node's.
func (d *chainDialer) hop(conn net.Conn, h JumpHost, nodeKeys *keySet) (*ssh.Client, error) {
	user := h.User
	if user == "" {
		u, err := currentUser()
		if err != nil {
			return nil, err
		}
		user = u
	}
	keys := nodeKeys
	var own []string
	for _, f := range h.IdentityFiles {
		if _, err := os.Stat(f); err == nil {
			own = append(own, f)
		}
	}
	if len(own) > 0 {
		ks, err := loadKeys(ClientConfig{IdentityFiles: own, NoAgent: d.noAgent, ConnectTimeout: d.timeout})
		if err != nil {
			return nil, fmt.Errorf("ssh %s@%s: %w", user, h.addr(), err)
		}
		defer ks.close()
		keys = ks
	}
	return d.handshake(conn, h.addr(), hopAddr(conn, h.addr()), user, keys)
}

// through opens a connection from the jump host's client c to addr
// (host:port), for the next hop or the node.
func (d *chainDialer) through(c *ssh.Client, addr string) (net.Conn, error) {
	conn, err := c.DialContext(d.dialCtx, "tcp", addr)
	if err != nil {
		switch {
		case d.ctx.Err() != nil:
			return nil, fmt.Errorf("connect to %s: %w", addr, d.ctx.Err())
		case d.timedOut(err):
			return nil, fmt.Errorf("connect to %s: timed out after %v", addr, d.timeout)
		}
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	return &jumpConn{Conn: conn, remote: hopAddr(conn, addr)}, nil
}

// jumpConn is a connection forwarded by a jump host, whose remote end is
// the address it was opened to (the SSH library gives it a zero one).
type jumpConn struct {
	net.Conn
	remote net.Addr
}

// RemoteAddr returns the address the connection was opened to.
func (c *jumpConn) RemoteAddr() net.Addr { return c.remote }

// hopAddr returns the remote address of a connection to addr for the host
// key check, which wants a *net.TCPAddr: conn's own for a direct
// connection; for a forwarded one, addr when its host is an IP address,
// else the zero address (known_hosts is then searched by the name alone).
func hopAddr(conn net.Conn, addr string) net.Addr {
	if _, ok := conn.(*net.TCPConn); ok {
		return conn.RemoteAddr()
	}
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		return net.TCPAddrFromAddrPort(ap)
	}
	return &net.TCPAddr{IP: net.IPv4zero}
}

// nodeAddr returns the address of the node that client reached through
// jump hosts at addr (host:port): addr itself when its host is an IP
// address; else the address the node took the connection on, from its
// SSH_CONNECTION (the jump host resolved the name, which this machine
// may not be able to), or, failing that, the name itself.
func nodeAddr(ctx context.Context, client *ssh.Client, addr string) net.Addr {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		return net.TCPAddrFromAddrPort(ap)
	}
	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := client.NewSession()
		if err != nil {
			done <- result{nil, err}
			return
		}
		out, err := s.Output("echo $SSH_CONNECTION")
		s.Close()
		done <- result{out, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		return hostAddr(addr)
	}
	// "client_ip client_port server_ip server_port"
	f := strings.Fields(string(r.out))
	if r.err != nil || len(f) != 4 {
		return hostAddr(addr)
	}
	ip, err := netip.ParseAddr(f[2])
	port, perr := strconv.Atoi(f[3])
	if err != nil || perr != nil || port < 1 || port > 65535 {
		return hostAddr(addr)
	}
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(ip.Unmap(), uint16(port)))
}

// hostAddr is a TCP address of a host name that is not resolved here.
type hostAddr string

// Network returns "tcp".
func (hostAddr) Network() string { return "tcp" }

// String returns the address as host:port.
func (a hostAddr) String() string { return string(a) }
