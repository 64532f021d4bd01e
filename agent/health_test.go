package agent

import "testing"

func TestParseCPU(t *testing.T) {
	for _, tt := range []struct {
		stat        string
		busy, total uint64
		ok          bool
	}{
		{"cpu  10 2 3 80 5 0 0 0 7 1\ncpu0 1 1 1 1 1\n", 15, 100, true},
		{"cpu  1 2 3 4\n", 6, 10, true},
		{"intr 1 2\n", 0, 0, false},
		{"cpu 1 x 3 4 5\n", 0, 0, false},
		{"", 0, 0, false},
	} {
		got, ok := parseCPU([]byte(tt.stat))
		if ok != tt.ok || got.busy != tt.busy || got.total != tt.total {
			t.Errorf("parseCPU(%q) = %+v, %v; want busy %d total %d, %v", tt.stat, got, ok, tt.busy, tt.total, tt.ok)
		}
	}
	if p := (cpuTimes{busy: 60, total: 200}).percent(cpuTimes{busy: 10, total: 100}); p != 50 {
		t.Errorf("percent = %v, want 50", p)
	}
	if p := (cpuTimes{busy: 60, total: 100}).percent(cpuTimes{busy: 10, total: 100}); p != 0 {
		t.Errorf("percent over no time = %v, want 0", p)
	}
}
