package sshexec

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gptui/gptui/badinput"
)

// DefaultWorkdir is a node's directory for gptui when its inventory line
// gives no workdir.
const DefaultWorkdir = "~/.gptui"

// MaxDevices bounds a node's devices: device indices run from 0 to
// MaxDevices-1 and cpu:N asks for at most MaxDevices workers.
const MaxDevices = 1024

// Node is one machine of the inventory.
type Node struct {
	Name     string  // the host as written, without user, port or brackets
	Host     string  // the address to reach: HostName from ~/.ssh/config, else Name
	User     string  // the remote user; empty for ssh's default, the local user
	Port     int     // the SSH port, 22 unless given; 0 for a local node
	Devices  Devices // the devices to use; none when the line gives none
	Workdir  string  // the node's directory for gptui, DefaultWorkdir unless given
	Identity string  // the private key file, ~ expanded; empty for ssh's defaults
	NIC      string  // the fast network's interface or address, if given
	// DeviceIPs are the devices' own network addresses (device_ips=), one
	// per device in the order of Devices, for a rank table's device_ip;
	// none when the line gives none.
	DeviceIPs []string
	// Jump lists the jump hosts the node is reached through, first to
	// last (jump=, else ProxyJump from ~/.ssh/config), for
	// ClientConfig.Jump; none when it is reached directly.
	Jump  []JumpHost
	Local bool // this machine: run commands without SSH
	Line  int  // the line of the inventory file, from 1
}

// DeviceIP returns the network address of the node's k-th device (in the
// order of Devices) for a rank table's device_ip: its own (device_ips=),
// else the node's fast network's when that is an address (nic=), else "".
func (n Node) DeviceIP(k int) string {
	if k < len(n.DeviceIPs) {
		return n.DeviceIPs[k]
	}
	if inventoryIP(n.NIC) {
		return n.NIC
	}
	return ""
}

// DeviceIPsFor returns the device_ip of each of the node's devices ids (in
// the order of Devices) by id, as a rank table's builder takes them
// (ranktable.ServerInput.DeviceIPs), or nil when the line gives no
// address: the table then gives each device the node's.
func (n Node) DeviceIPsFor(ids []int) map[int]string {
	var m map[int]string
	for k, id := range ids {
		if ip := n.DeviceIP(k); ip != "" {
			if m == nil {
				m = make(map[int]string, len(ids))
			}
			m[id] = ip
		}
	}
	return m
}

// LocalHosts names the inventory of a job on LocalNode in messages, where
// an inventory's file name would go: the flag that asks for such a job.
const LocalHosts = "--nproc"

// LocalNode is this machine as the one node of a job without an inventory
// ('gptui run --nproc N', the UI's --nproc N): nproc CPU workers, run
// without SSH in the current directory, so that the job's relative paths
// (data, checkpoints, logs) are those of the command's working directory.
func LocalNode(nproc int) Node {
	return Node{Name: "localhost", Host: "127.0.0.1", Local: true, Workdir: ".", Devices: Devices{CPU: nproc}}
}

// Devices are the devices of a node that gptui uses: accelerator indices
// or a number of CPU workers.
type Devices struct {
	CPU int   // the number of CPU workers for cpu:N; 0 otherwise
	IDs []int // the accelerator indices, in the order written
}

// Count returns the number of workers the devices run: CPU for cpu:N,
// else the number of IDs.
func (d Devices) Count() int {
	if d.CPU > 0 {
		return d.CPU
	}
	return len(d.IDs)
}

// String returns d as an inventory writes it: "cpu:4", or the IDs with
// runs of consecutive ascending indices as ranges, "0-3,6". It returns ""
// when d holds no devices.
func (d Devices) String() string {
	if d.CPU > 0 {
		return "cpu:" + strconv.Itoa(d.CPU)
	}
	var b strings.Builder
	for i := 0; i < len(d.IDs); {
		j := i
		for j+1 < len(d.IDs) && d.IDs[j+1] == d.IDs[j]+1 {
			j++
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(d.IDs[i]))
		if j > i {
			fmt.Fprintf(&b, "-%d", d.IDs[j])
		}
		i = j + 1
	}
	return b.String()
}

// ParseDevices parses the value of an inventory's devices key: indices and
// ranges separated by commas, such as "0-7", "0,2,4" or "0-3,6", or
// "cpu:N" for N CPU workers. Indices must be below MaxDevices and may not
// repeat; they keep the order written.
func ParseDevices(s string) (Devices, error) {
	fail := func(format string, args ...any) (Devices, error) {
		return Devices{}, fmt.Errorf("devices %q: %s; write ranges like 0-7 or 0,2,4, or cpu:N", s, fmt.Sprintf(format, args...))
	}
	if s == "" {
		return fail("empty")
	}
	if n, ok := strings.CutPrefix(s, "cpu:"); ok {
		cpu, err := inventoryNumber(n)
		if err != nil {
			return fail("%v", err)
		}
		if cpu < 1 || cpu > MaxDevices {
			return fail("cpu:%d: need 1 to %d CPU workers", cpu, MaxDevices)
		}
		return Devices{CPU: cpu}, nil
	}
	var d Devices
	seen := make(map[int]bool)
	for item := range strings.SplitSeq(s, ",") {
		los, his, isRange := strings.Cut(item, "-")
		lo, err := inventoryNumber(los)
		if err != nil {
			return fail("%v", err)
		}
		hi := lo
		if isRange {
			if hi, err = inventoryNumber(his); err != nil {
				return fail("%v", err)
			}
			if hi < lo {
				return fail("%s runs backwards", item)
			}
		}
		if hi >= MaxDevices {
			return fail("device %d is too large (at most %d)", hi, MaxDevices-1)
		}
		for id := lo; id <= hi; id++ {
			if seen[id] {
				return fail("device %d is listed twice", id)
			}
			seen[id] = true
			d.IDs = append(d.IDs, id)
		}
	}
	return d, nil
}

// inventoryNumber parses a non-negative decimal number of a few digits.
func inventoryNumber(s string) (int, error) {
	if s == "" || len(s) > 9 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a number", s)
	}
	return strconv.Atoi(s)
}

// InventoryError is a mistake in the inventory, or in an ssh_config file
// that it uses, with its place.
type InventoryError struct {
	File string // the file name
	Line int    // the line, from 1; 0 for the file as a whole
	Msg  string // what is wrong
}

// Error returns the mistake as "FILE:LINE: MSG", or "FILE: MSG" without a
// line.
func (e *InventoryError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return e.File + ": " + e.Msg
}

// Is reports that an InventoryError is bad input (badinput.Err).
func (e *InventoryError) Is(target error) bool { return badinput.Is(target) }

// inventoryKeys are the keys an inventory line may set, in the order
// errors list them.
var inventoryKeys = []string{"device_ips", "devices", "identity", "jump", "nic", "port", "ssh", "user", "workdir"}

// LoadInventory reads the inventory in the file at path, resolving its
// hosts through ~/.ssh/config when the home directory ($HOME) has one.
func LoadInventory(path string) ([]Node, error) {
	cfg := &SSHConfig{}
	if home, err := os.UserHomeDir(); err == nil {
		cfg.Home = home
		c, err := LoadSSHConfig(filepath.Join(home, ".ssh", "config"), home)
		switch {
		case err == nil:
			cfg = c
		case !errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("reading the ssh configuration for %s: %w", path, err)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, badinput.Wrap(err) // the inventory the user named
	}
	defer f.Close()
	return ParseInventory(path, f, cfg)
}

// ParseInventory parses the inventory r read from the file name (see the
// package documentation for the format) and resolves each remote node's
// host through cfg, which may be nil. The nodes keep the order of the
// file. An inventory without nodes is an error; errors about the text are
// *InventoryError.
func ParseInventory(name string, r io.Reader, cfg *SSHConfig) ([]Node, error) {
	var nodes []Node
	seen := make(map[string]int) // machine key -> line
	err := scanLines(name, r, func(n int, line string) error {
		node, ok, err := parseInventoryLine(name, n, line, cfg)
		if ie := (*InventoryError)(nil); errors.As(err, &ie) {
			return ie // a mistake in the ssh configuration
		}
		if err != nil {
			return &InventoryError{File: name, Line: n, Msg: err.Error()}
		}
		if !ok {
			return nil
		}
		node.Line = n
		key := node.machineKey()
		if prev, dup := seen[key]; dup {
			msg := fmt.Sprintf("%s is listed already on line %d (both reach %s)", node.Name, prev, key)
			if key == "localhost" {
				msg += "; for several nodes on this machine write 127.0.0.2, 127.0.0.3, ... each with its own workdir=, and ssh=true to reach them over SSH"
			}
			return &InventoryError{File: name, Line: n, Msg: msg}
		}
		seen[key] = n
		nodes = append(nodes, node)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(nodes) == 0 {
		return nil, &InventoryError{File: name, Msg: "no nodes; write one line per node: [user@]host[:port] devices=0-7"}
	}
	return nodes, nil
}

// maxLine bounds an inventory or ssh_config line.
const maxLine = 64 << 10

// scanLines calls fn with each line of r, numbered from 1, until fn
// returns an error. A line longer than maxLine is an *InventoryError
// naming it: no line of these files needs that much.
func scanLines(name string, r io.Reader, fn func(n int, line string) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	n := 1
	for ; sc.Scan(); n++ {
		if err := fn(n, sc.Text()); err != nil {
			return err
		}
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return &InventoryError{File: name, Line: n, Msg: fmt.Sprintf("the line is longer than %d KiB: is this the right file?", maxLine>>10)}
	} else if err != nil {
		return fmt.Errorf("%s:%d: %w", name, n, err)
	}
	return nil
}

// machineKey names the machine and port that n reaches, so that two
// lines for one machine can be found. localhost, 127.0.0.1 and ::1 are
// one machine; another loopback address (127.0.0.2) is a node of its own,
// as over SSH. Jump hosts make no difference: the workers of a job
// reach each other by the nodes' addresses, which must differ.
func (n *Node) machineKey() string {
	if n.Local {
		if thisMachine(n.Name) {
			return "localhost"
		}
		return strings.ToLower(n.Name)
	}
	return net.JoinHostPort(strings.ToLower(n.Host), strconv.Itoa(n.Port))
}

// parseInventoryLine parses line n of the inventory file name; ok is
// false for a blank or comment line. A mistake in the ssh configuration
// is an *InventoryError with its own place; others name no place.
func parseInventoryLine(name string, n int, line string, cfg *SSHConfig) (node Node, ok bool, err error) {
	words := strings.Fields(line)
	for i, w := range words {
		if w[0] == '#' {
			words = words[:i]
			break
		}
	}
	if len(words) == 0 {
		return Node{}, false, nil
	}
	spec := words[0]
	if k, _, isKV := strings.Cut(spec, "="); isKV && !strings.ContainsAny(k, "@:[") {
		return Node{}, false, fmt.Errorf("%q: a line starts with the node, [user@]host[:port]", spec)
	}
	user, host, port, err := splitInventoryHost(spec)
	if err != nil {
		return Node{}, false, err
	}
	node = Node{Name: host, User: user, Port: port, Workdir: DefaultWorkdir}

	var sshKey string
	given := make(map[string]bool)
	for _, w := range words[1:] {
		key, val, isKV := strings.Cut(w, "=")
		if !isKV {
			return Node{}, false, fmt.Errorf("%q is not key=value (keys: %s)", w, strings.Join(inventoryKeys, ", "))
		}
		if !slices.Contains(inventoryKeys, key) {
			return Node{}, false, fmt.Errorf("unknown key %q; the keys are %s", key, strings.Join(inventoryKeys, ", "))
		}
		if given[key] {
			return Node{}, false, fmt.Errorf("%s is given twice", key)
		}
		given[key] = true
		if val == "" {
			return Node{}, false, fmt.Errorf("%s: empty value", key)
		}
		if val[0] == '-' && (key == "workdir" || key == "identity") {
			// A command on the node would take it for an option (cd -P).
			return Node{}, false, fmt.Errorf("%s %q begins with '-', which a command would take for an option; write ./%s", key, val, val)
		}
		switch key {
		case "devices":
			if node.Devices, err = ParseDevices(val); err != nil {
				return Node{}, false, err
			}
		case "workdir":
			if bad := strings.TrimLeft(val, inventoryPathChars); bad != "" {
				return Node{}, false, fmt.Errorf("workdir %q: %q is not allowed; use letters, digits and . _ - + / ~", val, bad[:1])
			}
			node.Workdir = val
		case "identity":
			node.Identity = val
		case "device_ips":
			node.DeviceIPs = strings.Split(val, ",")
			for _, ip := range node.DeviceIPs {
				if !inventoryIP(ip) {
					return Node{}, false, fmt.Errorf("device_ips %q: %q is not an IP address; write each device's address, comma-separated, in the order of devices=", val, ip)
				}
			}
		case "nic":
			if !inventoryName(val) {
				return Node{}, false, fmt.Errorf("nic %q is not an interface name or address", val)
			}
			node.NIC = val
		case "user":
			if node.User != "" {
				return Node{}, false, fmt.Errorf("user is given twice, in %s and user=", spec)
			}
			if !inventoryUser(val) {
				return Node{}, false, fmt.Errorf("user %q: use letters, digits and . _ -, not starting with -", val)
			}
			node.User = val
		case "port":
			if node.Port != 0 {
				return Node{}, false, fmt.Errorf("port is given twice, in %s and port=", spec)
			}
			if node.Port, err = inventoryPort(val); err != nil {
				return Node{}, false, err
			}
		case "jump":
			if node.Jump, err = ParseJump(val, cfg); err != nil {
				return Node{}, false, fmt.Errorf("jump %q: %v; write jump=[user@]host[:port], a comma-separated list for a chain", val, err)
			}
		case "ssh":
			switch val {
			case "true", "yes", "false", "no":
				sshKey = val
			default:
				return Node{}, false, fmt.Errorf("ssh %q: write ssh=false to run without SSH or ssh=true to use it", val)
			}
		}
	}

	if n, d := len(node.DeviceIPs), node.Devices.Count(); n > 0 && n != d {
		addrs := "addresses"
		if n == 1 {
			addrs = "address"
		}
		return Node{}, false, fmt.Errorf("device_ips gives %d %s for %d devices; give one per device, in the order of devices=", n, addrs, d)
	}

	switch sshKey {
	case "false", "no":
		if len(node.Jump) > 0 {
			return Node{}, false, fmt.Errorf("ssh=%s with jump=: a node reached through a jump host is reached over SSH", sshKey)
		}
		node.Local = true
	case "":
		node.Local = inventoryLoopback(host) && node.User == "" && node.Port == 0 && len(node.Jump) == 0
	}
	if node.Local {
		node.Host, node.Port = host, 0
		if strings.EqualFold(host, "localhost") {
			// An address, as LocalNode's and a rank table's server_id.
			node.Host = "127.0.0.1"
		}
		node.Identity = cfg.expandHome(node.Identity)
		return node, true, nil
	}
	hc := cfg.Lookup(host)
	node.Host = host
	if hc.HostName != "" {
		node.Host = hc.HostName
	}
	if node.User == "" {
		node.User = hc.User
	}
	if node.Port == 0 {
		node.Port = hc.Port
	}
	if node.Port == 0 {
		node.Port = 22
	}
	if node.Identity != "" {
		node.Identity = cfg.expandHome(node.Identity)
	} else if len(hc.IdentityFiles) > 0 {
		node.Identity = hc.IdentityFiles[0]
	}
	if !given["jump"] && hc.ProxyJump != "" {
		if node.Jump, err = ParseJump(hc.ProxyJump, cfg); err != nil {
			file, line := cfg.proxyJumpAt(host)
			return Node{}, false, &InventoryError{File: file, Line: line,
				Msg: fmt.Sprintf("ProxyJump %q (for %s on %s:%d): %v; write [user@]host[:port], a comma-separated list for a chain", hc.ProxyJump, host, name, n, err)}
		}
	}
	return node, true, nil
}

// splitInventoryHost splits [user@]host[:port], or [user@][ipv6][:port],
// checking each part. port is 0 when not given.
func splitInventoryHost(spec string) (user, host string, port int, err error) {
	if u, rest, ok := strings.Cut(spec, "@"); ok {
		if !inventoryUser(u) {
			return "", "", 0, fmt.Errorf("user %q in %q: use letters, digits and . _ -, not starting with -", u, spec)
		}
		user, spec = u, rest
	}
	hostPort := spec
	switch {
	case strings.HasPrefix(spec, "["):
		end := strings.IndexByte(spec, ']')
		if end < 0 {
			return "", "", 0, fmt.Errorf("%q: missing ] after the IPv6 address", hostPort)
		}
		host, spec = spec[1:end], spec[end+1:]
		if !inventoryIP(host) || !strings.Contains(host, ":") {
			return "", "", 0, fmt.Errorf("%q: [%s] is not an IPv6 address", hostPort, host)
		}
		if spec != "" {
			p, ok := strings.CutPrefix(spec, ":")
			if !ok {
				return "", "", 0, fmt.Errorf("%q: want [address]:port", hostPort)
			}
			if port, err = inventoryPort(p); err != nil {
				return "", "", 0, err
			}
		}
		return user, host, port, nil
	case strings.Count(spec, ":") > 1: // an IPv6 address without a port
		if !inventoryIP(spec) {
			return "", "", 0, fmt.Errorf("%q is not a host: an IPv6 address with a port is written [address]:port", hostPort)
		}
		return user, spec, 0, nil
	}
	host, p, hasPort := strings.Cut(spec, ":")
	if hasPort {
		if port, err = inventoryPort(p); err != nil {
			return "", "", 0, err
		}
	}
	if !inventoryName(host) {
		return "", "", 0, fmt.Errorf("%q is not a host name or address", host)
	}
	return user, host, port, nil
}

func inventoryPort(s string) (int, error) {
	p, err := inventoryNumber(s)
	if err != nil || p < 1 || p > 65535 {
		return 0, fmt.Errorf("port %q is not a port number (1-65535)", s)
	}
	return p, nil
}

// inventoryPathChars are the bytes a workdir may hold.
const inventoryPathChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+/~"

// inventoryName reports whether s can be a host name, an IP address or
// an interface name: an IP address (with a zone of name characters), or
// letters, digits, '.', '_' and '-', not starting with '-' or '.'.
func inventoryName(s string) bool {
	if inventoryIP(s) {
		return true
	}
	if s == "" || len(s) > 253 || s[0] == '-' || s[0] == '.' {
		return false
	}
	return strings.TrimLeft(s, inventoryNameChars) == ""
}

// inventoryNameChars are the bytes of host, interface and user names.
const inventoryNameChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"

// inventoryIP reports whether s is an IP address whose zone, if any, is
// made of name characters.
func inventoryIP(s string) bool {
	a, err := netip.ParseAddr(s)
	return err == nil && strings.TrimLeft(a.Zone(), inventoryNameChars) == ""
}

// inventoryUser reports whether s can be a user name.
func inventoryUser(s string) bool {
	if s == "" || len(s) > 64 || s[0] == '-' {
		return false
	}
	return strings.TrimLeft(s, inventoryNameChars) == ""
}

// thisMachine reports whether host is this machine's usual name:
// localhost, 127.0.0.1 or ::1.
func thisMachine(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && (a == netip.IPv6Loopback() || a == netip.AddrFrom4([4]byte{127, 0, 0, 1}))
}

// inventoryLoopback reports whether host names this machine: localhost or
// a loopback address.
func inventoryLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// UniformDevices returns the number of devices each node of an inventory
// read from path lists, which must be the same on every node, and whether
// they are CPU workers (devices=cpu:N). A node that lists none, or a count
// that differs from the nodes' before it, is an *InventoryError.
func UniformDevices(path string, nodes []Node) (perNode int, cpu bool, err error) {
	for _, n := range nodes {
		d := n.Devices.Count()
		if d == 0 {
			return 0, false, &InventoryError{path, n.Line, n.Name + " lists no devices; add devices=0-7 or devices=cpu:N"}
		}
		if perNode != 0 && d != perNode {
			return 0, false, &InventoryError{path, n.Line, fmt.Sprintf("%s has %d devices, the nodes before it %d; the planner needs the same number on every node", n.Name, d, perNode)}
		}
		perNode, cpu = d, n.Devices.CPU > 0
	}
	return perNode, cpu, nil
}
