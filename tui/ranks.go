package tui

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gptui/gptui/event"
)

// States of a rank on the dashboard, from the facts the job reports: the
// workers' own events, and the launcher's verdicts on nodes and hangs.
const (
	rankWaiting    = ""           // nothing heard of it yet
	rankStarting   = "starting"   // its agent is starting it
	rankRunning    = "running"    // its process runs
	rankDone       = "done"       // it exited with status 0
	rankStopped    = "stopped"    // the job's stop ended it: the user's, or the gang's after another failure
	rankFailed     = "failed"     // it exited non-zero or was killed, of its own doing
	rankLost       = "lost"       // its node was lost: no word of it can come
	rankHung       = "hung"       // the launcher found it stuck (no progress for the hang bound)
	rankRestarting = "restarting" // the job restarts, from its newest checkpoint
)

// rankOrder is the order in which the header counts the states.
var rankOrder = []string{rankRunning, rankStarting, rankWaiting, rankRestarting, rankDone, rankStopped, rankFailed, rankHung, rankLost}

// stateName is a rank state as shown.
func stateName(s string) string {
	if s == rankWaiting {
		return "waiting"
	}
	return s
}

// ended reports whether a rank in state s has ended for good in this
// attempt of the job.
func ended(s string) bool {
	return s == rankDone || s == rankStopped || s == rankFailed || s == rankLost || s == rankHung
}

// recentSteps is how many of its latest steps each rank keeps for the
// heat strip, the sparklines and the smoothed ETA.
const recentSteps = 64

// slowWindow is how many of its latest steps decide which rank is the
// slowest: the median of their compute times (one odd step does not
// name a rank; two slow ones do).
const slowWindow = 3

// sample is one training step of a rank, as the dashboard keeps it.
type sample struct {
	step                       int
	at                         time.Time // when it was logged, by the rank's clock
	loss, eval, lr, gnorm      float64
	stepS, computeS, tokensPer float64
}

func (s sample) stepOf() int { return s.step }

// metrics returns s as a metrics record, for the report.
func (s sample) metrics() event.Metrics {
	return event.Metrics{Step: s.step, Loss: s.loss, EvalLoss: s.eval, LR: s.lr, GradNorm: s.gnorm, StepTimeS: s.stepS, TokensPerS: s.tokensPer}
}

// rankState is what the dashboard knows of one rank.
type rankState struct {
	node   string
	state  string // a rank* state
	code   int
	signal string
	cause  bool      // the job's failure names this rank as its cause
	why    string    // how it ended or what is wrong, in a few words
	heard  time.Time // its last event, by its node's clock
	last   event.Metrics
	steps  int // training records received

	recent []sample        // the last recentSteps steps, a ring
	next   int             // where the next one goes once the ring is full
	hist   *series[sample] // every step, thinned out as it grows, for the report
	evals  *series[sample] // the evaluations, likewise

	mem, memTotal int64 // its memory (a GPU's, or a CPU worker's RSS)
	prog          *event.Progress
}

// add records one training step, or an evaluation, of the rank.
func (r *rankState) add(mt event.Metrics, at time.Time, histCap int) {
	if r.hist == nil {
		r.hist, r.evals = newSeries[sample](histCap), newSeries[sample](histCap)
	}
	if mt.EvalLoss != 0 {
		r.evals.add(sample{step: mt.Step, at: at, eval: mt.EvalLoss})
		return
	}
	s := sample{step: mt.Step, at: at, loss: mt.Loss, lr: mt.LR, gnorm: mt.GradNorm, stepS: mt.StepTimeS, computeS: mt.ComputeS(), tokensPer: mt.TokensPerS}
	r.hist.add(s)
	r.last, r.steps = mt, r.steps+1
	if len(r.recent) > 0 && r.recent[r.lastAt()].step >= mt.Step {
		r.recent, r.next = r.recent[:0], 0 // resumed from an earlier step
	}
	if len(r.recent) < recentSteps {
		r.recent = append(r.recent, s)
		return
	}
	r.recent[r.next] = s
	r.next = (r.next + 1) % recentSteps
}

// lastAt is the index of the newest recent sample.
func (r *rankState) lastAt() int {
	if len(r.recent) < recentSteps {
		return len(r.recent) - 1
	}
	return (r.next + recentSteps - 1) % recentSteps
}

// tail returns the rank's last n recent samples, oldest first.
func (r *rankState) tail(n int) []sample {
	n = min(n, len(r.recent))
	out := make([]sample, n)
	for i := range n {
		out[i] = r.recent[(r.next+len(r.recent)-n+i)%len(r.recent)]
	}
	return out
}

// forget drops what the rank did in an earlier attempt of the job: its
// figures, progress and memory (its history, for the report, stays).
func (r *rankState) forget() {
	r.last, r.steps, r.recent, r.next = event.Metrics{}, 0, r.recent[:0], 0
	r.prog, r.mem, r.memTotal, r.heard = nil, 0, 0, time.Time{}
	r.code, r.signal, r.cause, r.why = 0, "", false, ""
}

// how says how a worker that ended exited: "killed by SIGKILL", "exit
// code 1".
func how(code int, signal string) string {
	if signal != "" {
		return "killed by " + signal
	}
	return fmt.Sprintf("exit code %d", code)
}

// onWorker applies a worker event to the rank. The launcher's verdicts
// stay: a hung or lost rank that the stop then ends is still hung or lost.
func (r *rankState) onWorker(ev event.Event) {
	switch ev.State {
	case event.WorkerStarting:
		r.state = rankStarting
	case event.WorkerRunning:
		r.state = rankRunning
	case event.WorkerExited:
		r.state, r.why = rankDone, ""
	case event.WorkerFailed:
		r.state, r.code, r.signal = rankFailed, ev.Code, ev.Signal
		r.why = how(ev.Code, ev.Signal)
	case event.WorkerStopped:
		if r.state == rankHung || r.state == rankLost {
			return
		}
		r.state, r.code, r.signal = rankStopped, ev.Code, ev.Signal
		r.why = "stopped: " + how(ev.Code, ev.Signal)
	}
}

// slowest is the dashboard's verdict on the ranks' pace.
type slowest struct {
	rank    int     // the slowest rank; -1 without two ranks to compare
	compute float64 // its median compute time per step over slowWindow steps
	typical float64 // the median of the other ranks'
}

// ratio is how many times longer the slowest rank computes than the
// median of the others.
func (s slowest) ratio() float64 {
	if s.typical <= 0 {
		return 1
	}
	return s.compute / s.typical
}

// findSlowest names the rank whose median compute time (step time less
// the time in collectives, event.Metrics.ComputeS) over its last
// slowWindow steps is the longest, among the running ranks (or all, once
// fewer than two run). In a
// synchronous job every rank's step takes the slowest's time, so the step
// time alone names no one: the others wait for the straggler in their
// collectives.
func findSlowest(ranks []rankState) slowest {
	s := slowest{rank: -1}
	var meds []float64
	at := -1 // the slowest's place in meds
	// The running ranks; when fewer than two run (the job has ended),
	// every rank's last steps, so the verdict outlives the job.
	live := 0
	for i := range ranks {
		if ranks[i].state == rankRunning && len(ranks[i].recent) > 0 {
			live++
		}
	}
	for i := range ranks {
		r := &ranks[i]
		if len(r.recent) == 0 || live >= 2 && r.state != rankRunning {
			continue
		}
		var cs []float64
		for _, x := range r.tail(slowWindow) {
			cs = append(cs, x.computeS)
		}
		med := median(cs)
		meds = append(meds, med)
		if s.rank < 0 || med > s.compute {
			s.rank, s.compute, at = i, med, len(meds)-1
		}
	}
	if len(meds) < 2 {
		return slowest{rank: -1}
	}
	// Against the others: with two ranks, the other one.
	s.typical = median(append(meds[:at], meds[at+1:]...))
	return s
}

// median returns the median of xs (0 for none); it sorts xs.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// counts summarises the ranks' states: "3 running · 1 failed (cause)".
func counts(ranks []rankState) string {
	n := map[string]int{}
	cause := map[string]bool{}
	for _, r := range ranks {
		n[r.state]++
		if r.cause {
			cause[r.state] = true
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
