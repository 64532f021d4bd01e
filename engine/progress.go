package engine

import (
	"slices"
	"time"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/event"
)

// progresser reports a communicator's operations: *comm.World (its TCP
// groups, those of its Fabric included) and an NCCL fabric
// (*nccl.Fabric, its communicators).
type progresser interface {
	Progress() comm.Progress
}

// Progress is where the worker is, for its agent's hang diagnosis: the
// step Run is in and its communicators' operations, all of them together
// (none for one process): the operations in flight, the longest-running
// first, the number done, and the one that started last of those done
// last. It is safe to call from any goroutine while Run runs.
func (tr *Trainer) Progress() event.Progress {
	var comms []progresser
	if tr.opts.World != nil {
		comms = append(comms, tr.opts.World)
	}
	// A fabric of the World's TCP groups reports through the World; one
	// of its own (NCCL) reports itself.
	if p, ok := tr.opts.Fabric.(progresser); ok {
		comms = append(comms, p)
	}
	return progressOf(tr.Step(), comms...)
}

// progressOf is Progress of the communicators comms at step.
func progressOf(step int, comms ...progresser) event.Progress {
	p := event.Progress{Step: step}
	var inFlight []comm.OpStatus
	var last comm.OpStatus
	for _, c := range comms {
		cp := c.Progress()
		p.Ops += cp.Done
		inFlight = append(inFlight, cp.InFlight...)
		if cp.Last.Seq > 0 && (last.Seq == 0 || cp.Last.Since.After(last.Since)) {
			last = cp.Last
		}
	}
	slices.SortStableFunc(inFlight, func(a, b comm.OpStatus) int { return a.Since.Compare(b.Since) })
	for _, s := range inFlight {
		p.InFlight = append(p.InFlight, event.Op{Group: s.Group, Op: s.Op, Seq: s.Seq, WaitS: time.Since(s.Since).Seconds()})
	}
	if last.Seq > 0 {
		p.Last = &event.Op{Group: last.Group, Op: last.Op, Seq: last.Seq}
	}
	return p
}
