package checkpoint

import (
	"encoding/json"
	"strings"
	"testing"
)

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
		if _, dir, ok := ParseSavedDir(tt.line); ok && dir != "output/step_00000010" {
			t.Errorf("ParseSavedDir(%q): dir %q", tt.line, dir)
		}
		if _, ok := ParseSaving(tt.line); ok {
			t.Errorf("ParseSaving(%q) took a line that is no SavingLine", tt.line)
		}
	}
	if step, ok := ParseSaving(SavingLine(20)); !ok || step != 20 {
		t.Errorf("ParseSaving(SavingLine(20)) = %d, %v", step, ok)
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

// TestSummaryCheck: a summary from another machine names a step
// directory, a SHA-256 and plain file names, or is refused.
func TestSummaryCheck(t *testing.T) {
	h := "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	good := Summary{Step: 10, Name: "step_00000010", Manifest: h, Files: []string{ManifestFile, "rank_00000.safetensors"}}
	for _, tt := range []struct {
		name string
		edit func(*Summary)
		want string // "" for none
	}{
		{"good", func(*Summary) {}, ""},
		{"none", func(s *Summary) { *s = None() }, ""},
		{"other step's name", func(s *Summary) { s.Name = "step_00000011" }, "is not step_00000010"},
		{"path as name", func(s *Summary) { s.Name = "../step_00000010" }, "is not step_00000010"},
		{"short hash", func(s *Summary) { s.Manifest = "abc" }, "not a SHA-256"},
		{"file with a path", func(s *Summary) { s.Files = append(s.Files, "../../.ssh/authorized_keys") }, "not a plain file name"},
		{"no manifest first", func(s *Summary) { s.Files = s.Files[1:] }, "do not start with"},
	} {
		s := good
		s.Files = append([]string(nil), good.Files...)
		tt.edit(&s)
		err := s.Check()
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
}

// FuzzSummary: whatever a node answers for its checkpoints, decoding and
// checking it neither panics nor lets a path through.
func FuzzSummary(f *testing.F) {
	f.Add([]byte(`{"step":10,"name":"step_00000010","manifest":"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08","files":["manifest.json","rank_00000.safetensors"],"history":{"5":"ab","10":"cd"}}`))
	f.Add([]byte(`{"step":-1}`))
	f.Add([]byte(`{"step":3,"name":"step_3","files":["manifest.json","../x"]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s Summary
		if json.Unmarshal(b, &s) != nil {
			return
		}
		if s.Check() != nil || s.Step < 0 {
			return
		}
		for _, name := range append([]string{s.Name}, s.Files...) {
			if strings.ContainsAny(name, `/\`) || name == ".." || name == "." {
				t.Fatalf("Check passed a summary naming %q", name)
			}
		}
		_ = s.Holds(s)
	})
}
