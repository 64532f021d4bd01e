package engine

import (
	"runtime"
	"testing"
)

// TestPeakResident: the high-water mark the [memory] line logs covers
// memory the process has written.
func TestPeakResident(t *testing.T) {
	const n = 64 << 20
	b := make([]byte, n)
	for i := range b {
		b[i] = 1
	}
	if p := peakResident(); p < n {
		t.Errorf("peak resident %d bytes after writing %d", p, n)
	}
	runtime.KeepAlive(b)
}
