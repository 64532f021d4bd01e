package tui

import (
	"fmt"
	"strings"

	tea "charm.land/bubbletea/v2"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/planner"
	"github.com/gptui/gptui/presets"
)

// planState is the planner's answer for the job as the Job screen has it,
// kept in the model: the planner runs in a command when the request
// changes (replan), and its answer comes back as a planMsg. Drawing the
// Job screen only reads it.
type planState struct {
	asked  string // the key of the request asked last
	key    string // the key of the request report and err answer
	report *PlanReport
	err    error
	calls  int // planner calls started, for the tests
}

// planMsg is the planner's answer to the request with key.
type planMsg struct {
	key    string
	report *PlanReport
	err    error
}

// pending reports whether the planner is working on a newer request than
// the answer kept.
func (p *planState) pending() bool { return p.asked != p.key }

// planRequest returns the request for the job as it stands and its key;
// the key is "" when there is nothing to plan (no planner, or a config
// that does not resolve), and err is set, with the key, when the request
// cannot be planned (no ready node, a GPU config on CPU nodes).
func (m *Model) planRequest() (req PlanRequest, key string, err error) {
	if m.opt.Plan == nil || m.job.cfg == nil {
		return req, "", nil
	}
	table := m.rankTable.table(m.nodes.rows)
	probes := m.nodes.readyProbes()
	dev, err := planDevice(m.job.cfg, m.nodes.readyNames(), probes)
	req = PlanRequest{Config: m.job.source, Overrides: m.job.overrides, Resolved: m.job.cfg, Table: table, Probes: probes, Device: dev}
	b, _ := table.MarshalJSON()
	key = fmt.Sprintf("%q %q %s %s", req.Config, req.Overrides, b, dev)
	if err != nil {
		key += " " + err.Error()
	}
	return req, key, err
}

// replan asks the planner about the job again if the request has changed
// since it was asked last: it returns the command that runs the planner,
// or nil. A request that cannot be planned is answered at once.
func (m *Model) replan() tea.Cmd {
	req, key, err := m.planRequest()
	if key == m.plan.asked {
		return nil
	}
	m.plan.asked = key
	if key == "" || err != nil {
		m.plan.key, m.plan.report, m.plan.err = key, nil, err
		return nil
	}
	m.plan.calls++
	plan := m.opt.Plan
	return func() tea.Msg {
		r, err := plan(req)
		return planMsg{key: key, report: r, err: err}
	}
}

// onPlan keeps the planner's answer if it is for the request asked last.
func (m *Model) onPlan(msg planMsg) {
	if msg.key != m.plan.asked {
		return // an answer to an older request
	}
	m.plan.key, m.plan.report, m.plan.err = msg.key, msg.report, msg.err
	m.job.sel = min(m.job.sel, m.job.launchRow()+m.plans()) // the plans may have changed
}

// plans returns the number of ranked plans kept.
func (m *Model) plans() int { return len(m.planReport().Plans) }

// planReport returns the kept report, or an empty one.
func (m *Model) planReport() *PlanReport {
	if m.plan.report == nil {
		return &PlanReport{}
	}
	return m.plan.report
}

// planDevice returns the planner's device profile for a job of cfg on the
// ready nodes (names, with their probes): the cpu profile for a job on the
// CPU, whatever the nodes have; for a GPU job the profile of the first GPU
// the probes name (for one it does not know, planner.DefaultProfile's,
// as 'gptui plan' takes). A GPU job on nodes without GPUs is an error that says which
// nodes have none and what to do.
func planDevice(cfg *presets.Config, names []string, probes map[string]*event.Probe) (string, error) {
	if cfg.Global.Device == "cpu" {
		return "cpu", nil
	}
	if len(names) == 0 {
		return "", fmt.Errorf("no node is ready yet, so there are no devices to plan for (see the Nodes screen)")
	}
	var none []string
	profile := ""
	for _, n := range names {
		p := probes[n]
		if p == nil {
			continue
		}
		if len(p.Devices) == 0 {
			why := fmt.Sprintf("%s (%d cores", n, p.Cores)
			if p.NoGPU != "" {
				why += "; " + p.NoGPU
			}
			none = append(none, why+")")
			continue
		}
		if profile == "" {
			profile = planner.ProfileForGPU(p.Devices[0].Name, p.Devices[0].MemTotal)
		}
	}
	if len(none) > 0 {
		verb := "has"
		if len(none) > 1 {
			verb = "have"
		}
		return "", fmt.Errorf("the config trains on GPUs (Global.device: %s), but %s %s no GPU: set -o Global.device=cpu to train on their CPUs, or use nodes with GPUs",
			cfg.Global.Device, strings.Join(none, " and "), verb)
	}
	if profile == "" {
		profile = planner.DefaultProfile(cfg.Global.Device, cfg.Engine.MixPrecision.Dtype)
	}
	return profile, nil
}
