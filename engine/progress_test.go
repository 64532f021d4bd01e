package engine

import (
	"testing"
	"time"

	"github.com/gptui/gptui/comm"
)

type fixedProgress comm.Progress

func (p fixedProgress) Progress() comm.Progress { return comm.Progress(p) }

// TestProgressOf: a worker's progress puts its communicators' together —
// the World's TCP groups and an NCCL fabric — the operations in flight
// longest-running first, the counts added, the last operation the one
// that started last.
func TestProgressOf(t *testing.T) {
	now := time.Now()
	world := fixedProgress{Done: 4, Last: comm.OpStatus{Group: "stop", Op: "AllReduce64", Seq: 3, Since: now.Add(-3 * time.Second)},
		InFlight: []comm.OpStatus{{Group: "model", Op: "AllReduce64", Seq: 2, Since: now.Add(-time.Second)}}}
	fabric := fixedProgress{Done: 10, Last: comm.OpStatus{Group: "dp", Op: "AllReduce", Seq: 9, Since: now.Add(-2 * time.Second)},
		InFlight: []comm.OpStatus{{Group: "pp", Op: "Send", Seq: 5, Since: now.Add(-4 * time.Second)}}}
	p := progressOf(7, world, fabric)
	if p.Step != 7 || p.Ops != 14 || p.Last == nil || p.Last.String() != "AllReduce #9 (dp)" {
		t.Errorf("progress %+v (last %v)", p, p.Last)
	}
	if len(p.InFlight) != 2 || p.InFlight[0].String() != "Send #5 (pp)" || p.InFlight[0].WaitS < 4 || p.InFlight[1].String() != "AllReduce64 #2 (model)" {
		t.Errorf("in flight %+v", p.InFlight)
	}
	if p := progressOf(3); p.Step != 3 || p.Ops != 0 || p.Last != nil || p.InFlight != nil {
		t.Errorf("without communicators: %+v", p)
	}
}
