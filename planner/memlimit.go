package planner

import (
	"bufio"
	"bytes"
	"fmt"
	"github.com/gptui/gptui/units"
	"path"
	"slices"
	"strconv"
	"strings"
)

// MemLimit is the most memory a process may hold, and what sets it.
type MemLimit struct {
	Bytes int64 // 0 when unknown
	// What says what sets the limit and how much it is, to follow "more
	// than" in a message: "this machine's 23.5 GiB", "the 4.0 GiB that
	// its cgroup allows (FILE)", "the 1.9 GiB that its address-space
	// limit leaves (ulimit -v ...)".
	What string
}

// AddressReserve is what ProcessMemLimit keeps aside, under an
// address-space limit, for what the engine's accounting of a process
// leaves out and the process maps after its start: the heap's own
// overhead, the loaded data, a checkpoint's buffers, and the threads'
// stacks and malloc arenas (ThreadReserve each, for GOMAXPROCS threads).
// Measured on 2 cores: a CPU training process that saves a checkpoint
// maps 225-270 MiB beyond its accounting and the address space it held
// when it checked (tiny at hidden 512 and 1024).
const (
	AddressReserve = 256 << 20
	ThreadReserve  = 16 << 20
)

// ProcessMemLimit returns the most memory this process may hold: the lowest
// of this machine's memory (MemTotal); the memory limit of its cgroup or
// of an ancestor (cgroup v2 memory.max, v1 memory.limit_in_bytes); and the
// address space that its limit (RLIMIT_AS, set by `ulimit -v`) leaves,
// less the address space the process holds already (the Go runtime and
// the C library reserve some 1.7 GiB of it at start) and AddressReserve plus
// ThreadReserve per thread of GOMAXPROCS. Limits that cannot be read are
// left out; Bytes is 0 when none can.
func ProcessMemLimit() MemLimit { return processMemLimit() }

// lowest returns the lowest of the known limits (Bytes > 0).
func lowest(ls ...MemLimit) MemLimit {
	var low MemLimit
	for _, l := range ls {
		if l.Bytes > 0 && (low.Bytes == 0 || l.Bytes < low.Bytes) {
			low = l
		}
	}
	return low
}

// addressLimit is what an address-space limit of limit bytes leaves a
// process that holds used bytes of address space already, keeping
// reserve for what it will map besides: at least 1 byte (a limit below
// what is in use leaves nothing), described for a message.
func addressLimit(limit, used, reserve int64) MemLimit {
	left := max(limit-used-reserve, 1)
	return MemLimit{Bytes: left, What: fmt.Sprintf("the %s that its address-space limit leaves (ulimit -v %d KiB = %s, of which %s is mapped already, by the Go runtime mostly, and %s kept for its threads and buffers; raise ulimit -v or lift it)",
		units.Bytes(left), limit>>10, units.Bytes(limit), units.Bytes(used), units.Bytes(reserve))}
}

// cgroupMemLimit returns the lowest memory limit of the process's cgroups
// and their ancestors, and the file that sets it (0, "" for none):
// cgroupFile is /proc/self/cgroup (lines "ID:CONTROLLERS:PATH"), mountinfo
// /proc/self/mountinfo, and read reads a file of the cgroup filesystems.
// Under cgroup v2 (the "0::PATH" line, a cgroup2 mount) the limit is
// memory.max; under v1 (the line whose controllers include memory, a
// cgroup mount with the memory option) memory.limit_in_bytes. "max", and
// v1's "unlimited" of 2^63 rounded down to a page, mean no limit.
func cgroupMemLimit(cgroupFile, mountinfo []byte, read func(file string) ([]byte, error)) (int64, string) {
	var v1, v2 string // the process's cgroup paths
	has1, has2 := false, false
	for _, line := range lines(cgroupFile) {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "":
			v2, has2 = f[2], true
		case slices.Contains(strings.Split(f[1], ","), "memory"):
			v1, has1 = f[2], true
		}
	}
	var best int64
	var by string
	for _, line := range lines(mountinfo) {
		root, point, fstype, opts, ok := mountFields(line)
		if !ok || !path.IsAbs(point) {
			continue
		}
		point = path.Clean(point)
		var cg, file string
		switch {
		case fstype == "cgroup2" && has2:
			cg, file = v2, "memory.max"
		case fstype == "cgroup" && has1 && slices.Contains(strings.Split(opts, ","), "memory"):
			cg, file = v1, "memory.limit_in_bytes"
		default:
			continue
		}
		// The cgroup's path is relative to the hierarchy's root; the
		// mount shows the hierarchy from its root on. A path outside it
		// (a cgroup namespace's view) is the mount's top.
		dir := point
		cg, root = path.Clean("/"+cg), path.Clean("/"+root)
		if rel, ok := strings.CutPrefix(cg, root); ok && (root == "/" || rel == "" || rel[0] == '/') {
			dir = path.Join(point, rel)
		}
		// Walk from the cgroup up to the mount's root: each ancestor's
		// limit applies too.
		for ; ; dir = path.Dir(dir) {
			name := path.Join(dir, file)
			if b, err := read(name); err == nil {
				if n, ok := parseMemLimit(b); ok && (best == 0 || n < best) {
					best, by = n, name
				}
			}
			if dir == point || dir == "/" || !strings.HasPrefix(dir, strings.TrimSuffix(point, "/")+"/") {
				break
			}
		}
	}
	return best, by
}

// parseMemLimit parses a cgroup memory limit file's content: a byte count
// (ok), or "max" or a count of 2^62 or more (no limit: ok false).
func parseMemLimit(b []byte) (int64, bool) {
	s := string(bytes.TrimSpace(b))
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n >= 1<<62 {
		return 0, false
	}
	return n, true
}

// mountFields returns the root, mount point, filesystem type and super
// options of a mountinfo line ("ID PARENT MAJ:MIN ROOT POINT OPTIONS
// [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS"), with octal escapes (\040
// for a space) undone.
func mountFields(line string) (root, point, fstype, opts string, ok bool) {
	f := strings.Fields(line)
	sep := slices.Index(f, "-")
	if sep < 6 || sep+1 >= len(f) {
		return "", "", "", "", false
	}
	fstype = f[sep+1]
	if sep+3 < len(f) {
		opts = f[sep+3]
	}
	return unescapeMount(f[3]), unescapeMount(f[4]), fstype, opts, true
}

// unescapeMount undoes mountinfo's octal escapes (\040, \011, \012, \134).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// statusField returns the field name ("MemTotal:", "VmSize:") of a
// /proc/meminfo or /proc/self/status file b, "NAME  N kB", in bytes; 0
// where it is missing or malformed.
func statusField(b []byte, name string) int64 {
	for _, line := range lines(b) {
		if rest, ok := strings.CutPrefix(line, name); ok {
			fs := strings.Fields(rest)
			if len(fs) != 2 || fs[1] != "kB" {
				return 0
			}
			if kb, err := strconv.ParseInt(fs[0], 10, 64); err == nil && kb >= 0 && kb < 1<<53 {
				return kb << 10
			}
			return 0
		}
	}
	return 0
}

// lines splits b into its lines.
func lines(b []byte) []string {
	var ls []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		ls = append(ls, sc.Text())
	}
	return ls
}
