package cluster

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gptui/gptui/event"
)

// TestFailureCause: a worker's failure is held for causeWindow: a node
// lost meanwhile (its ranks' peers fail on their connections to it, and
// may be reported first) is the job's cause; otherwise, or before a stop,
// the worker's failure is.
func TestFailureCause(t *testing.T) {
	failed := func(rank int) msg {
		e := event.New(event.KindWorker)
		e.State, e.Rank, e.Code = event.WorkerFailed, rank, 1
		return msg{node: 0, ev: e}
	}
	lost := msg{node: 1, end: true, err: errors.New("connection reset")}
	for _, tt := range []struct {
		name string
		then func(g *gang)
		want string // the failure's node and what it is
	}{
		{"node lost within the window", func(g *gang) { g.onMessage(lost) }, "b lost"},
		{"the window ends", func(g *gang) { <-g.pendingC; g.adoptPending(); g.onMessage(lost) }, "a rank 1"},
		{"a stop within the window", func(g *gang) { g.onStop(ErrStopped); g.onMessage(lost) }, "a rank 1"},
		{"every agent ends within the window, with its last word", func(g *gang) {
			for node := range 2 {
				e := event.New(event.KindJob)
				e.State = event.JobFailed
				g.onMessage(msg{node: node, ev: e})
				g.onMessage(msg{node: node, end: true})
			}
			g.end()
		}, "a rank 1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			j := &Job{events: make(chan event.Event, 64), nodes: []*node{{name: "a"}, {name: "b"}}}
			g := &gang{j: j, r: &runState{procs: make([]*agentProc, 2), done: make(chan struct{})}, running: 2,
				tails: map[int][]string{}, nodeOf: map[int]string{1: "a"}, agentEnd: make([]string, 2), ended: make([]bool, 2),
				heard: make([]time.Time, 2), killed: make([]bool, 2), quiet: make([]*quietAgent, 2), reports: map[int]*rankProgress{}}
			g.onMessage(failed(1))
			if g.failure != nil || g.stopping {
				t.Fatalf("the worker's failure was the job's at once: %+v (stopping %v)", g.failure, g.stopping)
			}
			tt.then(g)
			f := g.failure
			got := "none"
			switch {
			case f != nil && f.Lost:
				got = f.Node + " lost"
			case f != nil:
				got = fmt.Sprintf("%s rank %d", f.Node, f.Rank)
			}
			if got != tt.want || !g.stopping {
				t.Errorf("failure %s (stopping %v), want %s", got, g.stopping, tt.want)
			}
		})
	}
}
