package sshexec

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// testConfig is a small ~/.ssh/config for the inventory tests.
func testConfig(t testing.TB) *SSHConfig {
	cfg, err := ParseSSHConfig("config", strings.NewReader(`
Host gpu*
  HostName %h.cluster
  User ops
  Port 2200
  IdentityFile ~/.ssh/cluster
  ProxyJump bastion
Host alias-of-gpu1
  HostName gpu1.cluster
  Port 2200
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Home = "/home/me"
	return cfg
}

func TestParseInventory(t *testing.T) {
	bastion := []JumpHost{{Name: "bastion", Host: "bastion", Port: 22}}
	tests := []struct {
		name string
		in   string
		want []Node
	}{
		{"plain", "10.0.0.1 devices=0-7\n", []Node{
			{Name: "10.0.0.1", Host: "10.0.0.1", Port: 22, Devices: Devices{IDs: []int{0, 1, 2, 3, 4, 5, 6, 7}}, Workdir: DefaultWorkdir, Line: 1},
		}},
		{"every key", "# cluster\n\n  bob@10.0.0.2:2022   devices=0-3,6 workdir=/scratch/g identity=~/k nic=192.168.1.2 # trailing\n", []Node{
			{Name: "10.0.0.2", Host: "10.0.0.2", User: "bob", Port: 2022, Devices: Devices{IDs: []int{0, 1, 2, 3, 6}},
				Workdir: "/scratch/g", Identity: "/home/me/k", NIC: "192.168.1.2", Line: 3},
		}},
		{"user and port keys", "n1 user=carol port=23 devices=cpu:2 nic=ib0", []Node{
			{Name: "n1", Host: "n1", User: "carol", Port: 23, Devices: Devices{CPU: 2}, Workdir: DefaultWorkdir, NIC: "ib0", Line: 1},
		}},
		{"ssh config", "gpu1 devices=0,2,4\ngpu2 user=me port=22 identity=/k\n", []Node{
			{Name: "gpu1", Host: "gpu1.cluster", User: "ops", Port: 2200, Devices: Devices{IDs: []int{0, 2, 4}}, Workdir: DefaultWorkdir,
				Identity: "/home/me/.ssh/cluster", Jump: bastion, Line: 1},
			{Name: "gpu2", Host: "gpu2.cluster", User: "me", Port: 22, Workdir: DefaultWorkdir, Identity: "/k", Jump: bastion, Line: 2},
		}},
		{"local", "localhost devices=cpu:4\n", []Node{
			{Name: "localhost", Host: "127.0.0.1", Devices: Devices{CPU: 4}, Workdir: DefaultWorkdir, Local: true, Line: 1},
		}},
		{"loopback addresses are nodes of their own", "127.0.0.2 workdir=/a\n127.0.0.3 workdir=/b\nlocalhost\n", []Node{
			{Name: "127.0.0.2", Host: "127.0.0.2", Workdir: "/a", Local: true, Line: 1},
			{Name: "127.0.0.3", Host: "127.0.0.3", Workdir: "/b", Local: true, Line: 2},
			{Name: "localhost", Host: "127.0.0.1", Workdir: DefaultWorkdir, Local: true, Line: 3},
		}},
		{"loopback address", "127.0.0.2 nic=lo\n", []Node{
			{Name: "127.0.0.2", Host: "127.0.0.2", Workdir: DefaultWorkdir, NIC: "lo", Local: true, Line: 1},
		}},
		{"localhost over ssh", "localhost:2222\nme@localhost\n127.0.0.1 ssh=true\n", []Node{
			{Name: "localhost", Host: "localhost", Port: 2222, Workdir: DefaultWorkdir, Line: 1},
			{Name: "localhost", Host: "localhost", User: "me", Port: 22, Workdir: DefaultWorkdir, Line: 2},
			{Name: "127.0.0.1", Host: "127.0.0.1", Port: 22, Workdir: DefaultWorkdir, Line: 3},
		}},
		{"ipv6", "[fe80::1]:2022 devices=0\nfe80::2%eth0\nu@[fe80::3]\n", []Node{
			{Name: "fe80::1", Host: "fe80::1", Port: 2022, Devices: Devices{IDs: []int{0}}, Workdir: DefaultWorkdir, Line: 1},
			{Name: "fe80::2%eth0", Host: "fe80::2%eth0", Port: 22, Workdir: DefaultWorkdir, Line: 2},
			{Name: "fe80::3", Host: "fe80::3", User: "u", Port: 22, Workdir: DefaultWorkdir, Line: 3},
		}},
		{"same host, other ports", "h:22\nh:23\n", []Node{
			{Name: "h", Host: "h", Port: 22, Workdir: DefaultWorkdir, Line: 1},
			{Name: "h", Host: "h", Port: 23, Workdir: DefaultWorkdir, Line: 2},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseInventory("hosts.txt", strings.NewReader(tc.in), testConfig(t))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ParseInventory =\n%s\nwant\n%s", dumpNodes(got), dumpNodes(tc.want))
			}
		})
	}
}

func TestParseInventorySSHFalse(t *testing.T) {
	got, err := ParseInventory("hosts.txt", strings.NewReader("node7 ssh=false identity=~/id devices=1\n::1 ssh=no\n"), testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	want := []Node{
		{Name: "node7", Host: "node7", Devices: Devices{IDs: []int{1}}, Workdir: DefaultWorkdir, Identity: "/home/me/id", Local: true, Line: 1},
		{Name: "::1", Host: "::1", Workdir: DefaultWorkdir, Local: true, Line: 2},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseInventory =\n%s\nwant\n%s", dumpNodes(got), dumpNodes(want))
	}
}

func dumpNodes(nodes []Node) string {
	var b strings.Builder
	for _, n := range nodes {
		fmt.Fprintf(&b, "  %+v\n", n)
	}
	return b.String()
}

func TestParseInventoryErrors(t *testing.T) {
	keys := "device_ips, devices, identity, jump, nic, port, ssh, user, workdir"
	tests := []struct{ in, want string }{
		{"", "hosts.txt: no nodes; write one line per node: [user@]host[:port] devices=0-7"},
		{"# only\n\n", "hosts.txt: no nodes; write one line per node: [user@]host[:port] devices=0-7"},
		{"a\nb\nc devices=0-x\n", `hosts.txt:3: devices "0-x": "x" is not a number; write ranges like 0-7 or 0,2,4, or cpu:N`},
		{"a devices=7-0", `hosts.txt:1: devices "7-0": 7-0 runs backwards; write ranges like 0-7 or 0,2,4, or cpu:N`},
		{"a devices=0-3,2", `hosts.txt:1: devices "0-3,2": device 2 is listed twice; write ranges like 0-7 or 0,2,4, or cpu:N`},
		{"a devices=0-4096", `hosts.txt:1: devices "0-4096": device 4096 is too large (at most 1023); write ranges like 0-7 or 0,2,4, or cpu:N`},
		{"a devices=cpu:0", `hosts.txt:1: devices "cpu:0": cpu:0: need 1 to 1024 CPU workers; write ranges like 0-7 or 0,2,4, or cpu:N`},
		{"a devices=cpu:x", `hosts.txt:1: devices "cpu:x": "x" is not a number; write ranges like 0-7 or 0,2,4, or cpu:N`},
		{"a devices=0,,1", `hosts.txt:1: devices "0,,1": "" is not a number; write ranges like 0-7 or 0,2,4, or cpu:N`},
		{"a devices=-1", `hosts.txt:1: devices "-1": "" is not a number; write ranges like 0-7 or 0,2,4, or cpu:N`},
		{"a devices=", `hosts.txt:1: devices: empty value`},
		{"a devices=0-1 device_ips=10.0.0.1,node2", `hosts.txt:1: device_ips "10.0.0.1,node2": "node2" is not an IP address; write each device's address, comma-separated, in the order of devices=`},
		{"a devices=0-2 device_ips=10.0.0.1,10.0.0.2", `hosts.txt:1: device_ips gives 2 addresses for 3 devices; give one per device, in the order of devices=`},
		{"a device_ips=10.0.0.1", `hosts.txt:1: device_ips gives 1 address for 0 devices; give one per device, in the order of devices=`},
		{"a device=0-7", `hosts.txt:1: unknown key "device"; the keys are ` + keys},
		{"a 0-7", `hosts.txt:1: "0-7" is not key=value (keys: ` + keys + ")"},
		{"a devices=0 devices=1", `hosts.txt:1: devices is given twice`},
		{"devices=0-7", `hosts.txt:1: "devices=0-7": a line starts with the node, [user@]host[:port]`},
		{"a\nb\na\n", `hosts.txt:3: a is listed already on line 1 (both reach a:22)`},
		{"gpu1\nalias-of-gpu1\n", `hosts.txt:2: alias-of-gpu1 is listed already on line 1 (both reach gpu1.cluster:2200)`},
		{"A:22\na\n", `hosts.txt:2: a is listed already on line 1 (both reach a:22)`},
		{"localhost\n127.0.0.1\n", `hosts.txt:2: 127.0.0.1 is listed already on line 1 (both reach localhost); for several nodes on this machine write 127.0.0.2, 127.0.0.3, ... each with its own workdir=, and ssh=true to reach them over SSH`},
		{"::1\n127.0.0.1 devices=0\n", `hosts.txt:2: 127.0.0.1 is listed already on line 1 (both reach localhost); for several nodes on this machine write 127.0.0.2, 127.0.0.3, ... each with its own workdir=, and ssh=true to reach them over SSH`},
		{"a workdir=-P", `hosts.txt:1: workdir "-P" begins with '-', which a command would take for an option; write ./-P`},
		{"a\nb identity=-oProxyCommand", `hosts.txt:2: identity "-oProxyCommand" begins with '-', which a command would take for an option; write ./-oProxyCommand`},
		{"a\nb\nc devices=" + strings.Repeat("0", 10<<20) + "\nd\n", `hosts.txt:3: the line is longer than 64 KiB: is this the right file?`},
		{"[::1]:22\n::1 port=22\n", `hosts.txt:2: ::1 is listed already on line 1 (both reach [::1]:22)`},
		{"a:0", `hosts.txt:1: port "0" is not a port number (1-65535)`},
		{"a:65536", `hosts.txt:1: port "65536" is not a port number (1-65535)`},
		{"a:", `hosts.txt:1: port "" is not a port number (1-65535)`},
		{"a port=ssh", `hosts.txt:1: port "ssh" is not a port number (1-65535)`},
		{"a:22 port=23", `hosts.txt:1: port is given twice, in a:22 and port=`},
		{"u@a user=v", `hosts.txt:1: user is given twice, in u@a and user=`},
		{"-oProxyCommand=x", `hosts.txt:1: "-oProxyCommand=x": a line starts with the node, [user@]host[:port]`},
		{"-oProxyCommand", `hosts.txt:1: "-oProxyCommand" is not a host name or address`},
		{"-u@a", `hosts.txt:1: user "-u" in "-u@a": use letters, digits and . _ -, not starting with -`},
		{"a user=b;c", `hosts.txt:1: user "b;c": use letters, digits and . _ -, not starting with -`},
		{"u@v@a", `hosts.txt:1: "v@a" is not a host name or address`},
		{"a:22:33", `hosts.txt:1: "a:22:33" is not a host: an IPv6 address with a port is written [address]:port`},
		{"[fe80::1", `hosts.txt:1: "[fe80::1": missing ] after the IPv6 address`},
		{"[a]:22", `hosts.txt:1: "[a]:22": [a] is not an IPv6 address`},
		{"[::1]22", `hosts.txt:1: "[::1]22": want [address]:port`},
		{"::0%0]", `hosts.txt:1: "::0%0]" is not a host: an IPv6 address with a port is written [address]:port`},
		{"[fe80::1%$(x)]", `hosts.txt:1: "[fe80::1%$(x)]": [fe80::1%$(x)] is not an IPv6 address`},
		{"a nic=fe80::1%;x", `hosts.txt:1: nic "fe80::1%;x" is not an interface name or address`},
		{"a ssh=maybe", `hosts.txt:1: ssh "maybe": write ssh=false to run without SSH or ssh=true to use it`},
		{"a nic=$(x)", `hosts.txt:1: nic "$(x)" is not an interface name or address`},
		{"a workdir=/tmp/$HOME", `hosts.txt:1: workdir "/tmp/$HOME": "$" is not allowed; use letters, digits and . _ - + / ~`},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			nodes, err := ParseInventory("hosts.txt", strings.NewReader(tc.in), testConfig(t))
			if err == nil {
				t.Fatalf("ParseInventory = %s, want error %q", dumpNodes(nodes), tc.want)
			}
			if err.Error() != tc.want {
				t.Errorf("ParseInventory error\n got %q\nwant %q", err, tc.want)
			}
			var ie *InventoryError
			if !errors.As(err, &ie) || ie.File != "hosts.txt" {
				t.Errorf("error %#v is not an *InventoryError naming the file", err)
			}
		})
	}
}

func TestParseDevices(t *testing.T) {
	tests := []struct {
		in    string
		want  Devices
		count int
		str   string
	}{
		{"0-7", Devices{IDs: []int{0, 1, 2, 3, 4, 5, 6, 7}}, 8, "0-7"},
		{"0,2,4", Devices{IDs: []int{0, 2, 4}}, 3, "0,2,4"},
		{"0-3,6", Devices{IDs: []int{0, 1, 2, 3, 6}}, 5, "0-3,6"},
		{"6,0-3", Devices{IDs: []int{6, 0, 1, 2, 3}}, 5, "6,0-3"},
		{"3,2,1", Devices{IDs: []int{3, 2, 1}}, 3, "3,2,1"},
		{"1,2,3", Devices{IDs: []int{1, 2, 3}}, 3, "1-3"},
		{"5-5", Devices{IDs: []int{5}}, 1, "5"},
		{"007", Devices{IDs: []int{7}}, 1, "7"},
		{"1023", Devices{IDs: []int{1023}}, 1, "1023"},
		{"cpu:1", Devices{CPU: 1}, 1, "cpu:1"},
		{"cpu:1024", Devices{CPU: 1024}, 1024, "cpu:1024"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseDevices(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ParseDevices = %+v, want %+v", got, tc.want)
			}
			if got.Count() != tc.count {
				t.Errorf("Count = %d, want %d", got.Count(), tc.count)
			}
			if got.String() != tc.str {
				t.Errorf("String = %q, want %q", got.String(), tc.str)
			}
		})
	}
	for _, bad := range []string{"", "cpu:", "cpu:1025", "cpu:-1", "gpu:1", "1-", "-", "1-2-3", "1024", "0x1", " 1", "1,", "9999999999"} {
		if d, err := ParseDevices(bad); err == nil {
			t.Errorf("ParseDevices(%q) = %+v, want an error", bad, d)
		}
	}
	if s := (Devices{}).String(); s != "" {
		t.Errorf("Devices{}.String() = %q", s)
	}
}

func TestLoadInventory(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	hosts := filepath.Join(home, "hosts.txt")
	if err := os.WriteFile(hosts, []byte("gpu1 devices=0-1\nlocalhost identity=~/k\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	// Without ~/.ssh/config only ~ is resolved.
	nodes, err := LoadInventory(hosts)
	if err != nil {
		t.Fatal(err)
	}
	want := []Node{
		{Name: "gpu1", Host: "gpu1", Port: 22, Devices: Devices{IDs: []int{0, 1}}, Workdir: DefaultWorkdir, Line: 1},
		{Name: "localhost", Host: "127.0.0.1", Workdir: DefaultWorkdir, Identity: filepath.Join(home, "k"), Local: true, Line: 2},
	}
	if !reflect.DeepEqual(nodes, want) {
		t.Errorf("LoadInventory without ssh config =\n%s\nwant\n%s", dumpNodes(nodes), dumpNodes(want))
	}

	// With it, the alias is resolved.
	if err := os.MkdirAll(filepath.Join(home, ".ssh", "conf.d"), 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(home, ".ssh", "config"), []byte("Include conf.d/*\nHost *\n  IdentityFile ~/.ssh/id_test\n"), 0o600)
	os.WriteFile(filepath.Join(home, ".ssh", "conf.d", "gpu"), []byte("Host gpu1\n  HostName 10.1.1.1\n  Port 2022\n"), 0o600)
	nodes, err = LoadInventory(hosts)
	if err != nil {
		t.Fatal(err)
	}
	want[0].Host, want[0].Port, want[0].Identity = "10.1.1.1", 2022, filepath.Join(home, ".ssh", "id_test")
	if !reflect.DeepEqual(nodes, want) {
		t.Errorf("LoadInventory with ssh config =\n%s\nwant\n%s", dumpNodes(nodes), dumpNodes(want))
	}

	// A broken ssh config is reported with its place.
	os.WriteFile(filepath.Join(home, ".ssh", "conf.d", "gpu"), []byte("Host gpu1\n  Port many\n"), 0o600)
	_, err = LoadInventory(hosts)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(home, ".ssh", "conf.d", "gpu")+`:2: Port "many"`) {
		t.Errorf("LoadInventory with a bad ssh config: %v", err)
	}

	_, err = LoadInventory(filepath.Join(home, "none.txt"))
	if err == nil || !strings.Contains(err.Error(), "none.txt") {
		t.Errorf("LoadInventory of a missing file: %v", err)
	}
}

// formatNode writes n back as an inventory line that ParseInventory with a
// nil config reads as n.
func formatNode(n Node) string {
	var b strings.Builder
	if n.User != "" {
		b.WriteString(n.User + "@")
	}
	switch {
	case n.Local:
		b.WriteString(n.Name + " ssh=false")
	case strings.Contains(n.Name, ":"):
		fmt.Fprintf(&b, "[%s]:%d ssh=true", n.Name, n.Port)
	default:
		fmt.Fprintf(&b, "%s:%d ssh=true", n.Name, n.Port)
	}
	if s := n.Devices.String(); s != "" {
		b.WriteString(" devices=" + s)
	}
	b.WriteString(" workdir=" + n.Workdir)
	if len(n.Jump) > 0 {
		hops := make([]string, len(n.Jump))
		for i, h := range n.Jump {
			hops[i] = h.String()
		}
		b.WriteString(" jump=" + strings.Join(hops, ","))
	}
	for _, kv := range [][2]string{{"identity", n.Identity}, {"nic", n.NIC}} {
		if kv[1] != "" {
			b.WriteString(" " + kv[0] + "=" + kv[1])
		}
	}
	return b.String()
}

func FuzzParseInventory(f *testing.F) {
	for _, s := range []string{
		"10.0.0.1 devices=0-7\n10.0.0.2 devices=0-7\n",
		"# c\nbob@h:2022 devices=0-3,6 workdir=/w identity=~/k nic=ib0 # x\n",
		"localhost devices=cpu:4\nnode ssh=false\n127.0.0.1 ssh=true port=2\n",
		"[fe80::1]:22 devices=0\nfe80::2 user=u\ngpu1\nalias-of-gpu1\n",
		"a devices=0-x\n",
		"n1 jump=me@b1:2022,gpu7 devices=cpu:1\ngpu1 jump=none\n127.0.0.2 jump=ssh://[fe80::1]:2\n",
		"a jump=b,,c\n",
	} {
		f.Add(s)
	}
	cfg := testConfig(f)
	f.Fuzz(func(t *testing.T, in string) {
		lines := strings.Count(in, "\n") + 1
		for _, c := range []*SSHConfig{nil, cfg} {
			nodes, err := ParseInventory("hosts.txt", strings.NewReader(in), c)
			if err != nil {
				var ie *InventoryError
				if errors.As(err, &ie) && (ie.File != "hosts.txt" || ie.Line < 0 || ie.Line > lines) {
					t.Fatalf("error %q has a bad place", err)
				}
				if !errors.As(err, &ie) && !strings.Contains(err.Error(), "too long") {
					t.Fatalf("error %#v is not an *InventoryError", err)
				}
				return
			}
			if len(nodes) == 0 {
				t.Fatal("no nodes and no error")
			}
			seen := map[string]bool{}
			for i, n := range nodes {
				if n.Name == "" || n.Host == "" || n.Workdir == "" || n.Line < 1 || n.Line > lines || (i > 0 && n.Line <= nodes[i-1].Line) {
					t.Fatalf("bad node %+v", n)
				}
				if n.Local != (n.Port == 0) || n.Port < 0 || n.Port > 65535 {
					t.Fatalf("node %+v: Local %v with port %d", n, n.Local, n.Port)
				}
				if n.Devices.CPU > 0 && len(n.Devices.IDs) > 0 || n.Devices.Count() > MaxDevices {
					t.Fatalf("node %+v: bad devices", n)
				}
				if n.Local && len(n.Jump) > 0 {
					t.Fatalf("node %+v: local with jump hosts", n)
				}
				for _, h := range n.Jump {
					if h.Name == "" || h.Host == "" || h.Port < 1 || h.Port > 65535 {
						t.Fatalf("node %+v: bad jump host %+v", n, h)
					}
				}
				if s := n.Devices.String(); s != "" {
					if d, err := ParseDevices(s); err != nil || !reflect.DeepEqual(d, n.Devices) {
						t.Fatalf("devices %+v written %q read back as %+v, %v", n.Devices, s, d, err)
					}
				}
				k := n.machineKey()
				if seen[k] {
					t.Fatalf("machine %s listed twice", k)
				}
				seen[k] = true
			}
			if c != nil {
				continue
			}
			// Written back, the nodes read the same.
			var b strings.Builder
			for _, n := range nodes {
				b.WriteString(formatNode(n) + "\n")
			}
			again, err := ParseInventory("again.txt", strings.NewReader(b.String()), nil)
			if err != nil {
				t.Fatalf("reading back %q: %v", b.String(), err)
			}
			for i := range again {
				again[i].Line = nodes[i].Line
			}
			if !reflect.DeepEqual(again, nodes) {
				t.Fatalf("read back %q as\n%s\nwant\n%s", b.String(), dumpNodes(again), dumpNodes(nodes))
			}
		}
	})
}

// The user names the inventory accepts are safe words for a command line.
func TestInventoryUser(t *testing.T) {
	for i, tc := range []struct {
		s  string
		ok bool
	}{{"alice", true}, {"a.b_c-d", true}, {"", false}, {"-a", false}, {"a b", false}, {"a;b", false}, {strings.Repeat("a", 65), false}} {
		if got := inventoryUser(tc.s); got != tc.ok {
			t.Errorf("%d: inventoryUser(%q) = %v, want %v", i, tc.s, got, tc.ok)
		}
	}
}
