package agent

import (
	"bufio"
	"bytes"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/nvml"
)

// Probe describes this machine: its name, cores, memory and GPUs. When no
// GPU is listed, NoGPU says why.
func Probe() event.Probe {
	p := event.Probe{
		OS:       runtime.GOOS + "/" + runtime.GOARCH,
		Cores:    runtime.NumCPU(),
		MemBytes: memTotal(),
	}
	p.Hostname, _ = os.Hostname()
	lib, err := nvml.Open()
	if err != nil {
		p.NoGPU = err.Error()
		return p
	}
	defer lib.Close()
	ds, err := lib.Devices()
	for _, d := range ds {
		p.Devices = append(p.Devices, event.Device{Index: d.Index, Name: d.Name, MemTotal: d.MemTotal, MemFree: d.MemFree, UUID: d.UUID})
	}
	switch {
	case err != nil:
		p.NoGPU = err.Error()
	case len(ds) == 0:
		p.NoGPU = "NVML (" + lib.Path() + ") sees no GPUs"
	}
	return p
}

// memTotal returns the machine's memory from /proc/meminfo, or 0 where
// there is none.
func memTotal() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	return meminfoField(b, "MemTotal:")
}

// meminfoField returns the value in bytes of a "Key:   N kB" line of
// /proc/meminfo or /proc/<pid>/status, or 0.
func meminfoField(b []byte, key string) int64 {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), key)
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0
		}
		if len(f) > 1 && f[1] == "kB" {
			n *= 1024
		}
		return n
	}
	return 0
}
