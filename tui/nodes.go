package tui

import (
	"fmt"
	"github.com/gptui/gptui/units"
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
	note  string // the last pruned or replica message, which changes no state
	probe *event.Probe
	// dropped: the user left the node out of the job (D on the dashboard,
	// after it was lost); R takes it back.
	dropped bool
	// hostKey is the host key refused, when that is why the setup failed.
	hostKey *event.HostKey
}

// ready reports whether the node is set up for a job and in it.
func (r nodeRow) ready() bool { return r.state == event.NodeReady && !r.dropped }

// broken reports whether the node needs the user: its setup failed, it
// was lost, or its setup was stopped.
func (r nodeRow) broken() bool {
	return r.state == event.NodeFailed || r.state == event.NodeLost || r.state == event.NodeStopped
}

// unknownKey returns the fingerprint of the host key the node offered that
// known_hosts does not know; "" when that is not why it failed.
func (r nodeRow) unknownKey() string {
	if r.state != event.NodeFailed || r.hostKey == nil || r.hostKey.Kind != sshexec.HostKeyUnknown {
		return ""
	}
	return r.hostKey.Fingerprint
}

// stateText is the state as shown: a failure because of the host key is
// singled out, since what to do about it differs from other failures.
func (r nodeRow) stateText() string {
	switch {
	case r.dropped:
		return "dropped"
	case r.state == event.NodeFailed && r.hostKey != nil:
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
	case event.KindCheckpoint:
		if ev.State == event.CheckpointReplicated || ev.State == event.CheckpointReplicaFailed {
			m.row(ev.Node).note = "replica: " + clean(ev.Message) // news, not a state
		}
	case event.KindNode:
		r := m.row(ev.Node)
		if ev.State == event.NodePruned || ev.State == event.NodeBack {
			r.note = ev.State + ": " + clean(ev.Message) // news, not a state
			return
		}
		r.state, r.msg, r.hostKey = ev.State, clean(ev.Message), ev.HostKey
		if ev.Probe != nil { // the cluster runner reports its probe this way
			r.probe = ev.Probe
		}
	}
}

// readyNames returns the names of the ready nodes, in inventory order.
func (m *nodesModel) readyNames() []string {
	var names []string
	for _, r := range m.rows {
		if r.ready() {
			names = append(names, r.node.Name)
		}
	}
	return names
}

// readyProbes returns what the probes of the ready nodes found, by name.
func (m *nodesModel) readyProbes() map[string]*event.Probe {
	p := make(map[string]*event.Probe)
	for _, r := range m.rows {
		if r.ready() && r.probe != nil {
			p[r.node.Name] = r.probe
		}
	}
	return p
}

// notReady says which nodes are not ready and why, in a few words ("gpu3
// failed, gpu1 connecting"); "" when all are.
func (m *nodesModel) notReady() string {
	var parts []string
	for _, r := range m.rows {
		if !r.ready() && !r.dropped {
			parts = append(parts, r.node.Name+" "+r.stateText())
		}
	}
	if len(parts) > 3 {
		parts = append(parts[:3], fmt.Sprintf("%d more", len(parts)-3))
	}
	return strings.Join(parts, ", ")
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

// update handles a key of the Nodes screen; it reports whether it used
// it, and what follows.
func (m *nodesModel) update(msg tea.KeyPressMsg, k keyMap, h host) (bool, tea.Cmd) {
	switch {
	case is(msg, k.Filter):
		return true, h.openPrompt(promptFilter, "filter nodes: ", m.filter, "")
	case is(msg, k.Retry):
		r := m.selected()
		if r == nil {
			return true, nil
		}
		r.dropped = false // set up again, it is in the job again
		return true, h.retry(r.node.Name, "")
	case is(msg, k.Accept):
		r := m.selected()
		if r == nil {
			return true, nil
		}
		fp := r.unknownKey()
		if fp == "" {
			h.say(r.node.Name + " has no new host key to accept (a changed or revoked key is never accepted here: see its details)")
			return true, nil
		}
		m.detail = true // the fingerprint and how to check it stay in view
		name := r.node.Name
		h.ask(fmt.Sprintf("Trust %s's host key %s and add it to ~/.ssh/known_hosts? Only if it matches the node's own ssh-keygen -lf.", name, fp),
			func() tea.Cmd { return h.retry(name, fp) })
		return true, nil
	}
	return m.move(msg, k), nil
}

// move handles the keys that move the selection and open or close things.
func (m *nodesModel) move(msg tea.KeyPressMsg, k keyMap) bool {
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
		s := fmt.Sprintf("%d cores, %s RAM", p.Cores, units.Bytes(p.MemBytes))
		if p.NoGPU != "" {
			s += "; no GPU: " + p.NoGPU
		}
		return s
	}
	// Group identical devices: "8× NVIDIA H100 80GB HBM3 80.0 GiB".
	var parts []string
	for i := 0; i < len(p.Devices); {
		j := i
		for j < len(p.Devices) && p.Devices[j].Name == p.Devices[i].Name && p.Devices[j].MemTotal == p.Devices[i].MemTotal {
			j++
		}
		parts = append(parts, fmt.Sprintf("%d× %s %s", j-i, p.Devices[i].Name, units.Bytes(p.Devices[i].MemTotal)))
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

// hostKeyAdvice says what to do about a host-key failure.
func (r nodeRow) hostKeyAdvice() []string {
	host := r.node.Host
	if r.node.Port != 0 && r.node.Port != 22 {
		host = fmt.Sprintf("[%s]:%d", r.node.Host, r.node.Port)
	}
	offered, kind := "the offered key", ""
	if k := r.hostKey; k != nil {
		offered, kind = k.Fingerprint, k.Kind
	}
	switch kind {
	case sshexec.HostKeyChanged:
		return []string{
			"The node offers " + offered + ", not the key known_hosts records for it.",
			"If it was reinstalled, forget the old key and retry:  ssh-keygen -R " + host,
			"Otherwise something else answers at its address: do not connect.",
		}
	case sshexec.HostKeyRevoked:
		return []string{"Its key " + offered + " is marked @revoked: gptui will not connect to it."}
	}
	keyscan := "ssh-keyscan " + r.node.Host + " >> ~/.ssh/known_hosts"
	if r.node.Port != 0 && r.node.Port != 22 {
		keyscan = fmt.Sprintf("ssh-keyscan -p %d %s >> ~/.ssh/known_hosts", r.node.Port, r.node.Host)
	}
	return []string{
		"Its key " + offered + " is not in known_hosts. Compare it with what  ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub  prints on the node itself; if they are equal, press a to accept it (asks first; the line is added to ~/.ssh/known_hosts as",
		"  " + keyscan,
		"would add it, and the node is set up again).",
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
	if r.broken() || r.dropped {
		add("R sets the node up again (connect, push, probe).")
	}
	if r.dropped {
		add("It was dropped from the job after it was lost (D on the dashboard); R takes it back.")
	}
	if r.note != "" {
		add(r.note)
	}
	if r.stateText() == "host key" {
		for _, l := range r.hostKeyAdvice() {
			add(l)
		}
	}
	if p := r.probe; p != nil {
		add(fmt.Sprintf("%s (%s): %d cores, %s RAM", p.Hostname, p.OS, p.Cores, units.Bytes(p.MemBytes)))
		for _, d := range p.Devices {
			add(fmt.Sprintf("  %d  %s  %s free of %s  %s", d.Index, d.Name, units.Bytes(d.MemFree), units.Bytes(d.MemTotal), d.PCIBusID))
		}
	}
	return out
}
