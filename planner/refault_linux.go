package planner

import (
	"syscall"
	"time"
)

// refaultRate is the rate, in bytes/s, at which one process writes memory
// whose pages were just given back with MADV_DONTNEED: each page faults in
// zeroed, then takes the copy. Sharding stage 3 pays it on every gather
// (the engine releases the parameters it is not using, and the gradients
// after their reduce-scatter). The median of 5 passes over 64 MiB.
func refaultRate() float64 {
	const n = 64 << 20
	buf, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return 0
	}
	defer syscall.Munmap(buf)
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i)
	}
	copy(buf, src)
	var rates []float64
	for range 5 {
		if err := syscall.Madvise(buf, syscall.MADV_DONTNEED); err != nil {
			return 0
		}
		start := time.Now()
		copy(buf, src)
		rates = append(rates, n/time.Since(start).Seconds())
	}
	return median(rates)
}
