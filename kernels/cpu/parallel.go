package cpu

import "sync"

// ParallelFor calls fn on contiguous, disjoint sub-ranges [lo, hi) that
// together cover [0, n) exactly once, using up to [Backend.Threads]
// goroutines, and returns when every call has returned.
//
// grain is the smallest number of items worth a goroutine of its own: the
// range is split into at most n/grain chunks (values below 1 count as 1), so
// when n < 2·grain, or the Backend has one thread, fn(0, n) runs inline on
// the calling goroutine. Chunks differ in size by at most one item. The
// calling goroutine runs the first chunk itself.
//
// fn must be safe to call concurrently on disjoint ranges. If fn panics, the
// first panic value is re-raised on the calling goroutine after all chunks
// have finished. ParallelFor may be called concurrently and from inside fn,
// although nested calls oversubscribe the CPU.
func (b *Backend) ParallelFor(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	grain = max(grain, 1)
	chunks := min(b.Threads(), n/grain)
	if chunks <= 1 {
		fn(0, n)
		return
	}

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		panicked bool
		perr     any
	)
	run := func(lo, hi int) {
		defer func() {
			if r := recover(); r != nil {
				mu.Lock()
				if !panicked {
					panicked, perr = true, r
				}
				mu.Unlock()
			}
		}()
		fn(lo, hi)
	}
	wg.Add(chunks - 1)
	for c := 1; c < chunks; c++ {
		lo, hi := chunkBounds(n, chunks, c)
		go func() {
			defer wg.Done()
			run(lo, hi)
		}()
	}
	lo, hi := chunkBounds(n, chunks, 0)
	run(lo, hi)
	wg.Wait()
	if panicked {
		panic(perr)
	}
}

// chunkBounds returns the c-th of chunks near-equal contiguous pieces of
// [0, n): the first n%chunks pieces hold one item more than the others.
func chunkBounds(n, chunks, c int) (lo, hi int) {
	q, r := n/chunks, n%chunks
	lo = c*q + min(c, r)
	hi = lo + q
	if c < r {
		hi++
	}
	return lo, hi
}
