// Package allocbound measures what reading an input allocates, for the fuzz
// targets that check that no file header can make a reader allocate more
// than the file's size justifies.
package allocbound

import "runtime"

// Limit is the most a reader may allocate for an input of n bytes: 64 MiB
// plus 16 bytes per input byte (a float32 buffer and its gradient for every
// 2-byte F16 value, a parsed JSON header, scratch).
func Limit(n int) uint64 { return 64<<20 + 16*uint64(n) }

// Measure returns the bytes of heap f allocates (the growth of
// runtime.MemStats.TotalAlloc across the call, freed or not).
func Measure(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
