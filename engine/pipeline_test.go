package engine

import (
	"fmt"
	"strings"
	"testing"
)

// TestPipeSchedule checks every schedule's lists: each stage runs the
// forward and the backward pass of every (micro-batch, chunk) once, a
// backward pass after its forward pass, and 1F1B keeps at most pp−s
// micro-batches in flight on stage s where GPipe keeps all of them.
func TestPipeSchedule(t *testing.T) {
	for _, tc := range []struct {
		kind        string
		pp, vpp, m  int
		maxInFlight func(s int) int
	}{
		{"1f1b", 4, 1, 8, func(s int) int { return 4 - s }},
		{"1f1b", 4, 1, 2, func(s int) int { return min(4-s, 2) }},
		{"gpipe", 4, 1, 8, func(int) int { return 8 }},
		{"interleaved", 2, 2, 4, nil},
		{"interleaved", 4, 2, 8, nil},
		{"interleaved", 2, 3, 2, nil},
	} {
		for s := 0; s < tc.pp; s++ {
			ops := pipeSchedule(tc.kind, tc.pp, tc.vpp, s, tc.m)
			if len(ops) != 2*tc.m*tc.vpp {
				t.Errorf("%s pp%d vpp%d m%d stage %d: %d passes, want %d", tc.kind, tc.pp, tc.vpp, tc.m, s, len(ops), 2*tc.m*tc.vpp)
			}
			seen := map[pipeOp]bool{}
			for _, op := range ops {
				if seen[op] {
					t.Errorf("%s stage %d: %+v twice", tc.kind, s, op)
				}
				if op.backward && !seen[pipeOp{false, op.mb, op.chunk}] {
					t.Errorf("%s stage %d: backward %+v before its forward", tc.kind, s, op)
				}
				// Chunks run in order within a micro-batch: forward up, backward down.
				if !op.backward && op.chunk > 0 && !seen[pipeOp{false, op.mb, op.chunk - 1}] {
					t.Errorf("%s stage %d: forward %+v before chunk %d", tc.kind, s, op, op.chunk-1)
				}
				if op.backward && op.chunk < tc.vpp-1 && !seen[pipeOp{true, op.mb, op.chunk + 1}] {
					t.Errorf("%s stage %d: backward %+v before chunk %d", tc.kind, s, op, op.chunk+1)
				}
				seen[op] = true
			}
			if tc.maxInFlight != nil {
				if got, want := maxInFlight(ops), tc.maxInFlight(s); got != want {
					t.Errorf("%s pp%d m%d stage %d: %d micro-batches in flight, want %d", tc.kind, tc.pp, tc.m, s, got, want)
				}
			}
		}
	}
}

// maxInFlight is the largest number of micro-batches whose activations a
// schedule keeps at once (a micro-batch is in flight from its first
// forward pass to its last backward pass on the rank).
func maxInFlight(ops []pipeOp) int {
	live, most := 0, 0
	for _, op := range ops {
		switch {
		case !op.backward && op.chunk == 0:
			live++
			most = max(most, live)
		case op.backward && op.chunk == 0:
			live--
		}
	}
	return most
}

// TestPipeCommsRendezvous runs every rank's exchanges of each schedule
// against one another with NCCL's semantics — a transfer completes only
// when both its send and its receive are posted, and the k-th send from
// rank a to rank b meets b's k-th receive from a — and checks that every
// schedule runs to the end and that each send meets the receive meant for
// it. Issuing each exchange's send and receive one after the other instead
// deadlocks 1F1B, as it would on the GPUs.
func TestPipeCommsRendezvous(t *testing.T) {
	type config struct {
		kind       string
		pp, vpp, m int
	}
	var cases []config
	for _, pp := range []int{2, 3, 4} {
		for _, m := range []int{1, 2, pp, 2 * pp, 2*pp + 1} {
			cases = append(cases, config{"1f1b", pp, 1, m}, config{"gpipe", pp, 1, m})
			for _, vpp := range []int{2, 3} {
				if m%pp == 0 { // interleaved needs whole groups of pp micro-batches
					cases = append(cases, config{"interleaved", pp, vpp, m})
				}
			}
		}
	}
	for _, c := range cases {
		name := fmt.Sprintf("%s pp%d vpp%d m%d", c.kind, c.pp, c.vpp, c.m)
		if err := simulateRendezvous(c.kind, c.pp, c.vpp, c.m, false); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// The planted defect: unpaired, 1F1B's steady state deadlocks.
	if err := simulateRendezvous("1f1b", 2, 1, 4, true); err == nil || !strings.Contains(err.Error(), "deadlock") {
		t.Errorf("1f1b pp2 m4 with unpaired sends and receives: %v, want a deadlock", err)
	}
}

// simulateRendezvous runs the exchanges of every stage of a schedule as
// described in TestPipeCommsRendezvous; unpaired splits each exchange into
// its send, then its receive.
func simulateRendezvous(kind string, pp, vpp, m int, unpaired bool) error {
	type post struct {
		x    pipeXfer
		send bool
		peer int // the other rank
		k    int // its place on the (sender, receiver) channel
	}
	// Each rank's steps; a step's posts complete together.
	steps := make([][][]post, pp)
	count := map[[3]int]int{} // (from rank, to rank, send?) → posts so far
	for s := 0; s < pp; s++ {
		for _, e := range pipeComms(pipeSchedule(kind, pp, vpp, s, m), pp, vpp, s) {
			var step []post
			for _, x := range e.sends {
				to := x.to % pp
				key := [3]int{s, to, 1}
				step = append(step, post{x, true, to, count[key]})
				count[key]++
			}
			for _, x := range e.recvs {
				from := x.from % pp
				key := [3]int{from, s, 0}
				step = append(step, post{x, false, from, count[key]})
				count[key]++
			}
			switch {
			case len(step) == 0:
			case unpaired:
				for _, p := range step {
					steps[s] = append(steps[s], []post{p})
				}
			default:
				steps[s] = append(steps[s], step)
			}
		}
	}
	// Where each channel's k-th send and receive sit: rank, step.
	type at struct{ rank, step int }
	where := map[[4]int]at{} // (from, to, send?, k)
	for r, rs := range steps {
		for i, step := range rs {
			for _, p := range step {
				from, to, send := p.peer, r, 0
				if p.send {
					from, to, send = r, p.peer, 1
				}
				where[[4]int{from, to, send, p.k}] = at{r, i}
			}
		}
	}
	for r, rs := range steps {
		for _, step := range rs {
			for _, p := range step {
				if !p.send {
					continue
				}
				q, ok := where[[4]int{r, p.peer, 0, p.k}]
				if !ok {
					return fmt.Errorf("rank %d's send %+v has no receive", r, p.x)
				}
				for _, rp := range steps[q.rank][q.step] {
					if !rp.send && rp.peer == r && rp.k == p.k && rp.x != p.x {
						return fmt.Errorf("rank %d sends %+v where rank %d receives %+v", r, p.x, q.rank, rp.x)
					}
				}
			}
		}
	}
	// Run: a rank finishes its step when every partner has posted its half.
	pos := make([]int, pp)
	for {
		moved, done := false, true
		for r := range pos {
			if pos[r] == len(steps[r]) {
				continue
			}
			done = false
			ready := true
			for _, p := range steps[r][pos[r]] {
				from, to, send := r, p.peer, 0 // the partner's key
				if !p.send {
					from, to, send = p.peer, r, 1
				}
				q, ok := where[[4]int{from, to, send, p.k}]
				if !ok {
					return fmt.Errorf("rank %d's %+v has no partner", r, p.x)
				}
				if pos[q.rank] < q.step {
					ready = false
				}
			}
			if ready {
				pos[r]++
				moved = true
			}
		}
		if done {
			return nil
		}
		if !moved {
			return fmt.Errorf("deadlock: ranks at steps %v of %v", pos, func() []int {
				n := make([]int, pp)
				for r := range n {
					n[r] = len(steps[r])
				}
				return n
			}())
		}
	}
}
