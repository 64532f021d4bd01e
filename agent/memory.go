package agent

import (
	"bytes"
	"os"
	"strconv"
)

// groupRSS returns the resident memory, in bytes, of the processes in each
// of the given process groups, summed per group: VmRSS from
// /proc/<pid>/status of every process whose /proc/<pid>/stat names the
// group. Groups without a live process map to 0.
func groupRSS(groups []int) map[int]int64 {
	out := make(map[int]int64, len(groups))
	want := make(map[int]bool, len(groups))
	for _, g := range groups {
		out[g] = 0
		want[g] = true
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		pgrp, ok := statPgrp(stat)
		if !ok || !want[pgrp] {
			continue
		}
		status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		if err != nil {
			continue
		}
		out[pgrp] += meminfoField(status, "VmRSS:")
	}
	return out
}

// statPgrp returns the process group in the text of /proc/<pid>/stat:
// "pid (comm) state ppid pgrp ...", where comm may hold spaces and
// parentheses.
func statPgrp(stat []byte) (int, bool) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(stat[i+1:])
	if len(f) < 3 {
		return 0, false
	}
	n, err := strconv.Atoi(string(f[2]))
	return n, err == nil
}
