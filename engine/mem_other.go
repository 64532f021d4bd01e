//go:build !linux

package engine

// peakResident is 0: the peak resident memory is read on Linux only.
func peakResident() int64 { return 0 }
