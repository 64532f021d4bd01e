package cluster

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gptui/gptui/agent"
	"github.com/gptui/gptui/event"
)

// DefaultHangTimeout is how long a job may go without progress before it
// is taken for hung, unless Options.HangTimeout says otherwise.
const DefaultHangTimeout = 60 * time.Second

// rankProgress is what the launcher last heard of a rank's progress.
type rankProgress struct {
	heard time.Time      // when its last report arrived
	p     event.Progress // that report
	// agentSilent: the rank's agent is silent, so its reports stopped
	// for the agent, not for the rank: a stale report is no sign of a
	// stuck rank, and where it is now is unknown.
	agentSilent bool
}

// staleReport is how old a rank's last progress report may be before
// where it is now is unknown: three reports missed (agent.ProgressEvery).
// A rank silent that long may have been stopped inside the operation its
// report names; its wait there is not the others' to answer for.
const staleReport = 3 * agent.ProgressEvery

// hang is a diagnosed hang: the rank that is stuck and the whole story.
type hang struct {
	rank int
	msg  string
}

// diagnoseHang looks at the ranks' last progress reports at now and
// returns the hang, if any, with bound as the limit:
//
//   - a rank whose reports stopped more than bound ago is stuck (stopped,
//     frozen, or its machine is); or else
//   - ranks have waited in an operation for more than bound: the stuck rank
//     is one whose reports are stale (staleReport: stopped, it is likely
//     the one they wait for), else the one not in that operation (behind,
//     or in another), else the one with the fewest operations done. A
//     stale report's wait counts only up to staleReport past it: whether
//     the rank still waits is unknown.
//
// Ranks that have ended are not in reports. nodeOf names each rank's node.
func diagnoseHang(reports map[int]*rankProgress, nodeOf map[int]string, now time.Time, bound time.Duration) *hang {
	if len(reports) == 0 {
		return nil
	}
	ranks := slices.Sorted(func(yield func(int) bool) {
		for r := range reports {
			if !yield(r) {
				return
			}
		}
	})
	// The operation waited on longest by the ranks that still report.
	var oldest event.Op
	waited := 0.0
	for _, r := range ranks {
		rp := reports[r]
		if now.Sub(rp.heard) > bound || rp.agentSilent {
			continue
		}
		for _, op := range rp.p.InFlight {
			if w := op.WaitS + min(now.Sub(rp.heard), staleReport).Seconds(); w > waited {
				oldest, waited = op, w
			}
		}
	}
	in := func(r int, op event.Op) bool {
		return !reports[r].agentSilent && slices.ContainsFunc(reports[r].p.InFlight, func(o event.Op) bool { return o.Group == op.Group && o.Seq == op.Seq && o.Op == op.Op })
	}

	// A rank silent past the bound is stuck; once others have waited past
	// it, so is one whose reports are only stale.
	waitedOut := waited > bound.Seconds()
	for _, r := range ranks {
		rp := reports[r]
		silent := now.Sub(rp.heard)
		if silent <= bound && !(waitedOut && silent > staleReport) || rp.agentSilent {
			continue
		}
		others, waiting := describeOthers(reports, ranks, r, now)
		// Its last report is up to a second older than the stop: where
		// it was then is only a hint when nobody waits for it.
		last := ""
		if !waiting {
			last = fmt.Sprintf("; its last report: step %d, computing", rp.p.Step)
			if len(rp.p.InFlight) > 0 {
				last = fmt.Sprintf("; its last report: step %d, in %s", rp.p.Step, rp.p.InFlight[0])
			}
		}
		return &hang{r, fmt.Sprintf("rank %d on %s stuck: no progress report for %.0f s (the process is stopped or frozen)%s%s",
			r, nodeOf[r], silent.Seconds(), last, others)}
	}
	if !waitedOut {
		return nil
	}
	stuck := -1
	for _, r := range ranks {
		if !in(r, oldest) {
			stuck = r
			break
		}
	}
	if stuck < 0 { // all in it: the one with the fewest operations done
		stuck = ranks[0]
		for _, r := range ranks {
			if reports[r].p.Ops < reports[stuck].p.Ops {
				stuck = r
			}
		}
	}
	p := reports[stuck].p
	where := "before " + oldest.String()
	if len(p.InFlight) > 0 {
		where = fmt.Sprintf("in %s instead of %s", p.InFlight[0], oldest)
	}
	if reports[stuck].agentSilent {
		others, _ := describeOthers(reports, ranks, stuck, now)
		return &hang{stuck, fmt.Sprintf("rank %d on %s stuck: its agent is silent, and the other ranks wait for it in %s (its last report: step %d)%s", stuck, nodeOf[stuck], oldest, p.Step, others)}
	}
	if in(stuck, oldest) {
		where = "in " + oldest.String() + " (every rank is; it has done the fewest operations)"
	}
	others, _ := describeOthers(reports, ranks, stuck, now)
	return &hang{stuck, fmt.Sprintf("rank %d on %s stuck %s at step %d%s", stuck, nodeOf[stuck], where, p.Step, others)}
}

// describeOthers says where every rank but stuck is, runs of ranks in the
// same place grouped: "; ranks 0–1 waiting in AllReduce64 #5 (stop) for
// 3 s; rank 2 waiting in AllReduce #12 (dp) for 2 s". waiting reports
// whether any of them waits in an operation.
func describeOthers(reports map[int]*rankProgress, ranks []int, stuck int, now time.Time) (string, bool) {
	type place struct {
		where string
		ranks []int
		wait  float64
	}
	var places []*place
	waiting := false
	for _, r := range ranks {
		if r == stuck {
			continue
		}
		rp := reports[r]
		where, wait := fmt.Sprintf("computing step %d", rp.p.Step), 0.0
		if rp.agentSilent {
			where = "unknown (its agent is silent)"
		} else if len(rp.p.InFlight) > 0 {
			op := rp.p.InFlight[0]
			where, wait, waiting = "waiting in "+op.String(), op.WaitS+now.Sub(rp.heard).Seconds(), true
		}
		k := slices.IndexFunc(places, func(p *place) bool { return p.where == where })
		if k < 0 {
			places = append(places, &place{where: where})
			k = len(places) - 1
		}
		places[k].ranks = append(places[k].ranks, r)
		places[k].wait = max(places[k].wait, wait)
	}
	var b strings.Builder
	for _, p := range places {
		fmt.Fprintf(&b, "; %s %s", rankList(p.ranks), p.where)
		if p.wait > 0 {
			fmt.Fprintf(&b, " for %.0f s", p.wait)
		}
	}
	return b.String(), waiting
}

// rankList formats ascending ranks as "rank 3", "ranks 0–2" or
// "ranks 0, 2, 5–7".
func rankList(ranks []int) string {
	if len(ranks) == 1 {
		return "rank " + strconv.Itoa(ranks[0])
	}
	var parts []string
	for i := 0; i < len(ranks); {
		j := i
		for j+1 < len(ranks) && ranks[j+1] == ranks[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d–%d", ranks[i], ranks[j]))
		} else {
			parts = append(parts, strconv.Itoa(ranks[i]))
		}
		i = j + 1
	}
	return "ranks " + strings.Join(parts, ", ")
}
