package tui

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/x/ansi"

	"github.com/gptui/gptui/event"
)

// TestPaceIndex: what settle keeps event by event — each rank's silence,
// the verdict on the slowest rank, the order of the ranks pane, the
// states counted and the widths of the node and collective columns — is
// what going through every rank afresh finds (as the dashboard did before
// it kept an index: findSlowest and the rest below), through random runs
// of a job: steps of equal and unequal pace, progress reports, silences
// and stalls, workers failing and stopping, nodes lost and back, restarts,
// the job's end, the clock, and the order switched.
func TestPaceIndex(t *testing.T) {
	for seed := range 34 {
		rng := rand.New(rand.NewPCG(uint64(seed), 9))
		ranks, batch, rounds := 1+rng.IntN(24), 4, 600
		if seed >= 30 {
			ranks, batch, rounds = 300, 200, 100 // batches that name many ranks
		}
		m := newDashModel(100, 100)
		node := func(r int) string { return fmt.Sprintf("node%d-%s", r%3, strings.Repeat("x", r%5)) }
		sec := 0.0
		at := func() time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }
		now := at()
		m.apply(ev(event.KindJob, 0, func(e *event.Event) { e.State = event.JobStarted }), time.Time{})
		m.settle(now)
		steps := make([]int, ranks)
		computes := []float64{0.05, 0.1, 0.1, 0.15, 0.2, 0.3}
		for i := range rounds {
			for range 1 + rng.IntN(batch) {
				sec += rng.Float64() * 0.3
				r := rng.IntN(ranks)
				e := event.New(event.KindMetrics)
				e.Time, e.Rank, e.Node = at(), r, node(r)
				switch k := rng.IntN(100); {
				case k < 45:
					steps[r]++
					if rng.IntN(30) == 0 {
						steps[r] = max(steps[r]-3, 1) // resumed from an earlier step
					}
					st := 0.25 + 0.05*float64(rng.IntN(3))
					e.Metrics = &event.Metrics{Step: steps[r], StepTimeS: st, CommS: max(st-computes[rng.IntN(len(computes))], 0), TokensPerS: 1000}
				case k < 75:
					e.Kind = event.KindProgress
					e.Progress = &event.Progress{Step: steps[r] + 1}
					if rng.IntN(2) == 0 {
						e.Progress.InFlight = []event.Op{{Group: "dp", Op: "AllReduce", Seq: int64(rng.IntN(1000)), WaitS: 100 * rng.Float64()}}
					}
				case k < 88:
					e.Kind = event.KindWorker
					e.State = []string{event.WorkerStarting, event.WorkerRunning, event.WorkerRunning, event.WorkerExited, event.WorkerFailed, event.WorkerStopped}[rng.IntN(6)]
					e.Code = rng.IntN(2)
				case k < 92:
					e.Kind, e.Rank = event.KindNode, -1
					e.State = []string{event.NodeLost, event.NodeReady}[rng.IntN(2)]
				case k < 97:
					e.Kind, e.Rank, e.Node = event.KindJob, -1, ""
					e.State = []string{event.JobStarted, event.JobStarted, event.JobRestarting, event.JobHung, event.JobFailed, event.JobStopped}[rng.IntN(6)]
					if e.State == event.JobRestarting {
						e.Restart = &event.Restart{Count: 1, Max: 3, Step: 1}
					}
					if e.State == event.JobFailed || e.State == event.JobHung {
						e.Rank = r
					}
				default:
					e.Kind, e.Line = event.KindLog, "a line"
				}
				m.apply(e, time.Time{})
			}
			switch rng.IntN(8) {
			case 0:
				sec += rng.Float64() * 4
				if rng.IntN(6) == 0 {
					sec += 15 + rng.Float64()*20
				}
				now = at()
			case 1:
				m.bySlow = !m.bySlow
			case 2:
				m.state = []string{event.JobStarted, "stopping", ""}[rng.IntN(3)]
			}
			m.settle(now)
			checkPace(t, fmt.Sprintf("seed %d, round %d", seed, i), &m, now)
		}
	}
}

// checkPace compares what settle kept with what going through every rank
// at now finds.
func checkPace(t *testing.T, at string, m *dashModel, now time.Time) {
	t.Helper()
	ranks := slices.Clone(m.ranks)
	for i := range ranks {
		r := &ranks[i]
		r.silent = 0
		if d := now.Sub(r.heard); r.state == rankRunning && !r.heard.IsZero() && d > silentAfter && m.running() {
			r.silent = d
		}
		if r.silent != m.ranks[i].silent {
			t.Fatalf("%s: rank %d silent %v, want %v", at, i, m.ranks[i].silent, r.silent)
		}
	}
	if want := findSlowest(ranks, now); m.slow != want {
		t.Fatalf("%s: slowest %+v, want %+v", at, m.slow, want)
	}
	order := make([]int, len(ranks))
	for i := range order {
		order[i] = i
	}
	if m.bySlow {
		key := func(i int) float64 {
			r := &ranks[i]
			if r.silent > 0 {
				return 1e9 + r.silent.Seconds()
			}
			c, ok := r.medianCompute()
			if !ok {
				return -1
			}
			if r.stall.secs > 0 && now.Sub(r.stall.at) <= stallHold {
				c += r.stall.secs
			}
			return c
		}
		sort.SliceStable(order, func(a, b int) bool { return key(order[a]) > key(order[b]) })
	}
	if !slices.Equal(m.order, order) {
		t.Fatalf("%s: order %v, want %v", at, m.order, order)
	}
	c := newCanvas(80, 1)
	m.stateCounts(c, newStyles(false))
	if got, want := string(c.b), counts(ranks); got != want {
		t.Fatalf("%s: counts %q, want %q", at, got, want)
	}
	nodeW, collW := 0, 0
	for i := range ranks {
		nodeW = max(nodeW, ansi.StringWidth(ranks[i].node))
		collW = max(collW, ansi.StringWidth(collective(&ranks[i])))
	}
	if got, want := widest(&m.pace.nodeW), min(nodeW, flexMax); got != want {
		t.Fatalf("%s: widest node %d, want %d", at, got, want)
	}
	if got, want := widest(&m.pace.collW), min(collW, flexMax); got != want {
		t.Fatalf("%s: widest collective %d, want %d", at, got, want)
	}
}

// findSlowest gives the verdict on the ranks at now going through every
// rank, as settle did before it kept an index (see paceIndex.verdict).
func findSlowest(ranks []rankState, now time.Time) slowest {
	s := slowest{rank: -1}
	for i := range ranks {
		if r := &ranks[i]; r.silent > s.silent {
			s.rank, s.silent = i, r.silent
		}
	}
	var meds, steps []float64
	for i := range ranks {
		if m, ok := ranks[i].medianCompute(); ok {
			meds = append(meds, m)
			steps = append(steps, ranks[i].last.StepTimeS)
		}
	}
	s.typical = median(slices.Clone(meds))
	if s.rank >= 0 {
		return s
	}
	for i := range ranks {
		r := &ranks[i]
		if r.state != rankRunning || r.stall.secs <= 0 || now.Sub(r.stall.at) > stallHold {
			continue
		}
		if s.rank < 0 || r.stall.at.After(s.stall.at) {
			s.rank, s.stall = i, r.stall
		}
	}
	if s.rank >= 0 {
		return s
	}
	live := 0
	for i := range ranks {
		if ranks[i].state == rankRunning && len(ranks[i].recent) > 0 {
			live++
		}
	}
	meds = meds[:0]
	at := -1
	for i := range ranks {
		r := &ranks[i]
		med, ok := r.medianCompute()
		if !ok || live >= 2 && r.state != rankRunning {
			continue
		}
		meds = append(meds, med)
		if s.rank < 0 || med > s.compute {
			s.rank, s.compute, at = i, med, len(meds)-1
		}
	}
	if len(meds) < 2 {
		return slowest{rank: -1, typical: s.typical}
	}
	s.typical = median(append(meds[:at], meds[at+1:]...))
	if s.compute < straggleRatio*s.typical || s.compute-s.typical < straggleShare*median(steps) {
		return slowest{rank: -1, typical: s.typical}
	}
	return s
}

// counts summarises the ranks' states going through every rank, as the
// header did before settle counted them.
func counts(ranks []rankState) string {
	n := map[string]int{}
	cause := map[string]bool{}
	for _, r := range ranks {
		s := r.state
		if r.silent > 0 {
			s = rankSilent
		}
		n[s]++
		if r.cause {
			cause[s] = true
		}
	}
	var parts []string
	for _, s := range rankOrder {
		if n[s] > 0 {
			p := fmt.Sprintf("%d %s", n[s], stateName(s))
			if cause[s] {
				p += " (cause)"
			}
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, " · ")
}
