package sshtest

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
)

// JumpNet is a network of Linux network namespaces for the tests of nodes
// behind a bastion (a jump host): the bastion's namespace, linked to the
// test's own by a veth pair, and the nodes' namespace, linked by another
// to the bastion's alone. The test's namespace has no route to the
// nodes, and the bastion forwards no packets: only SSH through the
// bastion reaches them. The nodes, all in one namespace, reach each other.
// Nothing outside this machine is involved.
type JumpNet struct {
	// BastionNS and NodesNS are the namespaces' names, for ip netns.
	BastionNS, NodesNS string
	// Bastion is the bastion's address on the link to the test's
	// namespace, in 198.18.0.0/16 (RFC 2544's range for tests).
	Bastion string
	// Nodes are the nodes' addresses in NodesNS, 198.19.0.2 onwards.
	Nodes []string
}

// NewJumpNet makes a JumpNet of n nodes and registers its removal (the
// namespaces, the veth pairs and /etc/netns/BastionNS) with t.Cleanup;
// start the servers in it (StartIn) after it, so that they stop first.
// The names are unique to this process (its pid) and to the JumpNets it
// has. The test is skipped, saying why, unless it runs as root on a
// system with ip netns.
func NewJumpNet(t testing.TB, n int) *JumpNet {
	t.Helper()
	needNetns(t)
	if n < 1 || n > 250 {
		t.Fatalf("sshtest: NewJumpNet(%d): 1 to 250 nodes", n)
	}
	pid := os.Getpid()
	var j *JumpNet
	var veth, root string // the test's namespace's end of the bastion's link, its address
	madeEtc := false      // /etc/netns is this JumpNet's
	for k := 0; ; k++ {
		if k == 100 {
			t.Fatalf("sshtest: no free network namespace name gptui-%d-K-bastion for K below 100", pid)
		}
		// A /30 of 198.18.0.0/16 per pid and k; taken ones are skipped.
		o := (pid + 7919*k) % 16384 * 4
		subnet := fmt.Sprintf("198.18.%d.%d", o>>8, o&255)
		if out, err := ipOut("-4", "-o", "addr", "show", "to", subnet+"/30"); err != nil || out != "" {
			continue
		}
		cand := &JumpNet{
			BastionNS: fmt.Sprintf("gptui-%d-%d-bastion", pid, k),
			NodesNS:   fmt.Sprintf("gptui-%d-%d-nodes", pid, k),
			Bastion:   fmt.Sprintf("198.18.%d.%d", o>>8, o&255+2),
		}
		if _, err := ipOut("netns", "add", cand.BastionNS); err != nil {
			continue // taken, most likely: try the next name
		}
		j, veth, root = cand, fmt.Sprintf("gj%dx%d", pid, k), fmt.Sprintf("198.18.%d.%d", o>>8, o&255+1)
		t.Cleanup(func() {
			ipOut("link", "del", veth) // gone with the namespace, normally
			ipOut("netns", "del", j.BastionNS)
			os.RemoveAll(filepath.Join("/etc/netns", j.BastionNS))
			if madeEtc {
				os.Remove("/etc/netns") // unless another's is there now
			}
		})
		break
	}
	for i := range n {
		j.Nodes = append(j.Nodes, fmt.Sprintf("198.19.0.%d", i+2))
	}
	must := func(args ...string) { t.Helper(); mustIP(t, args...) }
	must("netns", "add", j.NodesNS)
	t.Cleanup(func() { ipOut("netns", "del", j.NodesNS) })

	// The test's namespace and the bastion's.
	must("link", "add", veth, "type", "veth", "peer", "name", "up0", "netns", j.BastionNS)
	must("addr", "add", root+"/30", "dev", veth)
	must("link", "set", veth, "up")
	// The bastion's and the nodes'.
	must("link", "add", "down0", "netns", j.BastionNS, "type", "veth", "peer", "name", "eth0", "netns", j.NodesNS)
	for _, ns := range []string{j.BastionNS, j.NodesNS} {
		must("-n", ns, "link", "set", "lo", "up")
		// No routing between the links, whatever the default.
		if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=0").CombinedOutput(); err != nil {
			t.Fatalf("sshtest: ip_forward=0 in %s: %v: %s", ns, err, out)
		}
	}
	must("-n", j.BastionNS, "addr", "add", j.Bastion+"/30", "dev", "up0")
	must("-n", j.BastionNS, "link", "set", "up0", "up")
	must("-n", j.BastionNS, "addr", "add", "198.19.0.1/24", "dev", "down0")
	must("-n", j.BastionNS, "link", "set", "down0", "up")
	for _, a := range j.Nodes {
		must("-n", j.NodesNS, "addr", "add", a+"/24", "dev", "eth0")
	}
	must("-n", j.NodesNS, "link", "set", "eth0", "up")

	// Names of the nodes that only the bastion resolves: ip netns exec
	// mounts /etc/netns/NS/hosts over /etc/hosts.
	etc := filepath.Join("/etc/netns", j.BastionNS)
	_, err := os.Stat("/etc/netns")
	madeEtc = err != nil
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatalf("sshtest: %v", err)
	}
	hosts := "127.0.0.1 localhost\n"
	for i, a := range j.Nodes {
		hosts += a + " " + j.NodeName(i) + "\n"
	}
	if err := os.WriteFile(filepath.Join(etc, "hosts"), []byte(hosts), 0o644); err != nil {
		t.Fatalf("sshtest: %v", err)
	}
	return j
}

// NodeName returns a host name of node i that resolves to Nodes[i] in the
// bastion's namespace and nowhere else.
func (j *JumpNet) NodeName(i int) string {
	return fmt.Sprintf("node%d.%s", i, j.BastionNS)
}

// needNetns skips t, saying why, unless it runs as root on a system with
// ip netns.
func needNetns(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("sshtest: network namespaces (ip netns) need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skipf("sshtest: ip (iproute2) not found, no network namespaces: %v", err)
	}
	if out, err := exec.Command("ip", "netns", "list").CombinedOutput(); err != nil {
		t.Skipf("sshtest: ip netns is not available: %v: %s", err, strings.TrimSpace(string(out)))
	}
}

// mustIP runs ip with args and fails t with its output if it fails.
func mustIP(t testing.TB, args ...string) {
	t.Helper()
	if out, err := ipOut(args...); err != nil {
		t.Fatalf("sshtest: ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// ipOut runs ip with args and returns its output, trimmed.
func ipOut(args ...string) (string, error) {
	out, err := exec.Command("ip", args...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// StartIn starts sshd as Start does, but in the network namespace ns
// (ip netns exec) on port 22 of addr, an address of that namespace, and
// registers its shutdown with t.Cleanup. RotateHostKey and LimitFileSize
// are not for such a server.
func StartIn(t testing.TB, ns, addr string) *Server {
	t.Helper()
	if _, err := os.Stat(SSHD); err != nil {
		t.Skipf("sshtest: %s not found (install openssh-server to run this test): %v", SSHD, err)
	}
	u, err := user.Current()
	if err != nil {
		t.Fatalf("sshtest: current user: %v", err)
	}
	if os.Geteuid() == 0 {
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			t.Fatalf("sshtest: create privilege separation directory: %v", err)
		}
	}
	s := &Server{Addr: addr, Port: 22, User: u.Username, Dir: t.TempDir(), t: t, sshd: SSHD, ns: ns, log: &lockedBuffer{}}
	if err := s.writeUserKey(); err != nil {
		t.Fatalf("sshtest: %v", err)
	}
	if err := s.writeHostKeys(); err != nil {
		t.Fatalf("sshtest: %v", err)
	}
	if err := s.run(); err != nil {
		t.Fatalf("sshtest: sshd in %s on %s: %v", ns, addr, err)
	}
	t.Cleanup(s.Stop)
	return s
}
