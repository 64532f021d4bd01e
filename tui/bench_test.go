package tui

import (
	"strings"
	"testing"
	"time"

	"github.com/gptui/gptui/event"
)

// BenchmarkDashboard64Ranks renders one frame of the dashboard of a 64-rank
// job with 1,000 loss points, 64 memory bars, every rank's last 64 steps
// in the ranks pane's heat strip and a full log pane, in colour at 140×40.
// Between frames a memory report and a step of one rank arrive and are
// settled (the slowest rank found again), as they do while a job runs. A
// frame must take well under 20 ms.
func BenchmarkDashboard64Ranks(b *testing.B) {
	m := trainingJob(b, 64, 1000, 140, 40)
	m.st = newStyles(true)
	if len(m.dash.train.pts) != 1000 || len(m.dash.ranks) != 64 || len(m.dash.mem) != 64 {
		b.Fatalf("fixture: %d points, %d ranks, %d memory bars", len(m.dash.train.pts), len(m.dash.ranks), len(m.dash.mem))
	}
	for r := range m.dash.ranks {
		if n := len(m.dash.ranks[r].recent); n != recentSteps {
			b.Fatalf("rank %d keeps %d steps for the heat strip, want %d", r, n, recentSteps)
		}
	}
	if !strings.Contains(m.Render(), "▅▅▅▅▅▅▅▅▅▅") {
		b.Fatal("no heat strip on the screen")
	}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		i++
		m.dash.apply(ev(event.KindMemory, 0, func(e *event.Event) {
			e.Node, e.Rank, e.Device, e.Used, e.Total = "localhost", i%64, -1, int64(i%1000)<<20, 64<<30
		}), time.Time{})
		m.dash.apply(ev(event.KindMetrics, 0, func(e *event.Event) {
			e.Node, e.Rank = "localhost", i%64
			e.Metrics = &event.Metrics{Step: 1000 + i/64, Loss: 4, StepTimeS: 0.25, CommS: 0.1, TokensPerS: 12345}
		}), time.Time{})
		m.dash.settle(t0)
		_ = m.View()
	}
}
