package nvml

import (
	"strings"
	"testing"
)

// TestOpen: on a machine with an NVIDIA driver every GPU has a name and a
// plausible amount of memory; without one Open says what it looked for.
func TestOpen(t *testing.T) {
	l, err := Open()
	if err != nil {
		if !strings.Contains(err.Error(), LibraryName) {
			t.Fatalf("Open: %v; the error should name %s", err, LibraryName)
		}
		t.Logf("no NVML here: %v", err)
		return
	}
	defer func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	}()
	ds, err := l.Devices()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NVML from %s: %d GPUs", l.Path(), len(ds))
	for _, d := range ds {
		if d.Name == "" || d.MemTotal <= 0 || d.MemFree > d.MemTotal || d.MemUsed > d.MemTotal {
			t.Errorf("device %+v", d)
		}
		used, total, err := l.Memory(d.Index)
		if err != nil || total != d.MemTotal || used < 0 {
			t.Errorf("Memory(%d) = %d, %d, %v; want total %d", d.Index, used, total, err, d.MemTotal)
		}
	}
	if _, err := l.Device(len(ds)); err == nil {
		t.Errorf("Device(%d) of %d devices succeeded", len(ds), len(ds))
	}
}

func TestCString(t *testing.T) {
	for in, want := range map[string]string{"abc\x00def": "abc", "\x00": "", "xyz": "xyz"} {
		if got := cString([]byte(in)); got != want {
			t.Errorf("cString(%q) = %q, want %q", in, got, want)
		}
	}
}
