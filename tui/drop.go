package tui

import (
	"fmt"
	"slices"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/gptui/gptui/agent"
	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/planner"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/units"
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
	ranks := m.rankTable.table(rows).RankSize()
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
	d.how = fmt.Sprintf("%d %s, %d ranks: %s → %s, accumulate %d (global batch %d kept)", left, units.Plural(left, "node"), ranks,
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
		m.continues = m.owner // its lingering locks are the resumed job's
		if len(d.again) == 0 {
			return m.launch(true)
		}
		m.drop = dropState{nodes: d.again, until: m.now.Add(dropWait)}
		return m.retryDrop()
	})
	return nil
}

// dropWait bounds how long a drop tries to set the nodes left up again.
// The workdir locks the failed job's last attempt keeps for a restart
// that did not come are the resumed job's own (ProbeRequest.Continues);
// what a retry waits out is a node still winding the failed job down, or
// a lock the failed job's attempt has not yet released to its restart
// (agent.LockLinger bounds both).
const dropWait = agent.LockLinger + 5*time.Second

// dropState is a drop setting the nodes left up again before the job
// resumes.
type dropState struct {
	nodes []string  // the nodes to set up again
	probe int       // the probe under way; 0 for none
	until time.Time // when to give up, by the model's clock
}

// dropRetryMsg is the time to set the nodes left up again once more.
type dropRetryMsg struct{}

// retryDrop sets the nodes left up again.
func (m *Model) retryDrop() tea.Cmd {
	if len(m.drop.nodes) == 0 {
		return nil
	}
	m.status = "setting " + strings.Join(m.drop.nodes, ", ") + " up again, then resuming the job…"
	cmd := m.probe(ProbeRequest{Nodes: m.drop.nodes, Continues: m.continues})
	m.drop.probe = m.probeN
	return cmd
}

// dropped is what follows the end of probe stream: after the probe of a
// drop, the job resumes on the nodes left once they are ready (launch
// says why not, if it cannot); until then they are set up again every
// cluster.RetryDelay, for dropWait at most.
func (m *Model) dropped(stream int) tea.Cmd {
	if m.drop.probe == 0 || stream != m.drop.probe {
		return nil
	}
	m.drop.probe = 0
	var not []string
	for _, r := range m.nodes.rows {
		if slices.Contains(m.drop.nodes, r.node.Name) && !r.ready() {
			not = append(not, r.node.Name+" "+r.stateText())
		}
	}
	if len(not) == 0 {
		m.drop = dropState{}
		return m.launch(true)
	}
	if m.now.After(m.drop.until) {
		m.drop = dropState{}
		m.status = "could not set " + strings.Join(not, ", ") + " up again: see the Nodes screen (1), then r resumes the job"
		return nil
	}
	m.status = strings.Join(not, ", ") + ": setting it up again in a moment…"
	return tea.Tick(cluster.RetryDelay, func(time.Time) tea.Msg { return dropRetryMsg{} })
}
