package planner

import (
	"os"
	"path"
	"strings"
	"testing"
)

// TestCgroupMemLimit: the lowest limit on the process's cgroup and its
// ancestors, under cgroup v1 and v2, with the mount's root inside the
// hierarchy or a namespace's view; "max" and v1's unlimited count as none.
func TestCgroupMemLimit(t *testing.T) {
	const (
		v2mount = "40 30 0:37 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n"
		v1mount = "34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n" +
			"31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
		unlimitedV1 = "9223372036854771712\n"
	)
	for _, tt := range []struct {
		name      string
		cgroup    string
		mountinfo string
		files     map[string]string
		want      int64
		file      string
	}{
		{"v2 own limit", "0::/jobs/a\n", v2mount,
			map[string]string{"/sys/fs/cgroup/jobs/a/memory.max": "4294967296\n", "/sys/fs/cgroup/jobs/memory.max": "max\n"},
			4 << 30, "/sys/fs/cgroup/jobs/a/memory.max"},
		{"v2 ancestor lower", "0::/jobs/a\n", v2mount,
			map[string]string{"/sys/fs/cgroup/jobs/a/memory.max": "max\n", "/sys/fs/cgroup/jobs/memory.max": "1073741824\n"},
			1 << 30, "/sys/fs/cgroup/jobs/memory.max"},
		{"v2 unlimited", "0::/jobs/a\n", v2mount,
			map[string]string{"/sys/fs/cgroup/jobs/a/memory.max": "max\n"}, 0, ""},
		{"v1 memory", "4:memory:/process_api/x\n3:cpuset:/\n0::/\n", v1mount,
			map[string]string{"/sys/fs/cgroup/memory/process_api/x/memory.limit_in_bytes": "2147483648\n",
				"/sys/fs/cgroup/memory/memory.limit_in_bytes": unlimitedV1},
			2 << 30, "/sys/fs/cgroup/memory/process_api/x/memory.limit_in_bytes"},
		{"v1 unlimited", "4:memory:/process_api/x\n", v1mount,
			map[string]string{"/sys/fs/cgroup/memory/process_api/x/memory.limit_in_bytes": unlimitedV1}, 0, ""},
		{"v1 mount of a sub-hierarchy", "4:memory:/docker/abc\n",
			"34 30 0:31 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n",
			map[string]string{"/sys/fs/cgroup/memory/memory.limit_in_bytes": "536870912\n"},
			512 << 20, "/sys/fs/cgroup/memory/memory.limit_in_bytes"},
		{"namespace's view", "0::/\n", "40 30 0:37 /../.. /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
			map[string]string{"/sys/fs/cgroup/memory.max": "3221225472\n"}, 3 << 30, "/sys/fs/cgroup/memory.max"},
		{"hybrid: the lower of v1 and v2", "4:memory:/a\n0::/a\n", v1mount + v2mount,
			map[string]string{"/sys/fs/cgroup/memory/a/memory.limit_in_bytes": "2147483648\n", "/sys/fs/cgroup/a/memory.max": "1073741824\n"},
			1 << 30, "/sys/fs/cgroup/a/memory.max"},
		{"mount point with a space", "0::/a\n", `40 30 0:37 / /sys/fs/my\040cgroup rw - cgroup2 cgroup2 rw` + "\n",
			map[string]string{"/sys/fs/my cgroup/a/memory.max": "1073741824\n"}, 1 << 30, "/sys/fs/my cgroup/a/memory.max"},
		{"no memory controller", "3:cpuset:/\n", v1mount, map[string]string{}, 0, ""},
		{"garbage", "x\n::\n", "- - -\n1 2\n", map[string]string{"/memory.max": "1\n"}, 0, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			read := func(f string) ([]byte, error) {
				if s, ok := tt.files[f]; ok {
					return []byte(s), nil
				}
				return nil, os.ErrNotExist
			}
			n, file := cgroupMemLimit([]byte(tt.cgroup), []byte(tt.mountinfo), read)
			if n != tt.want || file != tt.file {
				t.Errorf("cgroupMemLimit = %d, %q; want %d, %q", n, file, tt.want, tt.file)
			}
		})
	}
}

// TestAddressLimit: an address-space limit leaves the limit less what is
// mapped and the reserve, and says so; the lowest known limit wins.
func TestAddressLimit(t *testing.T) {
	l := addressLimit(4000000<<10, 1700<<20, 288<<20)
	if want := int64(4000000<<10 - 1988<<20); l.Bytes != want {
		t.Errorf("Bytes %d, want %d", l.Bytes, want)
	}
	for _, w := range []string{"ulimit -v 4000000 KiB = 3.8 GiB", "1.7 GiB is mapped already", "288 MiB kept", "raise ulimit -v"} {
		if !strings.Contains(l.What, w) {
			t.Errorf("%q lacks %q", l.What, w)
		}
	}
	if l := addressLimit(1<<30, 2<<30, 0); l.Bytes != 1 {
		t.Errorf("a limit below what is mapped leaves %d bytes, want 1", l.Bytes)
	}
	ram := MemLimit{Bytes: 8 << 30, What: "ram"}
	cg := MemLimit{Bytes: 6 << 30, What: "cgroup"}
	if got := lowest(ram, MemLimit{}, cg, MemLimit{Bytes: 7 << 30}); got != cg {
		t.Errorf("lowest = %+v, want the cgroup's", got)
	}
	if got := lowest(MemLimit{}); got.Bytes != 0 {
		t.Errorf("lowest of none = %+v", got)
	}
	if p := ProcessMemLimit(); p.Bytes <= 0 || p.Bytes > MemTotal() || p.What == "" {
		t.Errorf("ProcessMemLimit() = %+v with %d bytes of RAM", p, MemTotal())
	}
}

// TestStatusField: the kB fields of /proc/meminfo and /proc/self/status.
func TestStatusField(t *testing.T) {
	b := []byte("Name:\tgptui\nVmPeak:\t 2003216 kB\nVmSize:\t 1723952 kB\nMemTotal: 12 MB\nHuge: 99999999999999999999 kB\n")
	for _, tt := range []struct {
		name string
		want int64
	}{{"VmSize:", 1723952 << 10}, {"VmPeak:", 2003216 << 10}, {"MemTotal:", 0}, {"Huge:", 0}, {"VmRSS:", 0}} {
		if got := statusField(b, tt.name); got != tt.want {
			t.Errorf("statusField(%s) = %d, want %d", tt.name, got, tt.want)
		}
	}
}

// FuzzCgroupMemLimit: any /proc/self/cgroup, mountinfo and limit file
// content gives a limit of 0 or one of the files', without a panic, and
// reads only paths under a mount point (cleaned: "/." is "/", which the
// kernel would write).
func FuzzCgroupMemLimit(f *testing.F) {
	f.Add([]byte("0::/jobs/a\n4:memory:/x\n"), []byte("40 30 0:37 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n34 30 0:31 / /m rw - cgroup cgroup rw,memory\n"), []byte("4294967296\n"))
	f.Add([]byte("0::/../../..\n"), []byte(`1 2 3 /.. /a\040b x y - cgroup2 c rw`), []byte("max"))
	f.Fuzz(func(t *testing.T, cgroup, mountinfo, limit []byte) {
		var points []string
		for _, line := range lines(mountinfo) {
			if _, point, _, _, ok := mountFields(line); ok {
				points = append(points, path.Clean(point))
			}
		}
		read := func(file string) ([]byte, error) {
			under := false
			for _, p := range points {
				under = under || file == p || strings.HasPrefix(file, strings.TrimSuffix(p, "/")+"/")
			}
			if !under {
				t.Errorf("read %q, outside the mount points %q", file, points)
			}
			return limit, nil
		}
		n, file := cgroupMemLimit(cgroup, mountinfo, read)
		if n < 0 || (n > 0) != (file != "") {
			t.Errorf("cgroupMemLimit = %d, %q", n, file)
		}
		if want, ok := parseMemLimit(limit); n != 0 && (!ok || n != want) {
			t.Errorf("limit %d from %q", n, limit)
		}
	})
}
