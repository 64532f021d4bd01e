package engine

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
)

// peakResident is the process's peak resident memory so far in bytes
// (VmHWM of /proc/self/status), or 0 where it cannot be read.
func peakResident() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// VmHWM:	  123456 kB
		if f := bytes.Fields(sc.Bytes()); len(f) == 3 && string(f[0]) == "VmHWM:" && string(f[2]) == "kB" {
			if kb, err := strconv.ParseInt(string(f[1]), 10, 64); err == nil {
				return kb << 10
			}
		}
	}
	return 0
}
