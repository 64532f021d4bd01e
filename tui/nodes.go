package tui

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	tea "charm.land/bubbletea/v2"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/sshexec"
)

// nodeRow is one node of the inventory and what its probe found.
type nodeRow struct {
	node  sshexec.Node
	state string // an event.Node* state; empty until the launcher reports
	msg   string
	probe *event.Probe
}

// stateText is the state as shown: a failure because of the host key is
// singled out, since what to do about it differs from other failures.
func (r nodeRow) stateText() string {
	switch {
	case r.state == event.NodeFailed && strings.Contains(r.msg, "host key"):
		return "host key"
	case r.state == "":
		return "waiting"
	}
	return r.state
}

// nodesModel is the Nodes screen: the inventory with each node's state as
// it is probed.
type nodesModel struct {
	rows   []nodeRow
	sel    int    // index into visible()
	filter string // rows whose text holds it; empty: all
	detail bool   // the selected node's details are open
}

func newNodesModel(nodes []sshexec.Node) nodesModel {
	m := nodesModel{}
	for _, n := range nodes {
		m.rows = append(m.rows, nodeRow{node: n})
	}
	return m
}

// row returns the row of the named node, adding one for a node the
// inventory did not list.
func (m *nodesModel) row(name string) *nodeRow {
	for i := range m.rows {
		n := m.rows[i].node
		// The runner names two nodes of one name by name and port.
		if n.Name == name || fmt.Sprintf("%s:%d", n.Name, n.Port) == name {
			return &m.rows[i]
		}
	}
	m.rows = append(m.rows, nodeRow{node: sshexec.Node{Name: name, Host: name}})
	return &m.rows[len(m.rows)-1]
}

// apply records a probe or node event.
func (m *nodesModel) apply(ev event.Event) {
	if ev.Node == "" {
		return
	}
	switch ev.Kind {
	case event.KindProbe:
		r := m.row(ev.Node)
		r.probe = ev.Probe
		if r.state == "" || r.state == event.NodeConnecting {
			r.state = event.NodeProbed
		}
	case event.KindNode:
		r := m.row(ev.Node)
		r.state, r.msg = ev.State, clean(ev.Message)
		if ev.Probe != nil { // the cluster runner reports its probe this way
			r.probe = ev.Probe
		}
	}
}

// probes returns what the probes found, by node name.
func (m *nodesModel) probes() map[string]*event.Probe {
	p := make(map[string]*event.Probe)
	for _, r := range m.rows {
		if r.probe != nil {
			p[r.node.Name] = r.probe
		}
	}
	return p
}

// visible returns the indices of the rows that pass the filter.
func (m *nodesModel) visible() []int {
	var v []int
	for i, r := range m.rows {
		if m.filter == "" || strings.Contains(strings.ToLower(r.node.Name+" "+r.node.Host+" "+r.stateText()+" "+r.msg), strings.ToLower(m.filter)) {
			v = append(v, i)
		}
	}
	return v
}

// selected returns the selected row, or nil.
func (m *nodesModel) selected() *nodeRow {
	v := m.visible()
	if len(v) == 0 {
		return nil
	}
	m.sel = min(max(m.sel, 0), len(v)-1)
	return &m.rows[v[m.sel]]
}

// update handles a key; it reports whether it used it.
func (m *nodesModel) update(msg tea.KeyPressMsg, k keyMap) bool {
	n := len(m.visible())
	switch {
	case is(msg, k.Up):
		m.sel = max(m.sel-1, 0)
	case is(msg, k.Down):
		m.sel = min(m.sel+1, max(n-1, 0))
	case is(msg, k.Top):
		m.sel = 0
	case is(msg, k.Bottom):
		m.sel = max(n-1, 0)
	case is(msg, k.Open):
		m.detail = !m.detail
	case is(msg, k.Back) && m.detail:
		m.detail = false
	case is(msg, k.Back) && m.filter != "":
		m.filter = ""
	default:
		return false
	}
	return true
}

// devicesText summarises what a node has: its probed devices, or its CPU,
// or the devices the inventory names.
func (r nodeRow) devicesText() string {
	p := r.probe
	if p == nil {
		if r.node.Devices.Count() > 0 {
			return "devices=" + r.node.Devices.String() + " (not probed)"
		}
		return "not probed"
	}
	if len(p.Devices) == 0 {
		s := fmt.Sprintf("%d cores, %s RAM", p.Cores, bytesize(p.MemBytes))
		if p.NoGPU != "" {
			s += "; no GPU: " + p.NoGPU
		}
		return s
	}
	// Group identical devices: "8× NVIDIA H100 80GB HBM3 80.0G".
	var parts []string
	for i := 0; i < len(p.Devices); {
		j := i
		for j < len(p.Devices) && p.Devices[j].Name == p.Devices[i].Name && p.Devices[j].MemTotal == p.Devices[i].MemTotal {
			j++
		}
		parts = append(parts, fmt.Sprintf("%d× %s %s", j-i, p.Devices[i].Name, bytesize(p.Devices[i].MemTotal)))
		i = j
	}
	return strings.Join(parts, ", ")
}

// address returns user@host:port as ssh would be told, or "local".
func (r nodeRow) address() string {
	n := r.node
	if n.Local {
		return "local"
	}
	s := n.Host
	if n.User != "" {
		s = n.User + "@" + s
	}
	if n.Port != 0 && n.Port != 22 {
		s += ":" + strconv.Itoa(n.Port)
	}
	return s
}

var fingerprintRE = regexp.MustCompile(`SHA256:[A-Za-z0-9+/=]+`)

// hostKeyAdvice says what to do about a host-key failure.
func (r nodeRow) hostKeyAdvice() []string {
	fp := fingerprintRE.FindAllString(r.msg, -1)
	host := r.node.Host
	if r.node.Port != 0 && r.node.Port != 22 {
		host = fmt.Sprintf("[%s]:%d", r.node.Host, r.node.Port)
	}
	offered := "the offered key"
	if len(fp) > 0 {
		offered = fp[len(fp)-1]
	}
	switch {
	case strings.Contains(r.msg, "changed"):
		return []string{
			"The node offers " + offered + ", not the key known_hosts records for it.",
			"If it was reinstalled, forget the old key and retry:  ssh-keygen -R " + host,
			"Otherwise something else answers at its address: do not connect.",
		}
	case strings.Contains(r.msg, "revoked"):
		return []string{"Its key " + offered + " is marked @revoked: gptui will not connect to it."}
	}
	keyscan := "ssh-keyscan " + r.node.Host + " >> ~/.ssh/known_hosts"
	if r.node.Port != 0 && r.node.Port != 22 {
		keyscan = fmt.Sprintf("ssh-keyscan -p %d %s >> ~/.ssh/known_hosts", r.node.Port, r.node.Host)
	}
	return []string{
		"Its key " + offered + " is not in known_hosts. Compare it with what  ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub  prints on the node itself; if they are equal, accept it with:",
		"  " + keyscan,
		"(or rerun with --accept-new-host-keys).",
	}
}

// view draws the screen in w×h cells.
func (m *nodesModel) view(st styles, w, h int) []string {
	nameW := 6
	for _, r := range m.rows {
		nameW = max(nameW, min(len(r.node.Name), 24))
	}
	addrW := min(22, max(10, w/5))
	stateW := 11
	head := fmt.Sprintf("  %-*s %-*s %-*s %s", nameW, "NODE", addrW, "ADDRESS", stateW, "STATE", "DEVICES / MESSAGE")
	lines := []string{st.Bold.r(fit(head, w))}

	vis := m.visible()
	sel := m.selected()
	var detail []string
	if m.detail && sel != nil {
		detail = m.detailLines(st, *sel, w)
	}
	room := max(h-1-len(detail), 1)
	if len(detail) > 0 {
		room = max(h-1-len(detail)-1, 1)
	}
	top := 0
	if m.sel >= room {
		top = m.sel - room + 1
	}
	for i := top; i < len(vis) && i < top+room; i++ {
		r := m.rows[vis[i]]
		mark := "  "
		if i == m.sel {
			mark = "› "
		}
		text := r.devicesText()
		if r.msg != "" && (r.state == event.NodeFailed || r.state == event.NodeStopped || r.state == event.NodeLost || r.probe == nil) {
			text = r.msg
		}
		state := r.stateText()
		line := mark + fmt.Sprintf("%-*s %-*s ", nameW, trunc(r.node.Name, nameW), addrW, trunc(r.address(), addrW)) +
			st.state(state).r(fmt.Sprintf("%-*s", stateW, state)) + " " + text
		if i == m.sel {
			line = st.Sel.r(mark) + line[len(mark):]
		}
		lines = append(lines, fit(line, w))
	}
	if len(vis) == 0 {
		if m.filter != "" {
			lines = append(lines, fit("  no node matches /"+m.filter, w))
		} else {
			lines = append(lines, fit("  no nodes: give an inventory with --hosts FILE", w))
		}
	}
	if len(detail) > 0 {
		for len(lines) < h-len(detail) {
			lines = append(lines, "")
		}
		lines = append(lines, detail...)
	}
	return lines
}

// detailLines describes one node in full.
func (m *nodesModel) detailLines(st styles, r nodeRow, w int) []string {
	out := []string{rule(st, "Node "+r.node.Name, w, true)}
	add := func(s string) {
		for _, l := range wrap(s, w-2) {
			out = append(out, fit("  "+l, w))
		}
	}
	inv := "inventory"
	if r.node.Line > 0 {
		inv = fmt.Sprintf("inventory line %d", r.node.Line)
	}
	add(fmt.Sprintf("%s: %s  workdir %s  devices %s", inv, r.address(), r.node.Workdir, r.node.Devices.String()))
	add("state: " + r.stateText())
	if r.msg != "" {
		add(r.msg)
	}
	if r.stateText() == "host key" {
		for _, l := range r.hostKeyAdvice() {
			add(l)
		}
	}
	if p := r.probe; p != nil {
		add(fmt.Sprintf("%s (%s): %d cores, %s RAM", p.Hostname, p.OS, p.Cores, bytesize(p.MemBytes)))
		for _, d := range p.Devices {
			add(fmt.Sprintf("  %d  %s  %s free of %s  %s", d.Index, d.Name, bytesize(d.MemFree), bytesize(d.MemTotal), d.PCIBusID))
		}
	}
	return out
}

// trunc cuts s to n cells with an ellipsis.
func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return fit(s, n)
}

// wrap breaks s into lines of at most w cells at spaces.
func wrap(s string, w int) []string {
	if w < 10 {
		w = 10
	}
	var out []string
	line := ""
	for _, word := range strings.Fields(s) {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) <= w:
			line += " " + word
		default:
			out = append(out, line)
			line = word
		}
	}
	if line != "" || len(out) == 0 {
		out = append(out, line)
	}
	return out
}
