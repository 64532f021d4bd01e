package sshtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// StarNet is a network of Linux network namespaces for the tests of
// relayed pushes: the nodes' addresses all in one namespace, which the
// test's namespace (the head, the launcher) reaches through one veth pair,
// the head's link. ShapeHead limits that link with tc, as a head's uplink
// is slower than the cluster's own network; the nodes reach each other
// inside their namespace (its loopback), unshaped unless ShapeNodes says
// otherwise. Start a node's sshd with StartIn(t, s.NS, s.Nodes[i]), or
// all of them with StartNodes. Nothing outside this machine is involved.
type StarNet struct {
	// NS is the nodes' namespace, for ip netns.
	NS string
	// Nodes are the nodes' addresses in NS: 198.19.X.2 onwards of a /24
	// of 198.19.0.0/16 (RFC 2544's range for tests) that this machine has
	// no address in; the head's end of the link is 198.19.X.1.
	Nodes []string
	// HeadLink is the head's end of the link: an interface of the test's
	// namespace.
	HeadLink string
}

// NewStarNet makes a StarNet of n nodes and registers its removal (the
// namespace, and with it the veth pair and the qdiscs) with t.Cleanup;
// start the servers in it after it, so that they stop first. The names
// are unique to this process (its pid) and to the StarNets it has. The
// test is skipped, saying why, unless it runs as root on a system with ip
// netns.
func NewStarNet(t testing.TB, n int) *StarNet {
	t.Helper()
	needNetns(t)
	if n < 1 || n > 250 {
		t.Fatalf("sshtest: NewStarNet(%d): 1 to 250 nodes", n)
	}
	must := func(args ...string) { t.Helper(); mustIP(t, args...) }
	pid := os.Getpid()
	var s *StarNet
	var prefix string
	for k := 0; ; k++ {
		if k == 100 {
			t.Fatalf("sshtest: no free network namespace name gptui-%d-K-star for K below 100", pid)
		}
		// 198.19.0.0/24 is JumpNet's, 198.19.1-200 NodeNet's, 198.19.250 the dead ends'.
		x := 201 + (pid+7919*k)%48
		p := fmt.Sprintf("198.19.%d", x)
		if out, err := ipOut("-4", "-o", "addr", "show", "to", p+".0/24"); err != nil || out != "" {
			continue
		}
		ns := fmt.Sprintf("gptui-%d-%d-star", pid, k)
		if _, err := ipOut("netns", "add", ns); err != nil {
			continue // taken, most likely: try the next name
		}
		s, prefix = &StarNet{NS: ns, HeadLink: fmt.Sprintf("gs%dx%d", pid, k)}, p
		t.Cleanup(func() {
			ipOut("link", "del", s.HeadLink) // gone with the namespace, normally
			ipOut("netns", "del", ns)
		})
		break
	}
	for i := range n {
		s.Nodes = append(s.Nodes, fmt.Sprintf("%s.%d", prefix, i+2))
	}
	must("-n", s.NS, "link", "set", "lo", "up")
	must("link", "add", s.HeadLink, "type", "veth", "peer", "name", "eth0", "netns", s.NS)
	must("addr", "add", prefix+".1/24", "dev", s.HeadLink)
	must("link", "set", s.HeadLink, "up")
	for _, a := range s.Nodes {
		must("-n", s.NS, "addr", "add", a+"/24", "dev", "eth0")
	}
	must("-n", s.NS, "link", "set", "eth0", "up")
	return s
}

// ShapeHead limits the head's link to rate (as tc takes it: "100mbit")
// each way: a token bucket (tbf) on the head's end and on the nodes'.
func (s *StarNet) ShapeHead(t testing.TB, rate string) {
	t.Helper()
	s.tbf(t, nil, s.HeadLink, rate)
	s.tbf(t, []string{"ip", "netns", "exec", s.NS}, "eth0", rate)
}

// ShapeNodes limits the traffic between the nodes, over their
// namespace's loopback, to rate.
func (s *StarNet) ShapeNodes(t testing.TB, rate string) {
	t.Helper()
	s.tbf(t, []string{"ip", "netns", "exec", s.NS}, "lo", rate)
}

// tbf puts a tbf qdisc of rate on dev, running tc after prefix (a
// namespace's ip netns exec); it goes with its interface.
func (s *StarNet) tbf(t testing.TB, prefix []string, dev, rate string) {
	t.Helper()
	if _, err := exec.LookPath("tc"); err != nil {
		t.Skipf("sshtest: tc (iproute2) not found, no shaped links: %v", err)
	}
	// A burst of 256 KiB keeps the rate at 1 Gbit/s and below on a
	// kernel ticking at 250 Hz; packets wait up to 100 ms.
	args := slices.Concat(prefix, []string{"tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", "256kb", "latency", "100ms"})
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Skipf("sshtest: %s: %v: %s (no tbf qdisc here?)", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() {
		del := slices.Concat(prefix, []string{"tc", "qdisc", "del", "dev", dev, "root"})
		exec.Command(del[0], del[1:]...).Run()
	})
}

// HeadTxBytes returns how many bytes the head has sent over its link
// (the kernel's count for HeadLink).
func (s *StarNet) HeadTxBytes(t testing.TB) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/class/net", s.HeadLink, "statistics", "tx_bytes"))
	if err != nil {
		t.Fatalf("sshtest: %v", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("sshtest: tx_bytes of %s: %v", s.HeadLink, err)
	}
	return n
}

// StartNodes starts an sshd on each node (StartIn) and writes the
// inventory dir/hosts.txt, as the function StartNodes does for loopback
// nodes: each node with devices, the workdir dir/nodeI and its user key.
func (s *StarNet) StartNodes(t testing.TB, dir, devices string) *Nodes {
	t.Helper()
	n := &Nodes{Hosts: filepath.Join(dir, "hosts.txt")}
	var inv strings.Builder
	for i, addr := range s.Nodes {
		srv := StartIn(t, s.NS, addr)
		wd := filepath.Join(dir, fmt.Sprintf("node%d", i))
		n.Servers = append(n.Servers, srv)
		n.Workdirs = append(n.Workdirs, wd)
		fmt.Fprintf(&inv, "%s@%s:%d devices=%s workdir=%s identity=%s\n", srv.User, addr, srv.Port, devices, wd, srv.UserKeyFile)
	}
	if err := os.WriteFile(n.Hosts, []byte(inv.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return n
}
