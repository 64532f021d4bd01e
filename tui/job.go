package tui

import (
	"fmt"
	"strings"

	tea "charm.land/bubbletea/v2"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/ranktable"
)

// jobModel is the Job screen: the preset or config file, its -o overrides,
// the strategy they resolve to, the planner's estimate, and the launch.
type jobModel struct {
	source    string   // preset name or config file
	overrides []string // Section.key=value
	sel       int      // row: 0 the config, then the overrides, then add, then launch

	cfg *presets.Config // source with overrides, resolved; nil if err
	err error
}

func newJobModel(source string, overrides []string) jobModel {
	m := jobModel{source: source, overrides: append([]string(nil), overrides...)}
	m.resolve()
	m.sel = m.launchRow()
	return m
}

// resolve loads the config again after a change.
func (m *jobModel) resolve() {
	if m.source == "" {
		m.cfg, m.err = nil, fmt.Errorf("no config: press enter on the Config row and give a preset name or a YAML file")
		return
	}
	m.cfg, m.err = presets.Load(m.source, m.overrides)
}

// Row kinds.
func (m *jobModel) addRow() int    { return len(m.overrides) + 1 }
func (m *jobModel) launchRow() int { return len(m.overrides) + 2 }

// ranks returns the number of ranks the strategy needs, 0 without a config.
func (m *jobModel) ranks() int {
	if m.cfg == nil {
		return 0
	}
	d := m.cfg.Distributed
	return max(d.DPDegree, 1) * max(d.Sharding.ShardingDegree, 1) * max(d.MPDegree, 1) * max(d.PPDegree, 1)
}

// setOverride replaces override i (or adds one when i is len) with kv; an
// empty kv deletes it.
func (m *jobModel) setOverride(i int, kv string) error {
	kv = strings.TrimSpace(kv)
	if kv != "" && !strings.Contains(kv, "=") {
		return fmt.Errorf("override %q: want Section.key=value, such as Engine.max_steps=100", kv)
	}
	switch {
	case kv == "" && i < len(m.overrides):
		m.overrides = append(m.overrides[:i], m.overrides[i+1:]...)
	case kv == "":
	case i < len(m.overrides):
		m.overrides[i] = kv
	default:
		m.overrides = append(m.overrides, kv)
	}
	m.resolve()
	return nil
}

// update handles a key; it reports whether it used it.
func (m *jobModel) update(msg tea.KeyPressMsg, k keyMap) bool {
	switch {
	case is(msg, k.Up):
		m.sel = max(m.sel-1, 0)
	case is(msg, k.Down):
		m.sel = min(m.sel+1, m.launchRow())
	case is(msg, k.Top):
		m.sel = 0
	case is(msg, k.Bottom):
		m.sel = m.launchRow()
	case is(msg, k.Delete) && m.sel >= 1 && m.sel <= len(m.overrides):
		m.setOverride(m.sel-1, "")
		m.sel = min(m.sel, m.launchRow())
	default:
		return false
	}
	return true
}

// strategy describes the parallel layout in one line.
func (m *jobModel) strategy(tableRanks int) string {
	if m.cfg == nil {
		return ""
	}
	d := m.cfg.Distributed
	s := fmt.Sprintf("dp %d × sharding %d (stage %d) × mp %d × pp %d = %d ranks",
		max(d.DPDegree, 1), max(d.Sharding.ShardingDegree, 1), max(d.Sharding.ShardingStage, 1), max(d.MPDegree, 1), max(d.PPDegree, 1), m.ranks())
	if tableRanks == m.ranks() {
		return s + fmt.Sprintf(" · rank table: %d ✓", tableRanks)
	}
	return s + fmt.Sprintf(" · rank table has %d: set -o Distributed.dp_degree or edit the rank table", tableRanks)
}

// view draws the screen in w×h cells.
func (m *jobModel) view(st styles, table *ranktable.Table, probes map[string]*event.Probe, plan Planner, w, h int) []string {
	var lines []string
	row := func(i int, label, text string) {
		mark := "  "
		if i == m.sel {
			mark = st.Sel.r("› ")
		}
		lines = append(lines, fit(mark+fmt.Sprintf("%-10s ", label)+text, w))
	}
	row(0, "Config", m.source+st.Dim.r("   (enter: edit; a preset name or a YAML file)"))
	for i, o := range m.overrides {
		row(i+1, "-o", o)
	}
	row(m.addRow(), "", st.Dim.r("+ add an override (enter or a; d deletes the selected one)"))
	launch := "[ Launch ]"
	if m.sel == m.launchRow() {
		launch = st.Sel.r(launch)
	}
	row(m.launchRow(), "", launch+st.Dim.r("   (enter)"))

	lines = append(lines, "", rule(st, "Strategy", w, false))
	add := func(s string) {
		for _, l := range wrap(s, w-2) {
			lines = append(lines, fit("  "+l, w))
		}
	}
	if m.err != nil {
		add(st.Bad.r("✗ ") + m.err.Error())
	} else {
		c := m.cfg
		add(m.strategy(table.RankSize()))
		add(fmt.Sprintf("model: %d layers, hidden %d, %d heads, seq %d, vocab %d · batch: global %d, local %d, micro %d",
			c.Model.NumLayers, c.Model.HiddenSize, c.Model.NumAttentionHeads, c.Data.Train.Dataset.MaxSeqLen, c.Model.VocabSize,
			c.Global.GlobalBatchSize, c.Global.LocalBatchSize, c.Global.MicroBatchSize))
		add(fmt.Sprintf("%d steps, log every %d, eval every %d · device %s · log_dir %s · checkpoints every %d in %s",
			c.Engine.MaxSteps, c.Engine.LoggingFreq, c.Engine.EvalFreq, c.Global.Device, c.Engine.LogDir, c.Engine.SaveLoad.SaveSteps, c.Engine.SaveLoad.OutputDir))
	}

	lines = append(lines, "", rule(st, "Plan: memory per device", w, false))
	switch {
	case plan == nil:
		add(st.Dim.r("no planner: run 'gptui plan' for the per-device memory estimate"))
	case m.cfg == nil:
	default:
		pl, fits, err := plan(m.cfg, table, probes)
		if err != nil {
			add(st.Bad.r("✗ ") + err.Error())
			break
		}
		for _, l := range pl {
			add(l)
		}
		if fits {
			add(st.OK.r("✓ fits"))
		} else {
			add(st.Bad.r("✗ does not fit"))
		}
	}
	if len(lines) > h {
		lines = lines[:h]
	}
	return lines
}
