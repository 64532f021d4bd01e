package sshtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Nodes are sshd servers on this machine as the nodes of a job, for the
// tests of the launcher: the servers, the nodes' workdirs and an
// inventory of them.
type Nodes struct {
	Servers []*Server
	// Workdirs are the nodes' workdirs (dir/node0, dir/node1, ...) as the
	// inventory names them; StartNodes does not create them.
	Workdirs []string
	// Hosts is the path of the inventory: a line for each node with its
	// user, address, port, devices, workdir and the user key as identity.
	Hosts string
}

// StartNodes starts an sshd on each of addrs, as Start does, and writes
// the inventory dir/hosts.txt, which gives each node devices.
func StartNodes(t testing.TB, dir, devices string, addrs ...string) *Nodes {
	t.Helper()
	n := &Nodes{Hosts: filepath.Join(dir, "hosts.txt")}
	var inv strings.Builder
	for i, addr := range addrs {
		s := Start(t, addr)
		wd := filepath.Join(dir, fmt.Sprintf("node%d", i))
		n.Servers = append(n.Servers, s)
		n.Workdirs = append(n.Workdirs, wd)
		fmt.Fprintf(&inv, "%s@%s:%d devices=%s workdir=%s identity=%s\n", s.User, addr, s.Port, devices, wd, s.UserKeyFile)
	}
	if err := os.WriteFile(n.Hosts, []byte(inv.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return n
}

// KnownHosts returns the known_hosts lines of servers (KnownHostsLine),
// each ending in a newline.
func KnownHosts(servers ...*Server) string {
	var b strings.Builder
	for _, s := range servers {
		b.WriteString(s.KnownHostsLine() + "\n")
	}
	return b.String()
}
