package checkpoint

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestParallelSaveConsolidate: two writers each write their rows of a
// tensor and one writer a scalar into one save's directory, one commit
// publishes it; it loads, reads across the writers' files, and
// consolidates into one file with the same tensors and state.
func TestParallelSaveConsolidate(t *testing.T) {
	out := t.TempDir()
	w := make([]float32, 4*6)
	for i := range w {
		w[i] = float32(i)
	}
	tmp, err := BeginSave(out, 7, "00112233aabbccdd")
	if err != nil {
		t.Fatal(err)
	}
	if again, err := BeginSave(out, 7, "00112233aabbccdd"); err != nil || again != tmp {
		t.Fatalf("a second writer's BeginSave: %q %v, want %q", again, err, tmp)
	}
	var reports []ShardReport
	for rank := range 2 {
		parts := []Part{{Name: "w", GlobalShape: []int{4, 6}, Start: []int{2 * rank, 0}, Shape: []int{2, 6},
			// Rank 1's rows are filled as they are written.
			Data: w[12*rank : 12*rank+12]}}
		if rank == 1 {
			parts[0].Data = nil
			parts[0].Fill = func(dst []float32) error { copy(dst, w[12:]); return nil }
			parts = append(parts, Part{Name: "s", GlobalShape: []int{}, Start: []int{}, Shape: []int{}, Data: []float32{42}})
		}
		r, err := WriteShard(tmp, rank, parts)
		if err != nil {
			t.Fatal(err)
		}
		reports = append(reports, r)
	}
	m := Manifest{Step: 7, Run: NewRun(), Config: "Global:\n  seed: 1\n", RNG: map[string]uint64{"seed": 1}}
	dir, err := Commit(out, tmp, m, reports, 0)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Manifest.Files) != 2 {
		t.Errorf("files %v, want two", c.Manifest.Files)
	}
	got := make([]float32, 3*4)
	if err := c.Read("w", []int{1, 1}, []int{3, 4}, got); err != nil {
		t.Fatal(err)
	}
	if want := []float32{7, 8, 9, 10, 13, 14, 15, 16, 19, 20, 21, 22}; !slices.Equal(got, want) {
		t.Errorf("rows 1-3, columns 1-4 across both files: %v, want %v", got, want)
	}

	one := filepath.Join(t.TempDir(), "one-file")
	cdir, err := Consolidate(c, one)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := Load(cdir)
	if err != nil {
		t.Fatal(err)
	}
	if len(cc.Manifest.Files) != 1 || cc.Manifest.Step != 7 || cc.Manifest.Run != m.Run || cc.Manifest.Config != m.Config {
		t.Errorf("consolidated: files %v, step %d, run %q, config %q", cc.Manifest.Files, cc.Manifest.Step, cc.Manifest.Run, cc.Manifest.Config)
	}
	all := make([]float32, 24)
	if err := cc.Read("w", []int{0, 0}, []int{4, 6}, all); err != nil || !slices.Equal(all, w) {
		t.Errorf("consolidated w: %v %v", all, err)
	}
	s := make([]float32, 1)
	if err := cc.Read("s", []int{}, []int{}, s); err != nil || s[0] != 42 {
		t.Errorf("consolidated s: %v %v", s, err)
	}
}

// TestCommitRefuses: a report whose file is missing, of another size, or
// whose blocks leave a hole is not published, and the save's directory is
// removed.
func TestCommitRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		edit       func(tmp string, r *ShardReport)
	}{
		{"file missing", "no such file", func(tmp string, r *ShardReport) { os.Remove(filepath.Join(tmp, r.File)) }},
		{"size", "its writer reported", func(_ string, r *ShardReport) { r.Bytes++ }},
		{"hole", "slices hold 12 of its 24 elements", func(_ string, r *ShardReport) {}},
		{"path", "not a plain file name", func(_ string, r *ShardReport) { r.File = "../x" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			tmp, err := BeginSave(out, 1, "0123456789abcdef")
			if err != nil {
				t.Fatal(err)
			}
			r, err := WriteShard(tmp, 0, []Part{{Name: "w", GlobalShape: []int{4, 6}, Start: []int{0, 0}, Shape: []int{2, 6}, Data: make([]float32, 12)}})
			if err != nil {
				t.Fatal(err)
			}
			tc.edit(tmp, &r)
			_, err = Commit(out, tmp, Manifest{Step: 1}, []ShardReport{r}, 0)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Commit: %v, want an error containing %q", err, tc.want)
			}
			if _, err := os.Stat(tmp); !os.IsNotExist(err) {
				t.Errorf("the save's directory is still there (%v)", err)
			}
			if _, err := os.Stat(filepath.Join(out, DirName(1))); !os.IsNotExist(err) {
				t.Errorf("a checkpoint was published (%v)", err)
			}
		})
	}
}

// TestBeginSaveRefusesTokens: a token that is not 8 to 64 lowercase hex
// digits, which would become part of a directory name, is refused.
func TestBeginSaveRefusesTokens(t *testing.T) {
	out := t.TempDir()
	for _, tc := range []struct {
		token string
		ok    bool
	}{
		{"0123abcd", true},
		{strings.Repeat("f", 64), true},
		{"0123abc", false},
		{strings.Repeat("f", 65), false},
		{"0123ABCD", false},
		{"0123abcg", false},
		{"../01234567", false},
		{"", false},
	} {
		_, err := BeginSave(out, 1, tc.token)
		if (err == nil) != tc.ok {
			t.Errorf("BeginSave with token %q: %v, want ok %v", tc.token, err, tc.ok)
		}
	}
}
