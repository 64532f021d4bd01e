package agent

import (
	"bytes"
	"os"
	"runtime"
	"strconv"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/nvml"
)

// cpuTimes is the first line of /proc/stat: the machine's CPU time, in
// clock ticks, busy and in all.
type cpuTimes struct{ busy, total uint64 }

// readCPU returns the machine's CPU times so far; ok is false where
// /proc/stat cannot be read.
func readCPU() (cpuTimes, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, false
	}
	return parseCPU(b)
}

// parseCPU reads the "cpu user nice system idle iowait irq softirq steal
// ..." line of /proc/stat: idle and iowait are not busy.
func parseCPU(stat []byte) (cpuTimes, bool) {
	line, _, _ := bytes.Cut(stat, []byte{'\n'})
	f := bytes.Fields(line)
	if len(f) < 5 || string(f[0]) != "cpu" {
		return cpuTimes{}, false
	}
	var t cpuTimes
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(string(v), 10, 64)
		if err != nil {
			return cpuTimes{}, false
		}
		if i >= 8 { // guest and guest_nice are already in user and nice
			break
		}
		t.total += n
		if i != 3 && i != 4 {
			t.busy += n
		}
	}
	return t, true
}

// percent returns the CPU utilisation between two readings, 0–100.
func (t cpuTimes) percent(before cpuTimes) float64 {
	if t.total <= before.total {
		return 0
	}
	return 100 * float64(t.busy-before.busy) / float64(t.total-before.total)
}

// health samples the node's load: CPU since the last call (last is
// updated), memory, the workers' resident memory (rss, by process group)
// and, with lib, the GPUs the workers use.
func health(last *cpuTimes, rss map[int]int64, lib *nvml.Lib, gpus []int) event.Health {
	h := event.Health{Cores: runtime.NumCPU()}
	if now, ok := readCPU(); ok {
		if last.total > 0 {
			h.CPUPercent = now.percent(*last)
		}
		*last = now
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		h.MemTotal = meminfoField(b, "MemTotal:")
		h.MemUsed = h.MemTotal - meminfoField(b, "MemAvailable:")
	}
	for _, v := range rss {
		h.WorkersRSS += v
	}
	if lib != nil {
		for _, d := range gpus {
			g := event.GPUHealth{Index: d, UtilPercent: -1, PowerW: -1, TempC: -1}
			if used, total, err := lib.Memory(d); err == nil {
				g.MemUsed, g.MemTotal = used, total
			}
			if nh, err := lib.Health(d); err == nil {
				g.UtilPercent, g.PowerW, g.TempC = nh.UtilPercent, nh.PowerW, nh.TempC
			}
			h.GPUs = append(h.GPUs, g)
		}
	}
	return h
}
