package cpu

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

func TestParallelForCoversOnce(t *testing.T) {
	tests := []struct {
		threads, n, grain int
		wantChunks        int
	}{
		{1, 100, 1, 1},
		{4, 0, 1, 0},
		{4, -3, 1, 0},
		{4, 1, 1, 1},
		{4, 3, 1, 3},
		{4, 4, 1, 4},
		{4, 1000, 1, 4},
		{4, 1001, 1, 4},
		{4, 1000, 300, 3},
		{4, 1000, 501, 1}, // n < 2·grain: inline
		{4, 1000, 0, 4},   // grain below 1 counts as 1
		{4, 1000, -5, 4},
		{3, 10, 1, 3},
		{7, 100000, 10, 7},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("threads=%d/n=%d/grain=%d", tt.threads, tt.n, tt.grain), func(t *testing.T) {
			be := &Backend{threads: tt.threads}
			hits := make([]int32, max(tt.n, 0))
			var mu sync.Mutex
			var sizes []int
			be.ParallelFor(tt.n, tt.grain, func(lo, hi int) {
				if lo >= hi {
					t.Errorf("empty chunk [%d,%d)", lo, hi)
				}
				mu.Lock()
				sizes = append(sizes, hi-lo)
				mu.Unlock()
				for i := lo; i < hi; i++ {
					atomic.AddInt32(&hits[i], 1)
				}
			})
			for i, h := range hits {
				if h != 1 {
					t.Fatalf("index %d visited %d times, want 1", i, h)
				}
			}
			if len(sizes) != tt.wantChunks {
				t.Errorf("%d chunks, want %d", len(sizes), tt.wantChunks)
			}
			if len(sizes) > 0 {
				if lo, hi := slices.Min(sizes), slices.Max(sizes); hi-lo > 1 {
					t.Errorf("chunk sizes %v differ by more than 1", sizes)
				}
			}
		})
	}
}

func TestParallelForInlineSmall(t *testing.T) {
	be := &Backend{threads: 8}
	// Goroutine identity is not observable, but an inline call finishes
	// before ParallelFor returns and sees the caller's unsynchronised state.
	calls := 0
	be.ParallelFor(10, 6, func(lo, hi int) {
		calls++
		if lo != 0 || hi != 10 {
			t.Errorf("inline call got [%d,%d), want [0,10)", lo, hi)
		}
	})
	if calls != 1 {
		t.Errorf("%d calls, want 1", calls)
	}
}

func TestParallelForPanic(t *testing.T) {
	be := &Backend{threads: 4}
	for _, bad := range []int{0, 999} { // caller's chunk, another goroutine's chunk
		t.Run(fmt.Sprint(bad), func(t *testing.T) {
			var done atomic.Int32
			defer func() {
				r := recover()
				if r != "boom" {
					t.Errorf("recovered %v, want boom", r)
				}
				if got := done.Load(); got != 3 {
					t.Errorf("%d other chunks finished before the panic was re-raised, want 3", got)
				}
			}()
			be.ParallelFor(1000, 1, func(lo, hi int) {
				if lo <= bad && bad < hi {
					panic("boom")
				}
				done.Add(1)
			})
		})
	}
}

func TestChunkBounds(t *testing.T) {
	for _, tt := range []struct{ n, chunks int }{{10, 3}, {3, 3}, {7, 1}, {100, 7}, {5, 4}} {
		next := 0
		for c := range tt.chunks {
			lo, hi := chunkBounds(tt.n, tt.chunks, c)
			if lo != next || hi <= lo {
				t.Fatalf("chunkBounds(%d, %d, %d) = [%d,%d), want to start at %d and be non-empty", tt.n, tt.chunks, c, lo, hi, next)
			}
			next = hi
		}
		if next != tt.n {
			t.Errorf("chunks of %d into %d end at %d", tt.n, tt.chunks, next)
		}
	}
}
