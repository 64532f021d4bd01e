package sshexec

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gptui/gptui/internal/sshtest"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// The tests of Dial through jump hosts run sshd servers on loopback
// addresses; cmd/gptui's TestRunHostsJump puts the nodes where only a
// bastion reaches them.

// jumpVia returns the jump host srv, logging in with its own user key.
func jumpVia(srv *sshtest.Server) JumpHost {
	return JumpHost{Name: srv.Addr, Host: srv.Addr, Port: srv.Port, IdentityFiles: []string{srv.UserKeyFile}}
}

// knownHostsOf writes a known_hosts file that knows servers.
func knownHostsOf(t *testing.T, servers ...*sshtest.Server) string {
	t.Helper()
	kh := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(kh, []byte(sshtest.KnownHosts(servers...)), 0o600); err != nil {
		t.Fatal(err)
	}
	return kh
}

// TestDialJump: a node reached through a chain of two jump hosts, each
// logged in to with its own key, runs commands; the node's address is the
// one dialed; closing the client closes the jump hosts' connections.
func TestDialJump(t *testing.T) {
	t.Parallel()
	b1 := sshtest.Start(t, "127.0.0.2")
	b2 := sshtest.Start(t, "127.0.0.3")
	node, cfg := startNode(t, "127.0.0.3")
	cfg.KnownHostsFile = knownHostsOf(t, b1, b2, node)
	cfg.Jump = []JumpHost{jumpVia(b1), jumpVia(b2)}

	c := dial(t, node, cfg)
	var out bytes.Buffer
	if code, err := c.Run(context.Background(), "echo $SSH_CONNECTION", &out, nil); code != 0 || err != nil {
		t.Fatalf("Run: exit %d, %v", code, err)
	}
	// "client_ip client_port server_ip server_port"
	if f := strings.Fields(out.String()); len(f) != 4 || f[2] != node.Addr || f[3] != strconv.Itoa(node.Port) {
		t.Errorf("SSH_CONNECTION on the node = %q, want the connection to %s", out.String(), node.HostPort())
	}
	if got := c.RemoteAddr().String(); got != node.HostPort() {
		t.Errorf("RemoteAddr = %s, want %s", got, node.HostPort())
	}
	if got := c.Addr(); got != node.HostPort() {
		t.Errorf("Addr = %s, want %s", got, node.HostPort())
	}
	for _, b := range []*sshtest.Server{b1, b2} {
		if !strings.Contains(b.Log(), "Accepted publickey for "+b.User) {
			t.Errorf("jump host %s logged no login:\n%s", b.HostPort(), b.Log())
		}
	}
	if len(c.hops) != 2 {
		t.Fatalf("%d jump host clients, want 2", len(c.hops))
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	for i, h := range c.hops {
		done := make(chan error, 1)
		go func() { done <- h.Wait() }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Errorf("jump host %d's connection still open 5 s after Close", i)
		}
	}
}

// TestDialJumpByName: a node named by a host name that the jump host
// resolves; RemoteAddr is the address the node took the connection on.
func TestDialJumpByName(t *testing.T) {
	t.Parallel()
	b := sshtest.Start(t, "127.0.0.2")
	node, cfg := startNode(t, "127.0.0.1")
	name := net.JoinHostPort("localhost", strconv.Itoa(node.Port))
	kh := filepath.Join(t.TempDir(), "known_hosts")
	lines := b.KnownHostsLine() + "\n" + knownhosts.Line([]string{name}, node.HostKey) + "\n"
	if err := os.WriteFile(kh, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.KnownHostsFile = kh
	// The node's key is good for the jump host too.
	cfg.IdentityFiles = []string{node.UserKeyFile, b.UserKeyFile}
	cfg.Jump = []JumpHost{{Name: "bastion", Host: b.Addr, Port: b.Port}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, "localhost", node.Port, cfg)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer c.Close()
	if got := c.RemoteAddr().String(); got != node.HostPort() {
		t.Errorf("RemoteAddr = %s, want %s (from the node's SSH_CONNECTION)", got, node.HostPort())
	}
	if got := c.Addr(); got != name {
		t.Errorf("Addr = %s, want %s", got, name)
	}
}

// TestDialJumpHostKeys: a jump host's key is checked as a node's: unknown,
// it is refused naming the jump host; accepted, it is recorded with the
// node's. A node's changed key behind a jump host is the node's error.
func TestDialJumpHostKeys(t *testing.T) {
	t.Parallel()
	b := sshtest.Start(t, "127.0.0.2")
	node, cfg := startNode(t, "127.0.0.3")
	cfg.Jump = []JumpHost{jumpVia(b)}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// The file knows the node but not the jump host.
	_, err := Dial(ctx, node.Addr, node.Port, cfg)
	var hk *HostKeyError
	if !errors.As(err, &hk) || hk.Kind != HostKeyUnknown || hk.Host != b.HostPort() || hk.Fingerprint != ssh.FingerprintSHA256(b.HostKey) {
		t.Fatalf("Dial with the jump host unknown: %v (%#v)", err, hk)
	}
	want := "via jump host " + b.HostPort() + ": unknown host key for " + b.HostPort()
	if !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %q does not start with %q", err, want)
	}
	if strings.Contains(node.Log(), "Accepted publickey") {
		t.Errorf("the node was logged in to past an unknown jump host")
	}

	// Trust on first use records both.
	cfg.KnownHostsFile = filepath.Join(t.TempDir(), "known_hosts")
	cfg.AcceptNewHostKeys = true
	c, err := Dial(ctx, node.Addr, node.Port, cfg)
	if err != nil {
		t.Fatalf("Dial accepting new keys: %v", err)
	}
	c.Close()
	known, _ := os.ReadFile(cfg.KnownHostsFile)
	for _, s := range []*sshtest.Server{b, node} {
		if !strings.Contains(string(known), s.KnownHostsLine()) && !strings.Contains(string(known), knownhosts.Line([]string{s.HostPort()}, s.HostKey)) {
			t.Errorf("known_hosts lacks %s:\n%s", s.HostPort(), known)
		}
	}
	cfg.AcceptNewHostKeys = false
	c, err = Dial(ctx, node.Addr, node.Port, cfg)
	if err != nil {
		t.Fatalf("Dial with the recorded keys: %v", err)
	}
	c.Close()

	// A fingerprint a person accepted is accepted for the jump host too.
	cfg.KnownHostsFile = knownHostsOf(t, node)
	cfg.AcceptHostKey = ssh.FingerprintSHA256(b.HostKey)
	if c, err = Dial(ctx, node.Addr, node.Port, cfg); err != nil {
		t.Fatalf("Dial with the jump host's fingerprint accepted: %v", err)
	}
	c.Close()
	cfg.AcceptHostKey = ""

	// The node reinstalled: its own error, not the jump host's.
	node.RotateHostKey(t)
	_, err = Dial(ctx, node.Addr, node.Port, cfg)
	if !errors.As(err, &hk) || hk.Kind != HostKeyChanged || hk.Host != node.HostPort() {
		t.Fatalf("Dial to a changed node: %v", err)
	}
	if strings.Contains(err.Error(), "via jump host") {
		t.Errorf("the node's changed key is blamed on the jump host: %v", err)
	}
}

// TestDialJumpErrors: what fails on the way is named with the jump host
// it failed at; the connect timeout and ctx bound the whole chain, also
// past a jump host, whose forwarded connections have no deadlines.
func TestDialJumpErrors(t *testing.T) {
	t.Parallel()
	b := sshtest.Start(t, "127.0.0.2")
	node, cfg := startNode(t, "127.0.0.3")
	cfg.KnownHostsFile = knownHostsOf(t, b, node)
	hop := jumpVia(b)
	via := "via jump host " + b.HostPort() + ": "

	// A listener that accepts and says nothing: no SSH server.
	silent, err := net.Listen("tcp", "127.0.0.3:0")
	if err != nil {
		t.Fatal(err)
	}
	// The subtests run after this function returns: t.Cleanup, not defer.
	t.Cleanup(func() { silent.Close() })
	accepted := make(chan struct{}, 16)
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	silentHost, silentPort, _ := net.SplitHostPort(silent.Addr().String())
	sp, _ := strconv.Atoi(silentPort)
	closed, err := net.Listen("tcp", "127.0.0.3:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := closed.Addr().(*net.TCPAddr).Port
	closed.Close()
	hung := unreachable(t)
	hungHost, hungPort, _ := net.SplitHostPort(hung)
	hp, _ := strconv.Atoi(hungPort)

	// loggedIn returns a while after the jump host's next login.
	loggedIn := func() {
		logins := strings.Count(b.Log(), "Accepted publickey")
		for deadline := time.Now().Add(10 * time.Second); strings.Count(b.Log(), "Accepted publickey") == logins && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(time.Second)
	}
	noOwnKey := hop
	noOwnKey.IdentityFiles = nil
	missingKey := hop
	missingKey.IdentityFiles = []string{filepath.Join(t.TempDir(), "absent")}
	for _, tc := range []struct {
		name    string
		jump    []JumpHost
		host    string
		port    int
		timeout time.Duration
		// cancel, if set, returns once Dial is past the jump host, and
		// ctx is cancelled then.
		cancel func()
		want   []string
		within time.Duration
	}{
		{"node refuses", []JumpHost{hop}, "127.0.0.3", closedPort, 5 * time.Second, nil,
			[]string{via + "connect to 127.0.0.3:" + strconv.Itoa(closedPort) + ": ", "Connection refused"}, 5 * time.Second},
		{"jump host refuses the login", []JumpHost{noOwnKey}, node.Addr, node.Port, 5 * time.Second, nil,
			[]string{via + "ssh " + node.User + "@" + b.HostPort() + ": login refused; offered ssh-ed25519"}, 5 * time.Second},
		{"jump host's own keys missing: the node's are offered", []JumpHost{missingKey}, node.Addr, node.Port, 5 * time.Second, nil,
			[]string{via + "ssh " + node.User + "@" + b.HostPort() + ": login refused; offered ssh-ed25519"}, 5 * time.Second},
		{"jump host unreachable", []JumpHost{{Name: hungHost, Host: hungHost, Port: hp}}, node.Addr, node.Port, 500 * time.Millisecond, nil,
			[]string{"via jump host " + hung + ": connect to " + hung + ": timed out after 500ms"}, 3 * time.Second},
		{"jump host no SSH server", []JumpHost{{Name: silentHost, Host: silentHost, Port: sp}}, node.Addr, node.Port, 500 * time.Millisecond, nil,
			[]string{"via jump host " + silent.Addr().String() + ": ssh " + silent.Addr().String() + ": handshake timed out after 500ms"}, 3 * time.Second},
		{"node no SSH server", []JumpHost{hop}, silentHost, sp, time.Second, nil,
			[]string{"ssh " + silent.Addr().String() + ": handshake timed out after 1s"}, 4 * time.Second},
		{"node unreachable, cancelled", []JumpHost{hop}, hungHost, hp, 30 * time.Second, loggedIn,
			[]string{via + "connect to " + hung + ": context canceled"}, 10 * time.Second},
		{"node no SSH server, cancelled", []JumpHost{hop}, silentHost, sp, 30 * time.Second, func() { <-accepted; time.Sleep(300 * time.Millisecond) },
			[]string{"ssh " + silent.Addr().String() + ": context canceled"}, 10 * time.Second},
		{"second jump host unreachable, timed out", []JumpHost{hop, {Name: hungHost, Host: hungHost, Port: hp}}, node.Addr, node.Port, time.Second, nil,
			[]string{via + "connect to " + hung + ": timed out after 1s"}, 4 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := cfg
			cfg.Jump, cfg.ConnectTimeout = tc.jump, tc.timeout
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cancelled := make(chan time.Time, 1)
			if tc.cancel != nil {
				// Alone (the parallel subtests wait until these are
				// done), so that the jump host's next login and the
				// listener's next connection are ours: cancel while the
				// node is being reached past the jump host.
				go func() {
					tc.cancel()
					cancelled <- time.Now()
					cancel()
				}()
			} else {
				t.Parallel()
			}
			start := time.Now()
			c, err := Dial(ctx, tc.host, tc.port, cfg)
			took := time.Since(start)
			if tc.cancel != nil {
				if after := time.Since(<-cancelled); after > time.Second {
					t.Errorf("Dial returned %v after the cancel", after)
				}
			}
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q is more than one line", err)
			}
			if tc.cancel != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("error %v is not context.Canceled", err)
			}
			if took > tc.within {
				t.Errorf("Dial took %v, want at most %v", took, tc.within)
			}
			t.Logf("%v: %v", took.Round(time.Millisecond), err)
		})
	}
}

func TestParseJump(t *testing.T) {
	cfg := testConfig(t)
	for _, tc := range []struct {
		in   string
		want []JumpHost
	}{
		{"none", nil},
		{"NONE", nil},
		{"b", []JumpHost{{Name: "b", Host: "b", Port: 22}}},
		{"u@b:2022", []JumpHost{{Name: "b", Host: "b", User: "u", Port: 2022}}},
		{"ssh://u@b:2022", []JumpHost{{Name: "b", Host: "b", User: "u", Port: 2022}}},
		{"[fe80::1]:23,10.0.0.1", []JumpHost{{Name: "fe80::1", Host: "fe80::1", Port: 23}, {Name: "10.0.0.1", Host: "10.0.0.1", Port: 22}}},
		// A jump host's name is looked up in the ssh configuration; its
		// own ProxyJump (bastion) is not followed.
		{"gpu7,me@alias-of-gpu1", []JumpHost{
			{Name: "gpu7", Host: "gpu7.cluster", User: "ops", Port: 2200, IdentityFiles: []string{"/home/me/.ssh/cluster"}},
			{Name: "alias-of-gpu1", Host: "gpu1.cluster", User: "me", Port: 2200},
		}},
	} {
		got, err := ParseJump(tc.in, cfg)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseJump(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"", "an empty jump host; separate [user@]host[:port] items with single commas"},
		{"a,,b", "an empty jump host; separate [user@]host[:port] items with single commas"},
		{"a,", "an empty jump host; separate [user@]host[:port] items with single commas"},
		{"a:0", `port "0" is not a port number (1-65535)`},
		{"a b", `"a b" is not a host name or address`},
		{"-oProxyCommand=x", `"-oProxyCommand=x" is not a host name or address`},
		{"ssh://", "an empty jump host; separate [user@]host[:port] items with single commas"},
	} {
		if got, err := ParseJump(tc.in, cfg); err == nil || err.Error() != tc.want {
			t.Errorf("ParseJump(%q) = %+v, %v; want error %q", tc.in, got, err, tc.want)
		}
	}
	if s := (JumpHost{Name: "fe80::1", User: "u", Port: 2}).String(); s != "u@[fe80::1]:2" {
		t.Errorf("String = %q", s)
	}
}

// TestParseInventoryJump: jump= and ProxyJump from the ssh configuration
// become the node's Jump; jump= comes first, and jump=none drops
// ProxyJump; a jump host makes a loopback address a node over SSH.
func TestParseInventoryJump(t *testing.T) {
	bastion := []JumpHost{{Name: "bastion", Host: "bastion", Port: 22}}
	chain := []JumpHost{{Name: "b1", Host: "b1", User: "me", Port: 2022}, {Name: "gpu7", Host: "gpu7.cluster", User: "ops", Port: 2200, IdentityFiles: []string{"/home/me/.ssh/cluster"}}}
	in := "n1 jump=me@b1:2022,gpu7 devices=cpu:1\ngpu1 jump=none\ngpu2\n127.0.0.2 jump=bastion workdir=/w\n"
	got, err := ParseInventory("hosts.txt", strings.NewReader(in), testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	want := []Node{
		{Name: "n1", Host: "n1", Port: 22, Devices: Devices{CPU: 1}, Workdir: DefaultWorkdir, Jump: chain, Line: 1},
		{Name: "gpu1", Host: "gpu1.cluster", User: "ops", Port: 2200, Workdir: DefaultWorkdir, Identity: "/home/me/.ssh/cluster", Line: 2},
		{Name: "gpu2", Host: "gpu2.cluster", User: "ops", Port: 2200, Workdir: DefaultWorkdir, Identity: "/home/me/.ssh/cluster", Jump: bastion, Line: 3},
		{Name: "127.0.0.2", Host: "127.0.0.2", Port: 22, Workdir: "/w", Jump: bastion, Line: 4},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseInventory =\n%s\nwant\n%s", dumpNodes(got), dumpNodes(want))
	}

	for _, tc := range []struct{ in, want string }{
		{"a jump=b,,c", `hosts.txt:1: jump "b,,c": an empty jump host; separate [user@]host[:port] items with single commas; write jump=[user@]host[:port], a comma-separated list for a chain`},
		{"a\nb jump=c:99999", `hosts.txt:2: jump "c:99999": port "99999" is not a port number (1-65535); write jump=[user@]host[:port], a comma-separated list for a chain`},
		{"a jump=b;c", `hosts.txt:1: jump "b;c": "b;c" is not a host name or address; write jump=[user@]host[:port], a comma-separated list for a chain`},
		{"a jump=", `hosts.txt:1: jump: empty value`},
		{"a jump=b jump=c", `hosts.txt:1: jump is given twice`},
		{"a jump=b ssh=false", `hosts.txt:1: ssh=false with jump=: a node reached through a jump host is reached over SSH`},
	} {
		_, err := ParseInventory("hosts.txt", strings.NewReader(tc.in), testConfig(t))
		if err == nil || err.Error() != tc.want {
			t.Errorf("ParseInventory(%q) error\n got %v\nwant %s", tc.in, err, tc.want)
		}
	}

	// A bad ProxyJump is the ssh configuration's mistake, with its place,
	// for the nodes that use it.
	cfg, err := ParseSSHConfig("/home/me/.ssh/config", strings.NewReader("Host good\n  ProxyJump b\n\nHost bad*\n  User x\n  ProxyJump b:port\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseInventory("hosts.txt", strings.NewReader("good\nother\n"), cfg); err != nil {
		t.Errorf("an unused bad ProxyJump: %v", err)
	}
	_, err = ParseInventory("hosts.txt", strings.NewReader("good\nbad1\n"), cfg)
	wantErr := `/home/me/.ssh/config:6: ProxyJump "b:port" (for bad1 on hosts.txt:2): port "port" is not a port number (1-65535); write [user@]host[:port], a comma-separated list for a chain`
	var ie *InventoryError
	if err == nil || err.Error() != wantErr || !errors.As(err, &ie) || ie.File != "/home/me/.ssh/config" || ie.Line != 6 {
		t.Errorf("bad ProxyJump: %v\nwant %s", err, wantErr)
	}
	// jump= overrides it.
	if _, err := ParseInventory("hosts.txt", strings.NewReader("bad1 jump=none\nbad2 jump=b\n"), cfg); err != nil {
		t.Errorf("jump= over a bad ProxyJump: %v", err)
	}
}

// TestJumpDocs: the inventory and ssh configuration of docs/runner.md's
// "Nodes behind a login host" read as it says.
func TestJumpDocs(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "runner.md"))
	if err != nil {
		t.Fatal(err)
	}
	// block returns the fenced block that starts with the line first.
	block := func(first string) string {
		_, rest, ok := strings.Cut(string(doc), "```text\n"+first+"\n")
		body, _, closed := strings.Cut(rest, "```")
		if !ok || !closed {
			t.Fatalf("docs/runner.md has no block starting %q", first)
		}
		return body
	}
	cfg, err := ParseSSHConfig("config", strings.NewReader(block("# ~/.ssh/config")))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Home = "/home/alice"
	nodes, err := ParseInventory("hosts.txt", strings.NewReader(block("# hosts.txt")), cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]JumpHost{
		{{Name: "login.example.org", Host: "login.example.org", User: "alice", Port: 22}},
		{{Name: "login.example.org", Host: "login.example.org", Port: 2222}, {Name: "10.1.0.1", Host: "10.1.0.1", Port: 22}},
		{{Name: "login", Host: "login.example.org", User: "alice", Port: 22, IdentityFiles: []string{"/home/alice/.ssh/login"}}},
	}
	if len(nodes) != len(want) {
		t.Fatalf("%d nodes, want %d", len(nodes), len(want))
	}
	for i, n := range nodes {
		if !reflect.DeepEqual(n.Jump, want[i]) {
			t.Errorf("%s: Jump %+v, want %+v", n.Name, n.Jump, want[i])
		}
	}
	if nodes[2].Host != "gpu2.cluster.internal" {
		t.Errorf("gpu2's Host = %q", nodes[2].Host)
	}
}
