package planner

import (
	"github.com/gptui/gptui/units"
	"os"
	"runtime"
	"syscall"
)

func processMemLimit() MemLimit {
	ls := []MemLimit{{}}
	if ram := MemTotal(); ram > 0 {
		ls[0] = MemLimit{Bytes: ram, What: "this machine's " + units.Bytes(ram)}
	}
	cg, _ := os.ReadFile("/proc/self/cgroup")
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if n, file := cgroupMemLimit(cg, mi, os.ReadFile); n > 0 {
		ls = append(ls, MemLimit{Bytes: n, What: "the " + units.Bytes(n) + " that its cgroup allows (" + file + ")"})
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_AS, &rl); err == nil && rl.Cur < 1<<62 { // RLIM_INFINITY is 2^64-1
		status, _ := os.ReadFile("/proc/self/status")
		used := statusField(status, "VmSize:")
		ls = append(ls, addressLimit(int64(rl.Cur), used, AddressReserve+ThreadReserve*int64(runtime.GOMAXPROCS(0))))
	}
	return lowest(ls...)
}
