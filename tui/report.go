package tui

import (
	"fmt"
	"path/filepath"
	"slices"

	tea "charm.land/bubbletea/v2"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/report"
)

// reportMsg says how writing the report picture went.
type reportMsg struct {
	path  string
	ranks int
	err   error
}

// writeReport returns the command that draws the job's metrics as the
// report picture of `gptui report` (package report), from the steps every
// rank's history keeps (thinned out on long runs, as the loss curve is),
// and writes it to the report path. The records are copied here, so the
// command shares nothing with the model.
func (m *dashModel) writeReport(h host) tea.Cmd {
	runs := report.Runs{}
	for r := range m.ranks {
		rs := &m.ranks[r]
		if rs.hist == nil {
			continue
		}
		var ms []event.Metrics
		for _, s := range rs.hist.pts {
			ms = append(ms, s.metrics())
		}
		for _, s := range rs.evals.pts {
			ms = append(ms, s.metrics())
		}
		slices.SortStableFunc(ms, func(a, b event.Metrics) int { return a.Step - b.Step })
		if len(ms) > 0 {
			runs[r] = ms
		}
	}
	if len(runs) == 0 {
		h.say("no metrics yet: the report needs a logged step")
		return nil
	}
	path, title := h.reportPath(), "gptui "+m.job
	h.say("writing " + path + "…")
	return func() tea.Msg {
		err := report.WriteFile(path, runs, report.Options{Width: 1200, Height: 900, Title: title})
		return reportMsg{path: path, ranks: len(runs), err: err}
	}
}

// onReport says where the report went.
func (m *Model) onReport(msg reportMsg) {
	if msg.err != nil {
		m.status = msg.err.Error()
		return
	}
	p, err := filepath.Abs(msg.path)
	if err != nil {
		p = msg.path
	}
	m.status = fmt.Sprintf("wrote %s: 1200×900 pixels, %d ranks (the same picture as gptui report)", p, msg.ranks)
}

// reportPath is where w writes the report picture.
func (m *Model) reportPath() string { return m.opt.ReportPath }
