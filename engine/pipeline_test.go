package engine

import "testing"

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
