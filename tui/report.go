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
	path         string
	ranks, marks int
	err          error
}

// writeReport returns the command that draws the job's metrics as the
// report picture of `gptui report` (package report), from the steps every
// rank's history keeps across the job's attempts (thinned out on long
// runs, as the loss curve is), with the restarts, failures, hangs and
// lost nodes marked, and writes it to the report path. The records are
// copied here, so the command shares nothing with the model.
func (m *dashModel) writeReport(h host) tea.Cmd {
	runs := report.Runs{}
	for r, hs := range m.hist {
		var ms []event.Metrics
		for _, s := range hs.train.pts {
			ms = append(ms, s.metrics())
		}
		for _, s := range hs.evals.pts {
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
	path, title, marks := h.reportPath(), "gptui "+m.job, m.marks.Marks()
	h.say("writing " + path + "…")
	return func() tea.Msg {
		err := report.WriteFile(path, runs, report.Options{Width: 1200, Height: 900, Title: title, Marks: marks})
		return reportMsg{path: path, ranks: len(runs), marks: len(marks), err: err}
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
	m.status = fmt.Sprintf("wrote %s: 1200×900 pixels, %d ranks, %d marks (the same picture as gptui report)", p, msg.ranks, msg.marks)
}

// reportPath is where w writes the report picture.
func (m *Model) reportPath() string { return m.opt.ReportPath }
