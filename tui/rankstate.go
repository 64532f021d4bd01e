package tui

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/gptui/gptui/agent"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/units"
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
	// rankSilent is a running rank that has sent no progress report for
	// silentAfter: shown, not kept (its state stays running).
	rankSilent = "silent"
)

// rankOrder is the order in which the header counts the states.
var rankOrder = [...]string{rankRunning, rankSilent, rankStarting, rankWaiting, rankRestarting, rankDone, rankStopped, rankFailed, rankHung, rankLost}

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

// silentAfter is how long a running rank may send no progress report
// (its worker sends one every agent.ProgressEvery, whatever it does)
// before it is shown silent: two reports missed means the process is
// stopped, frozen or starved, long before the launcher's hang bound.
const silentAfter = 2 * agent.ProgressEvery

// stallHold is how long after a rank's silence has ended the header
// still names it the slowest: a stall of a few seconds stops every rank
// (they wait for it in their collectives) but may leave no trace in its
// compute time, when it came during a collective.
const stallHold = 20 * time.Second

// A rank is named the slowest by its compute time only when it is
// clearly slower: straggleRatio times the others' median, and longer by
// at least straggleShare of the step time. Ranks within that are equal:
// no straggler is named.
const (
	straggleRatio = 1.25
	straggleShare = 0.1
)

// sample is one training step of a rank, as the dashboard keeps it.
type sample struct {
	step                       int
	at                         time.Time // when it was logged, by the rank's clock
	loss, eval, lr, gnorm, mfu float64
	stepS, computeS, tokensPer float64
}

func (s sample) stepOf() int { return s.step }

// sampleOf returns the sample of a metrics record logged at at.
func sampleOf(mt event.Metrics, at time.Time) sample {
	return sample{step: mt.Step, at: at, loss: mt.Loss, eval: mt.EvalLoss, lr: mt.LR, gnorm: mt.GradNorm, mfu: mt.MFU,
		stepS: mt.StepTimeS, computeS: mt.ComputeS(), tokensPer: mt.TokensPerS}
}

// metrics returns s as a metrics record, for the report (its CommS the
// step less its compute time).
func (s sample) metrics() event.Metrics {
	return event.Metrics{Step: s.step, Loss: s.loss, EvalLoss: s.eval, LR: s.lr, GradNorm: s.gnorm, MFU: s.mfu,
		StepTimeS: s.stepS, CommS: max(s.stepS-s.computeS, 0), TokensPerS: s.tokensPer}
}

// stall is a silence of a rank that has ended: its progress reports
// stopped for a while, then came again.
type stall struct {
	at   time.Time // when the reports came again
	secs float64   // how long they had stopped, less the usual interval
	step int       // the step the rank was in
}

// rankState is what the dashboard knows of one rank in the job's current
// attempt.
type rankState struct {
	node   string
	state  string // a rank* state
	code   int
	signal string
	cause  bool   // the job's failure names this rank as its cause
	why    string // how it ended or what is wrong, in a few words
	// heard is when its last progress report arrived: the worker sends
	// one every agent.ProgressEvery itself, so its age says whether the
	// process runs, whatever the rest of its node says.
	heard time.Time
	// silent is how long it has sent no progress report, once that is
	// more than silentAfter (and it runs); 0 otherwise. Set by settle.
	silent time.Duration
	// agentSilent: its node's agent is silent (event.NodeAgentSilent), so
	// its reports stop for the agent, not for it: it is shown so, not
	// silent, and its state is what it was last known to be.
	agentSilent bool
	stall       stall // its last silence, once over
	last        event.Metrics
	steps       int    // training records received in this attempt
	tokens      string // last's throughput as shown: units.Metric(last.TokensPerS)

	recent []sample // the last recentSteps steps, a ring
	next   int      // where the next one goes once the ring is full

	mem, memTotal int64   // its memory (a GPU's, or a CPU worker's RSS)
	memText       string  // mem as shown: units.Bytes(mem)
	pid           int     // its process, once running
	cpu           float64 // the CPU its process used over the last second, in % of a core; -1 unknown
	prog          *event.Progress
	progText      string // what prog says it does, as the ranks pane shows it (see progressText)
}

// add records one training step of the rank, logged at at.
func (r *rankState) add(mt event.Metrics, at time.Time) {
	s := sampleOf(mt, at)
	r.last, r.steps = mt, r.steps+1
	r.tokens = units.Metric(mt.TokensPerS)
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

// onProgress records a progress report that arrived at at: the rank is
// heard from, and a silence it ends is kept as its stall.
func (r *rankState) onProgress(p event.Progress, at time.Time) {
	if gap := at.Sub(r.heard); !r.heard.IsZero() && gap > silentAfter && r.state == rankRunning {
		r.stall = stall{at: at, secs: (gap - agent.ProgressEvery).Seconds(), step: p.Step}
	}
	if at.After(r.heard) {
		r.heard = at
	}
	r.prog, r.progText = &p, progressText(p)
}

// progressText says what a rank's progress report says it does: the
// operation in its communicator in flight and for how long, or its last
// one, or the step it computes.
func progressText(p event.Progress) string {
	if len(p.InFlight) > 0 {
		op := p.InFlight[0]
		return fmt.Sprintf("in %s %.0fs", op, op.WaitS)
	}
	if p.Last != nil {
		return "after " + p.Last.String()
	}
	return fmt.Sprintf("computing step %d", p.Step)
}

// lastAt is the index of the newest recent sample.
func (r *rankState) lastAt() int {
	if len(r.recent) < recentSteps {
		return len(r.recent) - 1
	}
	return (r.next + recentSteps - 1) % recentSteps
}

// tail returns the rank's last n recent samples (or all, if fewer), for
// at.
func (r *rankState) tail(n int) recentTail {
	return recentTail{r, min(n, len(r.recent))}
}

// recentTail is a rank's last n recent samples, read in place.
type recentTail struct {
	r *rankState
	n int
}

// at returns the i-th sample of t, 0 the oldest.
func (t recentTail) at(i int) sample {
	rs := t.r.recent
	return rs[(t.r.next+len(rs)-t.n+i)%len(rs)]
}

// medianCompute is the median compute time of the rank's last slowWindow
// steps; ok is false before its first.
func (r *rankState) medianCompute() (float64, bool) {
	if len(r.recent) == 0 {
		return 0, false
	}
	var cs [slowWindow]float64
	t := r.tail(slowWindow)
	for i := range t.n {
		cs[i] = t.at(i).computeS
	}
	return median(cs[:t.n]), true
}

// forget drops what the rank did in an earlier attempt of the job: its
// figures, progress, process and memory (the history, for the report,
// is the dashboard's and stays).
func (r *rankState) forget() {
	r.last, r.steps, r.recent, r.next = event.Metrics{}, 0, r.recent[:0], 0
	r.prog, r.progText, r.mem, r.memTotal, r.memText, r.heard, r.silent, r.stall = nil, "", 0, 0, "", time.Time{}, 0, stall{}
	r.tokens = ""
	r.pid, r.cpu = 0, -1
	r.code, r.signal, r.cause, r.why = 0, "", false, ""
}

// gone clears the figures of a process that has ended: its memory and
// CPU are no longer.
func (r *rankState) gone() {
	r.mem, r.memTotal, r.memText, r.cpu, r.silent = 0, 0, "", -1, 0
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
// blame is what ended the job's attempt, if the dashboard knows ("rank 3
// failed"), for the ranks the job's stop then ends.
func (r *rankState) onWorker(ev event.Event, blame string) {
	switch ev.State {
	case event.WorkerStarting:
		r.state = rankStarting
	case event.WorkerRunning:
		r.state = rankRunning
		if ev.Proc != nil {
			r.pid = ev.Proc.PID
		}
	case event.WorkerExited:
		r.state, r.why = rankDone, ""
	case event.WorkerFailed:
		r.state, r.code, r.signal = rankFailed, ev.Code, ev.Signal
		r.why = how(ev.Code, ev.Signal)
		if ev.Exit != nil && ev.Exit.Error != "" {
			r.why += ": " + clean(ev.Exit.Error)
		}
	case event.WorkerStopped:
		if r.state == rankHung || r.state == rankLost {
			return
		}
		r.state, r.code, r.signal = rankStopped, ev.Code, ev.Signal
		r.why = stoppedWhy(blame, ev.Code, ev.Signal)
	}
	if ended(r.state) {
		r.gone()
	}
}

// stoppedWhy says why the job's stop ended a rank: what ended the job, if
// known, else how the rank exited.
func stoppedWhy(blame string, code int, signal string) string {
	if blame != "" {
		return "stopped with the job because " + blame
	}
	return "stopped: " + how(code, signal)
}

// slowest is the dashboard's verdict on the ranks' pace: the rank that
// holds the others back, if one does. A silent rank comes first (it holds
// every rank now), then the last stall within stallHold, then the rank
// whose compute time is clearly the longest.
type slowest struct {
	rank    int           // the slowest rank; -1 for none
	silent  time.Duration // it is silent now, for this long
	stall   stall         // or it stalled (stall.secs > 0)
	compute float64       // or its median compute time per step over slowWindow steps is the longest
	typical float64       // the median of the ranks' median compute times (the others', for a compute verdict)
}

// ratio is how many times longer the slowest rank computes than the
// median of the others.
func (s slowest) ratio() float64 {
	if s.typical <= 0 {
		return 1
	}
	return s.compute / s.typical
}

// appendText appends the verdict in a few words to b: "rank 2 silent
// 4s", "slowest rank 2: stalled 3.1 s in step 12", "slowest rank 1 ×1.7
// (0.240 s compute/step)"; short leaves out what is in parentheses and
// the step.
func (s slowest) appendText(b []byte, short bool) []byte {
	rank := func(b []byte, prefix string) []byte {
		return strconv.AppendInt(append(b, prefix...), int64(s.rank), 10)
	}
	switch {
	case s.rank < 0:
		return b
	case s.silent > 0:
		b = appendDuration(append(rank(b, "rank "), " silent "...), s.silent.Seconds())
	case s.stall.secs > 0:
		b = strconv.AppendFloat(append(rank(b, "slowest rank "), ": stalled "...), s.stall.secs, 'f', 1, 64)
		b = append(b, " s"...)
		if !short {
			b = strconv.AppendInt(append(b, " in step "...), int64(s.stall.step), 10)
		}
	default:
		b = strconv.AppendFloat(append(rank(b, "slowest rank "), " ×"...), s.ratio(), 'f', 1, 64)
		if !short {
			b = append(strconv.AppendFloat(append(b, " ("...), s.compute, 'f', 3, 64), " s compute/step)"...)
		}
	}
	return b
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
