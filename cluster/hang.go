package cluster

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gptui/gptui/event"
)

// DefaultHangTimeout is how long a job may go without progress before it
// is taken for hung, unless Options.HangTimeout says otherwise.
const DefaultHangTimeout = 60 * time.Second

// rankProgress is what the launcher last heard of a rank's progress.
type rankProgress struct {
	heard time.Time      // when its last report arrived
	p     event.Progress // that report
}

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
//     is the one not in that operation (behind, or in another), else the
//     one with the fewest operations done.
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
		if now.Sub(rp.heard) > bound {
			continue
		}
		for _, op := range rp.p.InFlight {
			if w := op.WaitS + now.Sub(rp.heard).Seconds(); w > waited {
				oldest, waited = op, w
			}
		}
	}
	in := func(r int, op event.Op) bool {
		return slices.ContainsFunc(reports[r].p.InFlight, func(o event.Op) bool { return o.Group == op.Group && o.Seq == op.Seq && o.Op == op.Op })
	}
	var waiters []int // the ranks still reporting that wait in it
	if waited > 0 {
		for _, r := range ranks {
			if in(r, oldest) && now.Sub(reports[r].heard) <= bound {
				waiters = append(waiters, r)
			}
		}
	}
	waiting := ""
	if len(waiters) > 0 {
		waiting = fmt.Sprintf("; %s waiting in %s for %.0f s", rankList(waiters), oldest, waited)
	}

	for _, r := range ranks {
		rp := reports[r]
		silent := now.Sub(rp.heard)
		if silent <= bound {
			continue
		}
		// Its last report is up to a second older than the stop: where
		// it was then is a hint, what the others wait in is the fact.
		last := fmt.Sprintf("; its last report: step %d, computing", rp.p.Step)
		if len(rp.p.InFlight) > 0 {
			last = fmt.Sprintf("; its last report: step %d, in %s", rp.p.Step, rp.p.InFlight[0])
		}
		if waiting != "" {
			last = ""
		}
		return &hang{r, fmt.Sprintf("rank %d on %s stuck: no progress report for %.0f s (the process is stopped or frozen)%s%s",
			r, nodeOf[r], silent.Seconds(), waiting, last)}
	}
	if waited <= bound.Seconds() {
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
	if in(stuck, oldest) {
		where = "in " + oldest.String() + " (every rank is; it has done the fewest operations)"
	}
	return &hang{stuck, fmt.Sprintf("rank %d on %s stuck %s at step %d%s",
		stuck, nodeOf[stuck], where, p.Step, waiting)}
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
