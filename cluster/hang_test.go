package cluster

import (
	"testing"
	"time"

	"github.com/gptui/gptui/event"
)

func TestDiagnoseHang(t *testing.T) {
	now := time.Unix(1000, 0)
	nodeOf := map[int]string{0: "node1", 1: "node1", 2: "node2", 3: "node2"}
	ar := func(seq int64, wait float64) []event.Op {
		return []event.Op{{Group: "dp", Op: "AllReduce", Seq: seq, WaitS: wait}}
	}
	rep := func(ago time.Duration, step int, ops int64, in []event.Op) *rankProgress {
		return &rankProgress{heard: now.Add(-ago), p: event.Progress{Step: step, Ops: ops, InFlight: in}}
	}
	for _, tt := range []struct {
		name    string
		reports map[int]*rankProgress
		rank    int    // -1: no hang
		msg     string // the diagnosis
	}{
		{"healthy", map[int]*rankProgress{
			0: rep(time.Second, 12, 40, ar(41, 0.2)), 1: rep(time.Second, 12, 40, nil),
			2: rep(0, 12, 41, nil), 3: rep(0, 12, 40, ar(41, 0.1))}, -1, ""},
		{"one rank silent before the collective", map[int]*rankProgress{
			0: rep(time.Second, 12, 40, ar(41, 30)), 1: rep(time.Second, 12, 40, ar(41, 30)),
			2: rep(0, 12, 40, ar(41, 31)), 3: rep(31*time.Second, 12, 40, nil)}, 3,
			"rank 3 on node2 stuck: no progress report for 31 s (the process is stopped or frozen); ranks 0–2 waiting in AllReduce #41 (dp) for 31 s"},
		{"one rank silent, the other waiting", map[int]*rankProgress{
			0: rep(0, 12, 40, ar(41, 30)), 1: rep(40*time.Second, 12, 40, ar(41, 1))}, 1,
			"rank 1 on node1 stuck: no progress report for 40 s (the process is stopped or frozen); rank 0 waiting in AllReduce #41 (dp) for 30 s"},
		{"one rank silent, none waiting", map[int]*rankProgress{
			0: rep(0, 12, 40, nil), 1: rep(40*time.Second, 11, 38, ar(39, 1))}, 1,
			"rank 1 on node1 stuck: no progress report for 40 s (the process is stopped or frozen); its last report: step 11, in AllReduce #39 (dp); rank 0 computing step 12"},
		{"one rank silent, the others in two places", map[int]*rankProgress{
			0: rep(0, 4, 20, []event.Op{{Group: "stop", Op: "AllReduce64", Seq: 5, WaitS: 3}}), 1: rep(0, 4, 20, []event.Op{{Group: "stop", Op: "AllReduce64", Seq: 5, WaitS: 2}}),
			2: rep(0, 4, 19, ar(12, 2)), 3: rep(31*time.Second, 4, 19, nil)}, 3,
			"rank 3 on node2 stuck: no progress report for 31 s (the process is stopped or frozen); ranks 0–1 waiting in AllReduce64 #5 (stop) for 3 s; rank 2 waiting in AllReduce #12 (dp) for 2 s"},
		{"a straggler computing", map[int]*rankProgress{
			0: rep(0, 7, 20, ar(21, 45)), 1: rep(0, 7, 20, nil)}, 1,
			"rank 1 on node1 stuck before AllReduce #21 (dp) at step 7; rank 0 waiting in AllReduce #21 (dp) for 45 s"},
		{"a rank in another collective", map[int]*rankProgress{
			0: rep(0, 7, 20, ar(21, 45)), 1: rep(0, 7, 20, []event.Op{{Group: "mp", Op: "AllGather", Seq: 9, WaitS: 44}})}, 1,
			"rank 1 on node1 stuck in AllGather #9 (mp) instead of AllReduce #21 (dp) at step 7; rank 0 waiting in AllReduce #21 (dp) for 45 s"},
		// A rank stopped inside a collective: its report's wait is not
		// extrapolated past staleReport, so the others are not blamed
		// for it; once they have waited past the bound, the stale rank
		// is the one named.
		{"a stopped rank's stale wait", map[int]*rankProgress{
			0: rep(25*time.Second, 13, 45, ar(45, 8)), 1: rep(0, 13, 57, ar(57, 20))}, -1, ""},
		{"the others waited past the bound, a rank stale under it", map[int]*rankProgress{
			0: rep(25*time.Second, 13, 45, ar(45, 8)), 1: rep(0, 13, 57, ar(57, 31))}, 0,
			"rank 0 on node1 stuck: no progress report for 25 s (the process is stopped or frozen); rank 1 waiting in AllReduce #57 (dp) for 31 s"},
		{"a slow step under the bound", map[int]*rankProgress{
			0: rep(0, 7, 20, ar(21, 25)), 1: rep(0, 7, 20, nil)}, -1, ""},
		// Ranks whose agent is silent: their reports are stale for the
		// agent. Not stuck while the others go on; named when the others
		// wait for them.
		{"an agent silent, the others going on", map[int]*rankProgress{
			0: rep(0, 30, 90, nil), 1: rep(0, 30, 90, ar(91, 0.1)),
			2: silentAgent(rep(40*time.Second, 12, 40, nil)), 3: silentAgent(rep(40*time.Second, 12, 40, ar(41, 0.1)))}, -1, ""},
		{"an agent silent, the others waiting for its ranks", map[int]*rankProgress{
			0: rep(0, 30, 90, ar(91, 35)), 1: rep(0, 30, 90, ar(91, 35)),
			2: silentAgent(rep(40*time.Second, 29, 88, ar(89, 0.1))), 3: silentAgent(rep(40*time.Second, 29, 88, nil))}, 2,
			"rank 2 on node2 stuck: its agent is silent, and the other ranks wait for it in AllReduce #91 (dp) (its last report: step 29); ranks 0–1 waiting in AllReduce #91 (dp) for 35 s; rank 3 unknown (its agent is silent)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := diagnoseHang(tt.reports, nodeOf, now, 30*time.Second)
			switch {
			case tt.rank < 0 && h != nil:
				t.Errorf("hang %+v, want none", h)
			case tt.rank >= 0 && h == nil:
				t.Errorf("no hang, want rank %d", tt.rank)
			case h != nil && (h.rank != tt.rank || h.msg != tt.msg):
				t.Errorf("rank %d: %q\nwant rank %d: %q", h.rank, h.msg, tt.rank, tt.msg)
			}
		})
	}
}

func TestRankList(t *testing.T) {
	for _, tt := range []struct {
		in   []int
		want string
	}{{[]int{3}, "rank 3"}, {[]int{0, 1, 2}, "ranks 0–2"}, {[]int{0, 2, 5, 6, 7}, "ranks 0, 2, 5–7"}} {
		if got := rankList(tt.in); got != tt.want {
			t.Errorf("rankList(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// silentAgent marks rp as the report of a rank whose agent is silent.
func silentAgent(rp *rankProgress) *rankProgress {
	rp.agentSilent = true
	return rp
}
