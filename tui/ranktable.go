package tui

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	tea "charm.land/bubbletea/v2"

	"github.com/gptui/gptui/ranktable"
	"github.com/gptui/gptui/sshexec"
	"github.com/gptui/gptui/units"
)

// rankTableModel is the Rank table screen: nodes × devices with their rank ids,
// each node's device range editable, written as the RANK_TABLE_FILE JSON
// the runner uses.
type rankTableModel struct {
	edited map[string]sshexec.Devices // device ranges typed in, by node name
	sel    int
	path   string // where w writes the table, and a launch (Options.RankTablePath); "" for the defaults
	saved  string // the table's JSON when it was last written
	at     string // where it was last written
}

func newRankTableModel(path string) rankTableModel {
	return rankTableModel{edited: make(map[string]sshexec.Devices), path: path}
}

// savePath is where w writes the table: the path given, else
// rank_table.json.
func (m *rankTableModel) savePath() string {
	if m.path != "" {
		return m.path
	}
	return "rank_table.json"
}

// jobPath is where a launch writes the table of job id: the path given,
// else under the job's own directory, jobs/<id>/rank_table.json, as the
// nodes keep the job's config in theirs.
func (m *rankTableModel) jobPath(id string) string {
	if m.path != "" {
		return m.path
	}
	return filepath.Join("jobs", id, "rank_table.json")
}

// devices returns the devices a node contributes: as edited here, else as
// the inventory says, else every device its probe found (one CPU worker
// for a node without GPUs).
func (m *rankTableModel) devices(r nodeRow) sshexec.Devices {
	if d, ok := m.edited[r.node.Name]; ok {
		return d
	}
	if r.node.Devices.Count() > 0 {
		return r.node.Devices
	}
	var d sshexec.Devices
	if r.probe != nil {
		for _, dev := range r.probe.Devices {
			d.IDs = append(d.IDs, dev.Index)
		}
		if len(d.IDs) == 0 {
			d.CPU = 1 // no GPU: one CPU worker with every core, as the runner does
		}
	}
	return d
}

// setDevices sets a node's devices from text such as "0-3,6" or "cpu:4".
func (m *rankTableModel) setDevices(node, text string) error {
	d, err := sshexec.ParseDevices(strings.TrimSpace(text))
	if err != nil {
		return fmt.Errorf("devices for %s: %w", node, err)
	}
	m.edited[node] = d
	return nil
}

// table builds the rank table of the ready nodes: a node that failed, was
// lost or is still being set up has no ranks.
func (m *rankTableModel) table(rows []nodeRow) *ranktable.Table {
	var in []ranktable.ServerInput
	for _, r := range rows {
		if !r.ready() {
			continue
		}
		d := m.devices(r)
		s := ranktable.ServerInput{ServerID: r.node.Host}
		if d.CPU > 0 {
			for i := range d.CPU {
				s.DeviceIDs = append(s.DeviceIDs, i)
			}
		} else {
			s.DeviceIDs = append(s.DeviceIDs, d.IDs...)
		}
		s.DeviceIPs = r.node.DeviceIPsFor(s.DeviceIDs)
		in = append(in, s)
	}
	return ranktable.Build(in)
}

// write saves the table to path.
func (m *rankTableModel) write(path string, t *ranktable.Table) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := ranktable.Write(path, t); err != nil {
		return err
	}
	m.at = path
	b, _ := t.MarshalJSON()
	m.saved = string(b)
	return nil
}

// dirty reports whether t differs from what was last written.
func (m *rankTableModel) dirty(t *ranktable.Table) bool {
	b, _ := t.MarshalJSON()
	return string(b) != m.saved
}

// update handles a key of the Rank table screen; it reports whether it
// used it, and what follows.
func (m *rankTableModel) update(msg tea.KeyPressMsg, k keyMap, rows []nodeRow, h host) (bool, tea.Cmd) {
	switch {
	case is(msg, k.Open, k.Edit) && len(rows) > 0:
		r := rows[min(m.sel, len(rows)-1)]
		return true, h.openPrompt(promptDevices, "devices of "+r.node.Name+": ", m.devices(r).String(), r.node.Name)
	case is(msg, k.Save):
		if err := m.write(m.savePath(), m.table(rows)); err != nil {
			h.say("rank table: " + err.Error())
		} else {
			h.say("wrote " + m.at)
		}
		return true, nil
	}
	return m.move(msg, k, len(rows)), nil
}

// move handles the keys that move the selection.
func (m *rankTableModel) move(msg tea.KeyPressMsg, k keyMap, n int) bool {
	switch {
	case is(msg, k.Up):
		m.sel = max(m.sel-1, 0)
	case is(msg, k.Down):
		m.sel = min(m.sel+1, max(n-1, 0))
	case is(msg, k.Top):
		m.sel = 0
	case is(msg, k.Bottom):
		m.sel = max(n-1, 0)
	default:
		return false
	}
	return true
}

// view draws the screen in w×h cells.
func (m *rankTableModel) view(st styles, rows []nodeRow, w, h int) []string {
	t := m.table(rows)
	nameW := 6
	for _, r := range rows {
		nameW = max(nameW, min(len(r.node.Name), 24))
	}
	head := fmt.Sprintf("  %-*s %-18s %-14s %-11s %s", nameW, "NODE", "SERVER_ID", "DEVICES", "RANKS", "DEVICE_IP")
	lines := []string{st.Bold.r(fit(head, w))}
	m.sel = min(m.sel, max(len(rows)-1, 0))

	// Each row's server in the table: only ready nodes have one.
	server := make([]int, len(rows))
	k := 0
	for i, r := range rows {
		server[i] = -1
		if r.ready() {
			server[i] = k
			k++
		}
	}
	// The selected node's devices, one per line, below the nodes.
	var detail []string
	if len(rows) > 0 {
		detail = append(detail, rule(st, "Devices of "+rows[m.sel].node.Name+"  (enter: edit the range, e.g. 0-7, 0-3,6 or cpu:4)", w, false))
		if si := server[m.sel]; si >= 0 {
			var cells []string
			for _, d := range t.Servers[si].Devices {
				cells = append(cells, fmt.Sprintf("dev %d → rank %d", d.DeviceID, d.RankID))
			}
			detail = append(detail, columns(cells, w, 2)...)
		} else {
			detail = append(detail, fit("  no ranks: the node is "+rows[m.sel].stateText()+", not ready (the Nodes screen retries it with R)", w))
		}
	}
	status := fmt.Sprintf("world size %d on the %d ready %s of %d", t.RankSize(), len(t.Servers), units.Plural(len(t.Servers), "node"), len(rows))
	if nr := (&nodesModel{rows: rows}).notReady(); nr != "" {
		status += " (not ready: " + nr + ")"
	}
	status += " · "
	if errs := ranktable.Check(t); len(errs) > 0 && t.RankSize() > 0 {
		status += "problem: " + errs[0].Error() + " · "
	}
	if m.dirty(t) {
		status += "not saved (w writes " + m.savePath() + ")"
	} else {
		status += "saved in " + m.at
	}
	room := max(h-1-len(detail)-2, 1)
	top := 0
	if m.sel >= room {
		top = m.sel - room + 1
	}
	for i := top; i < len(rows) && i < top+room; i++ {
		r := rows[i]
		mark := "  "
		if i == m.sel {
			mark = st.Sel.r("› ")
		}
		id, ranks, ip := r.node.Host, st.state(r.stateText()).r(r.stateText()), "-"
		if si := server[i]; si >= 0 {
			srv := t.Servers[si]
			id, ranks = srv.ServerID, "-"
			if lo, hi := t.DeviceRange(si); hi > lo {
				ranks = fmt.Sprintf("%d-%d", lo, hi-1)
			}
			if len(srv.Devices) > 0 {
				ip = srv.Devices[0].DeviceIP
			}
		}
		dev := m.devices(r).String()
		if _, ok := m.edited[r.node.Name]; ok {
			dev += "*"
		}
		if dev == "" {
			dev = "none"
		}
		lines = append(lines, fit(mark+fmt.Sprintf("%-*s %-18s %-14s ", nameW, trunc(r.node.Name, nameW), trunc(id, 18), trunc(dev, 14))+fit(ranks, 11)+" "+ip, w))
	}
	if len(rows) == 0 {
		lines = append(lines, fit("  no nodes", w))
	}
	lines = append(lines, "")
	for _, l := range wrap(status, w-2) {
		lines = append(lines, fit("  "+l, w))
	}
	for len(lines) < h-len(detail) {
		lines = append(lines, "")
	}
	return append(lines, detail...)
}

// columns lays cells out in as many columns as fit in w, at most maxRows
// rows; what does not fit is summarised on the last row.
func columns(cells []string, w, maxRows int) []string {
	if len(cells) == 0 {
		return []string{fit("  none", w)}
	}
	cw := 0
	for _, c := range cells {
		cw = max(cw, len(c))
	}
	cw += 3
	per := max((w-2)/cw, 1)
	var out []string
	for i := 0; i < len(cells); i += per {
		if len(out) == maxRows-1 && i+per < len(cells) {
			out = append(out, fit(fmt.Sprintf("  … and %d more", len(cells)-i), w))
			break
		}
		var b strings.Builder
		b.WriteString("  ")
		for j := i; j < min(i+per, len(cells)); j++ {
			fmt.Fprintf(&b, "%-*s", cw, cells[j])
		}
		out = append(out, fit(b.String(), w))
	}
	return out
}
