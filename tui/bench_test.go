package tui

import (
	"testing"

	"github.com/gptui/gptui/event"
)

// BenchmarkDashboard64Ranks renders one frame of the dashboard of a 64-rank
// job with 1,000 loss points, 64 memory bars and a full log pane, in colour
// at 140×40. A frame must take well under 20 ms.
func BenchmarkDashboard64Ranks(b *testing.B) {
	m := trainingJob(b, 64, 1000, 140, 40)
	m.st = newStyles(true)
	if len(m.dash.train.pts) != 1000 || len(m.dash.ranks) != 64 || len(m.dash.mem) != 64 {
		b.Fatalf("fixture: %d points, %d ranks, %d memory bars", len(m.dash.train.pts), len(m.dash.ranks), len(m.dash.mem))
	}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		// A memory report arrives between frames, as it does every second.
		i++
		m.dash.apply(ev(event.KindMemory, 0, func(e *event.Event) {
			e.Node, e.Rank, e.Device, e.Used, e.Total = "localhost", i%64, -1, int64(i%1000)<<20, 64<<30
		}))
		_ = m.View()
	}
}
