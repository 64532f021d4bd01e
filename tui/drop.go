package tui

import (
	"fmt"
	"slices"
	"strings"

	tea "charm.land/bubbletea/v2"

	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/planner"
	"github.com/gptui/gptui/presets"
)

// Dropping a lost node (D on the dashboard) is what a restart does with
// --min-nodes (cluster.Supervisor), by hand, once the job has ended: the
// node leaves the job, the job is re-planned for the ranks of the nodes
// left (cluster.Reshape: data parallelism and gradient accumulation
// change, the global batch stays), the overrides that make it so replace
// the job's on the Job screen, and the job resumes from its newest
// checkpoint. R on the Nodes screen takes a dropped node back.

// drop is a planned drop: the nodes to leave out and the job's overrides
// without them.
type drop struct {
	nodes     []string // the lost nodes
	again     []string // the nodes left whose setup a restart stopped: set up again first
	overrides []string
	how       string // the re-plan, as the question says it
}

// planDrop plans leaving out the nodes the job lost; a problem is a
// sentence saying why it cannot be done.
func (m *Model) planDrop() (*drop, string) {
	lost := m.dash.lostNodes()
	switch {
	case len(lost) == 0:
		return nil, "no node was lost: D drops a lost node and resumes the job on the nodes left"
	case m.busy():
		return nil, "the job still runs (a restart may be trying the node): s stops it, then D drops " + strings.Join(lost, ", ")
	case m.job.cfg == nil:
		return nil, "the config does not resolve: fix it on the Job screen (3) first"
	}
	// The nodes left: ready, or set up before and stopped since only
	// because a restart gave up on the lost node.
	rows := slices.Clone(m.nodes.rows)
	left := 0
	d := &drop{nodes: lost}
	for i := range rows {
		r := &rows[i]
		switch {
		case slices.Contains(lost, r.node.Name):
			r.dropped = true
		case r.state == event.NodeStopped && r.probe != nil && !r.dropped:
			r.state = event.NodeReady
			d.again = append(d.again, r.node.Name)
			left++
		case r.ready():
			left++
		}
	}
	if left == 0 {
		return nil, fmt.Sprintf("no node is left ready without %s: set one up again with R on the Nodes screen (1)", strings.Join(lost, ", "))
	}
	ranks := m.ranks.table(rows).RankSize()
	was := m.job.cfg
	c := *was
	if err := cluster.Reshape(&c, ranks); err != nil {
		return nil, fmt.Sprintf("cannot re-plan the job for the %d ranks left: %v", ranks, err)
	}
	gb := was.Global.GlobalBatchSize
	d.overrides = planner.ApplyOverrides(m.job.overrides, planner.Overrides(planner.StrategyOf(&c), gb), planner.Overrides(planner.StrategyOf(was), gb))
	if _, err := presets.Load(m.job.source, d.overrides); err != nil {
		return nil, fmt.Sprintf("cannot re-plan the job for the %d ranks left: %v", ranks, err)
	}
	d.how = fmt.Sprintf("%d %s, %d ranks: %s → %s, accumulate %d (global batch %d kept)", left, plural(left, "node"), ranks,
		planner.StrategyOf(was), planner.StrategyOf(&c), c.Global.LocalBatchSize/max(c.Global.MicroBatchSize, 1), gb)
	return d, ""
}

// askDrop asks to drop the lost nodes and resume on the others.
func (m *Model) askDrop() tea.Cmd {
	d, problem := m.planDrop()
	if problem != "" {
		m.status = problem
		return nil
	}
	m.ask(fmt.Sprintf("Drop %s and resume from the newest checkpoint on the nodes left (%s)?", strings.Join(d.nodes, ", "), d.how), func() tea.Cmd {
		for i := range m.nodes.rows {
			if slices.Contains(d.nodes, m.nodes.rows[i].node.Name) {
				m.nodes.rows[i].dropped = true
			}
		}
		m.job.overrides = d.overrides
		m.job.resolve()
		if len(d.again) == 0 {
			return m.launch(true)
		}
		m.status = "setting " + strings.Join(d.again, ", ") + " up again, then resuming the job…"
		cmd := m.probe(ProbeRequest{Nodes: d.again})
		m.dropProbe = m.probeN
		return cmd
	})
	return nil
}

// dropped is what follows the end of probe stream: after the probe of a
// drop, the job resumes on the nodes left (launch says why not, if it
// cannot).
func (m *Model) dropped(stream int) tea.Cmd {
	if stream != m.dropProbe || m.dropProbe == 0 {
		return nil
	}
	m.dropProbe = 0
	return m.launch(true)
}
