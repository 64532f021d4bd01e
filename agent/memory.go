package agent

import (
	"os"
	"strconv"
	"strings"
)

// userHZ is the unit of the CPU times in /proc/<pid>/stat: clock ticks of
// USER_HZ, which Linux fixes at 100 per second for what it shows user
// space.
const userHZ = 100

// usage is what the processes of one process group use: resident memory
// and CPU time.
type usage struct {
	rss   int64  // bytes
	ticks uint64 // user and system CPU time, in clock ticks (userHZ)
}

// groupUsage returns the resident memory and CPU time of the processes in
// each of the given process groups, summed per group: VmRSS from
// /proc/<pid>/status and utime+stime from /proc/<pid>/stat of every
// process whose stat names the group. Groups without a live process map
// to zero.
func groupUsage(groups []int) map[int]usage {
	out := make(map[int]usage, len(groups))
	want := make(map[int]bool, len(groups))
	for _, g := range groups {
		out[g] = usage{}
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
		st, ok := parseStat(string(stat))
		if !ok || !want[st.pgrp] {
			continue
		}
		u := out[st.pgrp]
		u.ticks += st.ticks
		if status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status"); err == nil {
			u.rss += meminfoField(status, "VmRSS:")
		}
		out[st.pgrp] = u
	}
	return out
}

// procStat is what the agent reads of /proc/<pid>/stat: for the
// workers' load, and for a lock's holder (Holder.Stale).
type procStat struct {
	state byte   // R, S, D, Z (a zombie), X (dead), ...
	pgrp  int    // its process group
	ticks uint64 // its user and system CPU time, utime + stime, in clock ticks (userHZ)
	start uint64 // when it started, in clock ticks after boot
}

// parseStat reads the text of /proc/<pid>/stat: "pid (comm) state ppid
// pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime
// stime cutime cstime priority nice num_threads itrealvalue starttime
// ...", where comm may hold spaces and parentheses.
func parseStat(stat string) (procStat, bool) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(stat[i+1:]) // from the state on: pgrp is f[2], utime f[11], stime f[12], starttime f[19]
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, false
	}
	pgrp, err := strconv.Atoi(f[2])
	if err != nil {
		return procStat{}, false
	}
	var n [3]uint64
	for k, j := range []int{11, 12, 19} {
		if n[k], err = strconv.ParseUint(f[j], 10, 64); err != nil {
			return procStat{}, false
		}
	}
	return procStat{state: f[0][0], pgrp: pgrp, ticks: n[0] + n[1], start: n[2]}, true
}

// cpuPercent is the CPU a process group used between two readings t
// seconds apart, in percent of one core.
func cpuPercent(now, before uint64, t float64) float64 {
	if now <= before || t <= 0 {
		return 0
	}
	return 100 * float64(now-before) / userHZ / t
}
