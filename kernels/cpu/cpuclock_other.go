//go:build !linux

package cpu

import "time"

// threadCPUTime reports false: only Linux's thread CPU clock is read;
// PeakFLOPS times with the wall clock elsewhere.
func threadCPUTime() (time.Duration, bool) { return 0, false }

// processCPUTime reports false: see threadCPUTime.
func processCPUTime() (time.Duration, bool) { return 0, false }
