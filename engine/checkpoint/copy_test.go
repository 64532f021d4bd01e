package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestVerified: a summary verifies the checkpoint of its own step and
// manifest, not one its history only lists.
func TestVerified(t *testing.T) {
	s := Summary{Step: 10, Manifest: "b", History: map[int]Record{5: {Manifest: "a"}, 10: {Manifest: "b"}}}
	for _, tt := range []struct {
		o    Summary
		want bool
	}{
		{Summary{Step: 10, Manifest: "b"}, true},
		{Summary{Step: 5, Manifest: "a"}, false},
		{Summary{Step: 10, Manifest: "c"}, false},
		{None(), false},
	} {
		if got := s.Verified(tt.o); got != tt.want {
			t.Errorf("Verified(%+v) = %v, want %v", tt.o, got, tt.want)
		}
	}
	if None().Verified(None()) {
		t.Error("None verifies None")
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
	f.Add([]byte(`{"step":10,"name":"step_00000010","manifest":"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08","files":["manifest.json","rank_00000.safetensors"],"run":"0123abcd","history":{"5":{"manifest":"ab"},"10":{"manifest":"cd","run":"0123abcd"}}}`))
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
		_ = s.Verified(s)
	})
}

// tree returns the SHA-256 of every file under dir by relative path; nil
// if dir does not exist.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		sum := sha256.Sum256(b)
		files[p[len(dir):]] = hex.EncodeToString(sum[:])
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// copyTree copies the files of the directory from into the new directory
// to.
func copyTree(t *testing.T, from, to string) {
	t.Helper()
	if err := os.CopyFS(to, os.DirFS(from)); err != nil {
		t.Fatal(err)
	}
}

// manifestHash returns the hex SHA-256 of dir's manifest.
func manifestHash(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// TestInstall: a verified copy of step 10 installed over each thing an
// output directory can hold of step 10 (nothing, the same checkpoint,
// another checkpoint, the same one with 16 bytes flipped in its data
// file, without its data file, without its manifest), with each of its
// renames failing in turn. A damaged directory is replaced, the same one
// kept, another one refused. At every rename a verified copy of step 10 is
// in place or at the copy's name, and whatever the directory held before
// is at its name or moved aside, never removed; after a failure the
// directory is as it was, after a success it loads with the copy's
// manifest and latest names it. Nothing temporary is left either way.
func TestInstall(t *testing.T) {
	src := t.TempDir()
	good := mustSave(t, src, 10, 0)
	want := manifestHash(t, good)
	otherSrc := t.TempDir()
	m := testManifest(10)
	m.Config = "Global:\n  global_batch_size: 16\n"
	other, err := Save(otherSrc, m, wholeParts(10), 0)
	if err != nil {
		t.Fatal(err)
	}
	const data = "rank_00000.safetensors"
	tests := []struct {
		name    string
		prepare func(t *testing.T, step string) // makes step, the step's directory, or not
		renames int                             // renames of a success
		wantErr string                          // "" for success
	}{
		{"none", func(*testing.T, string) {}, 1, ""},
		{"same checkpoint", func(t *testing.T, step string) { copyTree(t, good, step) }, 0, ""},
		{"another checkpoint", func(t *testing.T, step string) { copyTree(t, other, step) }, 0, "loads but is another checkpoint of step 10"},
		{"16 bytes flipped", func(t *testing.T, step string) {
			copyTree(t, good, step)
			for i := range 16 {
				flipByte(t, filepath.Join(step, data), func(size int) int { return size/2 + i })
			}
		}, 1, ""}, // the copy's file moved in over the damaged one
		{"data file deleted", func(t *testing.T, step string) {
			copyTree(t, good, step)
			if err := os.Remove(filepath.Join(step, data)); err != nil {
				t.Fatal(err)
			}
		}, 1, ""}, // the copy's file moved in
		{"manifest deleted", func(t *testing.T, step string) {
			copyTree(t, good, step)
			if err := os.Remove(filepath.Join(step, ManifestFile)); err != nil {
				t.Fatal(err)
			}
		}, 2, ""},
	}
	for _, tt := range tests {
		for fail := 0; fail <= tt.renames; fail++ { // 0: no rename fails
			t.Run(fmt.Sprintf("%s/fail rename %d", tt.name, fail), func(t *testing.T) {
				out := t.TempDir()
				mustSave(t, out, 5, 0)
				step := filepath.Join(out, DirName(10))
				tt.prepare(t, step)
				before := tree(t, step)
				tmp := filepath.Join(out, TempCopyName(DirName(10)))
				copyTree(t, good, tmp)

				// The original, at its name or moved aside.
				original := func() map[string]string {
					if got := tree(t, step); got != nil {
						return got
					}
					aside, _ := filepath.Glob(filepath.Join(out, tmpPrefix+"damaged-*"))
					if len(aside) != 1 {
						return nil
					}
					return tree(t, aside[0])
				}
				verified := func(dir string) bool {
					c, err := Load(dir)
					if err != nil {
						return false
					}
					s, err := Summarize(c)
					return err == nil && s.Manifest == want
				}
				calls := 0
				rename := func(from, to string) error {
					calls++
					if !verified(tmp) && !verified(step) {
						t.Errorf("rename %d (%s → %s): no verified copy of step 10 at %s or %s", calls, filepath.Base(from), filepath.Base(to), filepath.Base(tmp), filepath.Base(step))
					}
					if got := original(); before != nil && !maps.Equal(got, before) && !verified(step) {
						t.Errorf("rename %d: the directory step 10 had is neither in place nor aside", calls)
					}
					if calls == fail {
						return &fs.PathError{Op: "rename", Path: from, Err: errors.New("injected failure")}
					}
					return os.Rename(from, to)
				}
				dir, err := install(out, tmp, want, 0, rename)
				wantErr := tt.wantErr
				if fail > 0 {
					wantErr = "injected failure"
				}
				switch {
				case wantErr == "" && err != nil:
					t.Fatalf("Install: %v", err)
				case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
					t.Fatalf("Install: %v, want an error with %q", err, wantErr)
				case err == nil:
					if dir != step || !verified(step) {
						t.Errorf("Install = %s; %s verifies %v", dir, step, verified(step))
					}
					if b, _ := os.ReadFile(filepath.Join(out, LatestFile)); string(b) != DirName(10)+"\n" {
						t.Errorf("latest names %q, want %s", b, DirName(10))
					}
				default:
					if got := tree(t, step); !maps.Equal(got, before) {
						t.Errorf("after the failed Install step 10 holds %v, before %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(before)))
					}
				}
				wantCalls := tt.renames
				switch {
				case fail == 2:
					wantCalls = 3 // the original moved back
				case fail == 1:
					wantCalls = 1
				}
				if calls != wantCalls {
					t.Errorf("%d renames, want %d", calls, wantCalls)
				}
				entries := dirEntries(t, out)
				if slices.ContainsFunc(entries, func(e string) bool { return strings.HasPrefix(e, tmpPrefix) }) {
					t.Errorf("left behind: %v", entries)
				}
			})
		}
	}
}

// TestInstallOlder: a verified copy of a step older than the newest is
// installed without moving latest and without removing any checkpoint,
// keep_last or not: a resume that goes back to it needs it, and the newer
// one is kept until a save replaces it.
func TestInstallOlder(t *testing.T) {
	src := t.TempDir()
	good := mustSave(t, src, 10, 0)
	out := t.TempDir()
	mustSave(t, out, 15, 1)
	tmp := filepath.Join(out, TempCopyName(DirName(10)))
	copyTree(t, good, tmp)
	if _, err := Install(out, tmp, manifestHash(t, good), 1); err != nil {
		t.Fatal(err)
	}
	if got, want := dirEntries(t, out), []string{"latest", DirName(10), DirName(15)}; !slices.Equal(got, want) {
		t.Errorf("output dir holds %v, want %v", got, want)
	}
	if b, _ := os.ReadFile(filepath.Join(out, LatestFile)); string(b) != DirName(15)+"\n" {
		t.Errorf("latest names %q, want %s", b, DirName(15))
	}
}

// TestDescribe: the summary of the newest checkpoint whose manifest reads,
// or of a given step, whole or a part (its damaged files missing), carries
// the run and the history of every directory whose manifest reads,
// damaged or not.
func TestDescribe(t *testing.T) {
	out := t.TempDir()
	for _, step := range []int{5, 10, 15} {
		m := testManifest(step)
		m.Run = "00ff"
		if _, err := Save(out, m, wholeParts(step), 0); err != nil {
			t.Fatal(err)
		}
	}
	flipByte(t, filepath.Join(out, DirName(15), "rank_00000.safetensors"), func(size int) int { return size / 2 })
	for _, tt := range []struct {
		step, want int
		complete   bool
	}{{-1, 15, false}, {5, 5, true}, {15, 15, false}, {20, -1, false}} {
		s, err := Describe(out, tt.step)
		if err != nil || s.Step != tt.want || s.Step >= 0 && s.Run != "00ff" {
			t.Errorf("Describe(%d) = step %d run %q, %v; want step %d", tt.step, s.Step, s.Run, err, tt.want)
		}
		// Step 15's damaged file is missing from it: a part, which a
		// copy of that file completes.
		if s.Complete() != tt.complete || !tt.complete && s.Step >= 0 && !slices.Equal(s.Missing, []string{"rank_00000.safetensors"}) {
			t.Errorf("Describe(%d): complete %v, missing %v", tt.step, s.Complete(), s.Missing)
		}
		if len(s.History) != 3 || s.History[15].Run != "00ff" || s.History[15].Manifest != manifestHash(t, filepath.Join(out, DirName(15))) {
			t.Errorf("Describe(%d): history %v", tt.step, s.History)
		}
	}
}
