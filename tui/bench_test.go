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

// BenchmarkDashboard1024Ranks measures the dashboard of a 1,024-rank job
// (1,000 loss points, 1,024 memory bars, every rank's last 64 steps, a
// full log pane) in colour at 140×40, in its steady state.
//
// frame is what the UI does for each frame while the job runs: a batch
// of a memory report and a step of one rank arrives (Update, which
// settles it), then the screen is drawn (View). A frame must take at
// most 5 ms and make at most 50 allocations.
//
// event is the cost of one event that arrives alone: the Update of a
// progress report, a step or a memory report of one rank, with the
// settle it triggers, and no drawing. It must take at most 20 µs.
func BenchmarkDashboard1024Ranks(b *testing.B) {
	b.Run("frame", func(b *testing.B) {
		j := newBigJob(b, 1024, 1000)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			j.frame(i)
		}
	})
	b.Run("event", func(b *testing.B) {
		j := newBigJob(b, 1024, 1000)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			j.event(i)
		}
	})
}

// TestDashboard1024RanksAllocs: at 1,024 ranks a frame makes at most 50
// allocations, and an event that arrives alone at most 10: the dashboard
// draws into one buffer, and settles the event's rank alone.
func TestDashboard1024RanksAllocs(t *testing.T) {
	j := newBigJob(t, 1024, 200)
	i := 0
	if n := testing.AllocsPerRun(100, func() { j.frame(i); i++ }); n > 50 {
		t.Errorf("%.0f allocations a frame, want at most 50", n)
	}
	if n := testing.AllocsPerRun(300, func() { j.event(i); i++ }); n > 10 {
		t.Errorf("%.0f allocations an event, want at most 10", n)
	}
}

// bigJob is the dashboard of a job of many ranks in its steady state
// (trainingJob, in colour at 140×40), and the events that keep coming:
// each rank's progress report, step and memory report in turn. The events
// are made once and changed in place: the dashboard keeps copies, never
// the events themselves.
type bigJob struct {
	m                         *Model
	ranks, points             int
	mt                        *event.Metrics
	prog                      *event.Progress
	metrics, memory, progress event.Event
	batch                     []event.Event
}

func newBigJob(tb testing.TB, ranks, points int) *bigJob {
	tb.Helper()
	m := trainingJob(tb, ranks, points, 140, 40)
	m.st = newStyles(true)
	if len(m.dash.train.pts) != points || len(m.dash.ranks) != ranks || len(m.dash.mem) != ranks {
		tb.Fatalf("fixture: %d points, %d ranks, %d memory bars", len(m.dash.train.pts), len(m.dash.ranks), len(m.dash.mem))
	}
	if !strings.Contains(m.Render(), "▅▅▅▅▅▅▅▅▅▅") {
		tb.Fatal("no heat strip on the screen")
	}
	j := &bigJob{m: m, ranks: ranks, points: points, batch: make([]event.Event, 2),
		mt:   &event.Metrics{Loss: 4, StepTimeS: 0.25, CommS: 0.1, TokensPerS: 12345},
		prog: &event.Progress{InFlight: []event.Op{{Group: "dp", Op: "AllReduce", Seq: 2003, WaitS: 0.2}}},
	}
	sec := float64(points + 1)
	j.metrics = ev(event.KindMetrics, sec, func(e *event.Event) { e.Node, e.Metrics = "localhost", j.mt })
	j.memory = ev(event.KindMemory, sec, func(e *event.Event) { e.Node, e.Device, e.Total = "localhost", -1, 64<<30 })
	j.progress = ev(event.KindProgress, sec, func(e *event.Event) { e.Node, e.Progress = "localhost", j.prog })
	return j
}

// next sets the events of the i-th round: of rank i%ranks, in the step
// after the fixture's points plus i/ranks.
func (j *bigJob) next(i int) {
	r, s := i%j.ranks, j.points+1+i/j.ranks
	j.metrics.Rank, j.mt.Step = r, s
	j.memory.Rank, j.memory.Used = r, int64(1+i%1000)<<20
	j.progress.Rank, j.prog.Step, j.prog.Ops = r, s+1, int64(2*s)
}

// frame is the i-th frame: a batch of a memory report and a step of one
// rank arrives, then the screen is drawn.
func (j *bigJob) frame(i int) {
	j.next(i)
	j.batch = append(j.batch[:0], j.memory, j.metrics)
	j.m.Update(eventsMsg{stream: j.m.jobN, events: j.batch})
	_ = j.m.View()
}

// event is the i-th event, alone: a progress report, a step or a memory
// report of rank i/3%ranks in turn.
func (j *bigJob) event(i int) {
	j.next(i / 3)
	j.batch = append(j.batch[:0], [3]event.Event{j.progress, j.metrics, j.memory}[i%3])
	j.m.Update(eventsMsg{stream: j.m.jobN, events: j.batch})
}
