package sshtest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// NodeNet is a network of Linux network namespaces for the tests of
// faults of one node: each node in a namespace of its own, with its own
// interfaces and firewall, its eth0 on a bridge in a hub namespace, which
// the test's namespace reaches through a veth pair. The test reaches
// every node, and the nodes reach each other, over their addresses on
// the bridge; nothing is routed, and nothing outside this machine is
// involved. Start a node's sshd with StartIn(t, NodeNS[i], Nodes[i]).
type NodeNet struct {
	// HubNS is the bridge's namespace; NodeNS[i] node i's.
	HubNS  string
	NodeNS []string
	// Nodes are the nodes' addresses, 198.19.X.2 onwards of a /24 of
	// 198.19.0.0/16 (RFC 2544's range for tests) that this machine has no
	// address in; the test's end of the link is 198.19.X.1.
	Nodes []string
}

// DeadEndAddr is the address of a node's dead-end bridge (NewNodeNet's
// deadEnd), in its namespace alone.
const DeadEndAddr = "198.19.250.1/24"

// NewNodeNet makes a NodeNet of n nodes and registers its removal (the
// namespaces, and with them the veth pairs and firewall rules) with
// t.Cleanup; start the servers in it after it, so that they stop first.
// If deadEnd is not "", each node also has a bridge of that name, up,
// with the address DeadEndAddr and nothing attached: a dead end, as a
// host's unused docker0 or virbr0 is, made before eth0 so that it comes
// first in the node's list of interfaces. The names are unique to this
// process (its pid) and to the NodeNets it has. The test is skipped,
// saying why, unless it runs as root on a system with ip netns.
func NewNodeNet(t testing.TB, n int, deadEnd string) *NodeNet {
	t.Helper()
	needNetns(t)
	if n < 1 || n > 200 {
		t.Fatalf("sshtest: NewNodeNet(%d): 1 to 200 nodes", n)
	}
	must := func(args ...string) { t.Helper(); mustIP(t, args...) }
	pid := os.Getpid()
	var nn *NodeNet
	var veth, prefix string
	for k := 0; ; k++ {
		if k == 100 {
			t.Fatalf("sshtest: no free network namespace name gptui-%d-K-hub for K below 100", pid)
		}
		x := (pid+7919*k)%200 + 1 // 198.19.0.0/24 is JumpNet's nodes', 198.19.250.0/24 the dead ends'
		p := fmt.Sprintf("198.19.%d", x)
		if out, err := ipOut("-4", "-o", "addr", "show", "to", p+".0/24"); err != nil || out != "" {
			continue
		}
		hub := fmt.Sprintf("gptui-%d-%d-hub", pid, k)
		if _, err := ipOut("netns", "add", hub); err != nil {
			continue // taken, most likely: try the next name
		}
		nn, veth, prefix = &NodeNet{HubNS: hub}, fmt.Sprintf("gn%dx%d", pid, k), p
		t.Cleanup(func() {
			ipOut("link", "del", veth) // gone with the namespace, normally
			ipOut("netns", "del", hub)
		})
		for i := range n {
			nn.NodeNS = append(nn.NodeNS, fmt.Sprintf("gptui-%d-%d-n%d", pid, k, i))
			nn.Nodes = append(nn.Nodes, fmt.Sprintf("%s.%d", prefix, i+2))
		}
		break
	}
	must("-n", nn.HubNS, "link", "set", "lo", "up")
	must("-n", nn.HubNS, "link", "add", "br0", "type", "bridge")
	must("-n", nn.HubNS, "link", "set", "br0", "up")
	// The test's namespace and the hub.
	must("link", "add", veth, "type", "veth", "peer", "name", "up0", "netns", nn.HubNS)
	must("addr", "add", prefix+".1/24", "dev", veth)
	must("link", "set", veth, "up")
	must("-n", nn.HubNS, "link", "set", "up0", "master", "br0")
	must("-n", nn.HubNS, "link", "set", "up0", "up")
	for i, ns := range nn.NodeNS {
		must("netns", "add", ns)
		t.Cleanup(func() { ipOut("netns", "del", ns) })
		must("-n", ns, "link", "set", "lo", "up")
		if deadEnd != "" {
			must("-n", ns, "link", "add", deadEnd, "type", "bridge")
			must("-n", ns, "addr", "add", DeadEndAddr, "dev", deadEnd)
			must("-n", ns, "link", "set", deadEnd, "up")
		}
		port := fmt.Sprintf("p%d", i)
		must("-n", nn.HubNS, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
		must("-n", nn.HubNS, "link", "set", port, "master", "br0")
		must("-n", nn.HubNS, "link", "set", port, "up")
		must("-n", ns, "addr", "add", nn.Nodes[i]+"/24", "dev", "eth0")
		must("-n", ns, "link", "set", "eth0", "up")
	}
	return nn
}

// Exec runs the command args in node i's network namespace and returns
// its output; a failure fails the test.
func (nn *NodeNet) Exec(t testing.TB, i int, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", nn.NodeNS[i]}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("sshtest: %s in %s: %v: %s", strings.Join(args, " "), nn.NodeNS[i], err, out)
	}
	return strings.TrimSpace(string(out))
}

// Mount mounts a file system of type fstype with options opts (as mount
// -t fstype -o opts) on target in the mount namespace of s, a server
// started with StartIn (ip netns exec gives it one of its own): the
// sessions s runs from then on see it, and nothing else does. The mount
// goes with the namespace when the server stops; t.Cleanup unmounts it
// before.
func (s *Server) Mount(t testing.TB, fstype, opts, target string) {
	t.Helper()
	pid := s.ownMountNS(t)
	if out, err := exec.Command("nsenter", "-t", pid, "-m", "mount", "-t", fstype, "-o", opts, fstype, target).CombinedOutput(); err != nil {
		t.Fatalf("sshtest: mount %s on %s for the server on %s: %v: %s", fstype, target, s.HostPort(), err, out)
	}
	t.Cleanup(func() { exec.Command("nsenter", "-t", pid, "-m", "umount", "-l", target).Run() })
}

// InMountNS runs the command args in the mount namespace of s, a server
// started with StartIn, as its sessions would see the files, and returns
// its combined output and error.
func (s *Server) InMountNS(t testing.TB, args ...string) ([]byte, error) {
	t.Helper()
	pid := s.ownMountNS(t)
	return exec.Command("nsenter", append([]string{"-t", pid, "-m", "--"}, args...)...).CombinedOutput()
}

// ownMountNS returns the pid of the server's sshd, failing the test
// unless it runs and has a mount namespace other than the test's.
func (s *Server) ownMountNS(t testing.TB) string {
	t.Helper()
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		t.Fatalf("sshtest: the server on %s is stopped", s.HostPort())
	}
	pid := fmt.Sprint(cmd.Process.Pid)
	theirs, err1 := os.Readlink("/proc/" + pid + "/ns/mnt")
	ours, err2 := os.Readlink("/proc/self/ns/mnt")
	if err1 != nil || err2 != nil || theirs == ours {
		t.Fatalf("sshtest: the server on %s has no mount namespace of its own (%s, %v, %v): start it with StartIn", s.HostPort(), theirs, err1, err2)
	}
	return pid
}
