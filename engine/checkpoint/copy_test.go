package checkpoint

import "testing"

// TestParseSaved: the line SavedLine writes gives its step back; other
// lines give none.
func TestParseSaved(t *testing.T) {
	for _, tt := range []struct {
		line string
		step int
		ok   bool
	}{
		{SavedLine(10, "output/step_00000010", "blocked the step 3.1 ms"), 10, true},
		{"[checkpoint] saved step 10 to output/step_00000010", 10, true},
		{"[checkpoint] resumed from output/step_00000010 at step 10", 0, false},
		{"[checkpoint] saved step x to d", 0, false},
		{"[checkpoint] saved step -3 to d", 0, false},
		{"[train] epoch: 0 step: 10", 0, false},
	} {
		if step, ok := ParseSaved(tt.line); step != tt.step && ok || ok != tt.ok {
			t.Errorf("ParseSaved(%q) = %d, %v; want %d, %v", tt.line, step, ok, tt.step, tt.ok)
		}
	}
}

// TestHolds: a summary holds the checkpoints of its history, by step and
// manifest.
func TestHolds(t *testing.T) {
	s := Summary{Step: 10, Manifest: "b", History: map[int]string{5: "a", 10: "b"}}
	for _, tt := range []struct {
		o    Summary
		want bool
	}{
		{Summary{Step: 5, Manifest: "a"}, true},
		{Summary{Step: 10, Manifest: "b"}, true},
		{Summary{Step: 5, Manifest: "c"}, false},
		{Summary{Step: 15, Manifest: "b"}, false},
		{None(), false},
	} {
		if got := s.Holds(tt.o); got != tt.want {
			t.Errorf("Holds(%+v) = %v, want %v", tt.o, got, tt.want)
		}
	}
}
