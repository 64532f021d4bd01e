package comm

import (
	"context"
	"testing"
	"time"
)

// TestProgress: a rank in an all-reduce that its peer has not joined
// shows it in flight, numbered and named after the group, and counts it
// done once the peer joins; the peer's Progress never showed it.
func TestProgress(t *testing.T) {
	worlds := connectWorlds(t, 2, nil)
	gs := make([]*Group, 2)
	for r, w := range worlds {
		g, err := w.NamedGroup("dp", []int{0, 1})
		if err != nil {
			t.Fatal(err)
		}
		gs[r] = g
	}
	ctx := context.Background()
	mustAll(t, 2, func(r int) error { return gs[r].AllReduce(ctx, []float32{1}) }) // #1
	req := gs[0].AllReduceAsync([]float32{1})                                      // #2, rank 1 not yet
	var p Progress
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if p = worlds[0].Progress(); len(p.InFlight) == 1 {
			break
		}
	}
	if len(p.InFlight) != 1 || p.InFlight[0].String() != "AllReduce #2 (dp)" || p.Done != 1 {
		t.Fatalf("rank 0 waiting: %+v, want AllReduce #2 (dp) in flight and 1 done", p)
	}
	if q := worlds[1].Progress(); len(q.InFlight) != 0 || q.Done != 1 {
		t.Errorf("rank 1 before joining: %+v, want nothing in flight and 1 done", q)
	}
	if err := gs[1].AllReduce(ctx, []float32{1}); err != nil {
		t.Fatal(err)
	}
	if err := req.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if p := worlds[0].Progress(); len(p.InFlight) != 0 || p.Done != 2 || p.Last.String() != "AllReduce #2 (dp)" {
		t.Errorf("rank 0 after: %+v, want 2 done, the last AllReduce #2 (dp)", p)
	}
	// Rank 0 waited in #2 for rank 1: it has spent longer in operations.
	if b0, b1 := worlds[0].Progress().Busy, worlds[1].Progress().Busy; b0 <= b1 || b1 <= 0 {
		t.Errorf("time in operations: rank 0 %v, rank 1 %v; want rank 0's longer", b0, b1)
	}
	if g, _ := worlds[0].Group([]int{0, 1}); g.name != "[0 1]" {
		t.Errorf("an unnamed group is named %q, want its ranks", g.name)
	}
}
