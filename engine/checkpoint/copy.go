package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Summary identifies a complete checkpoint for comparing and copying it
// between machines: its step, directory name, the SHA-256 of its manifest
// and the files it consists of; and the other checkpoints of its output
// directory, by which two machines tell whether their checkpoints come
// from one run.
type Summary struct {
	Step     int            `json:"step"`               // -1: no checkpoint
	Name     string         `json:"name,omitempty"`     // step_NNNNNNNN
	Manifest string         `json:"manifest,omitempty"` // hex SHA-256 of manifest.json
	Files    []string       `json:"files,omitempty"`    // manifest.json first, then the data files
	History  map[int]string `json:"history,omitempty"`  // step → manifest SHA-256 of every checkpoint directory, this one's included
}

// Check returns an error if s, which came from another machine, is not
// the summary of a checkpoint: its name is not a step directory's, its
// manifest hash is not hex SHA-256, or one of its files is not a plain
// file name (a "../" would reach outside the checkpoint). None passes.
func (s Summary) Check() error {
	if s.Step < 0 {
		return nil
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("checkpoint summary of step %d: "+format, append([]any{s.Step}, args...)...)
	}
	if n, ok := stepOf(s.Name); !ok || n != s.Step {
		return bad("name %q is not %s", s.Name, DirName(s.Step))
	}
	if b, err := hex.DecodeString(s.Manifest); err != nil || len(b) != sha256.Size {
		return bad("manifest hash %q is not a SHA-256", s.Manifest)
	}
	if len(s.Files) == 0 || s.Files[0] != ManifestFile {
		return bad("files %q do not start with %s", s.Files, ManifestFile)
	}
	for _, f := range s.Files[1:] {
		if msg := checkFileName(f); msg != "" {
			return bad("file %q: %s", f, msg)
		}
	}
	return nil
}

// Holds reports whether the output directory s describes holds the
// checkpoint o (the same step and manifest).
func (s Summary) Holds(o Summary) bool {
	h, ok := s.History[o.Step]
	return o.Step >= 0 && ok && h == o.Manifest
}

// History returns the step and manifest SHA-256 of every checkpoint
// directory of outputDir whose manifest can be read. It verifies nothing
// else: it tells where checkpoints come from, not whether they load.
func History(outputDir string) map[int]string {
	steps, _ := listSteps(outputDir)
	h := make(map[int]string, len(steps))
	for _, name := range steps {
		n, _ := stepOf(name)
		b, err := os.ReadFile(filepath.Join(outputDir, name, ManifestFile))
		if err != nil {
			continue
		}
		sum := sha256.Sum256(b)
		h[n] = hex.EncodeToString(sum[:])
	}
	return h
}

// None returns the Summary of an output directory without a checkpoint.
func None() Summary { return Summary{Step: -1} }

// Summarize describes the loaded checkpoint c.
func Summarize(c *Checkpoint) (Summary, error) {
	b, err := os.ReadFile(filepath.Join(c.Dir, ManifestFile))
	if err != nil {
		return None(), fmt.Errorf("checkpoint: %w", err)
	}
	sum := sha256.Sum256(b)
	files := append([]string{ManifestFile}, slices.Sorted(maps.Keys(c.Manifest.Files))...)
	return Summary{Step: c.Manifest.Step, Name: filepath.Base(c.Dir), Manifest: hex.EncodeToString(sum[:]), Files: files}, nil
}

// TempCopyName returns a fresh name, in an output directory, for a
// checkpoint being copied there. [Latest] ignores it; [Install] publishes
// it.
func TempCopyName(name string) string {
	return filepath.Base(tempName(".", "copy-"+name))
}

// Install publishes the checkpoint directory tmp, a copy made in outputDir
// under a [TempCopyName], as a checkpoint of outputDir: it loads tmp
// (verifying every data file against the manifest), checks that the
// manifest's SHA-256 is wantManifest, renames tmp to its step_ name, points
// latest at it if it is the newest and removes old checkpoints beyond
// keepLast (<= 0 keeps all). On error tmp is removed: what Latest would
// accept is only ever a complete, verified copy.
func Install(outputDir, tmp, wantManifest string, keepLast int) (dir string, err error) {
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if filepath.Dir(filepath.Clean(tmp)) != filepath.Clean(outputDir) || !strings.HasPrefix(filepath.Base(tmp), tmpPrefix) {
		return "", fmt.Errorf("checkpoint: %s is not a temporary copy in %s", tmp, outputDir)
	}
	c, err := Load(tmp)
	if err != nil {
		return "", err
	}
	s, err := Summarize(c)
	if err != nil {
		return "", err
	}
	if s.Manifest != wantManifest {
		return "", &FormatError{File: filepath.Join(tmp, ManifestFile), Msg: fmt.Sprintf("SHA-256 %s, the copied checkpoint's is %s: the copy was altered", s.Manifest, wantManifest)}
	}
	if err := syncDir(tmp); err != nil {
		return "", err
	}
	name := DirName(c.Manifest.Step)
	dir = filepath.Join(outputDir, name)
	if _, err := os.Lstat(dir); err == nil {
		// Already there (a copy that raced with another): keep it.
		os.RemoveAll(tmp)
		return dir, nil
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	if err := syncDir(outputDir); err != nil {
		return dir, err
	}
	steps, err := listSteps(outputDir)
	if err != nil {
		return dir, err
	}
	if len(steps) > 0 && steps[0] == name {
		if err := writeLatest(outputDir, name); err != nil {
			return dir, err
		}
	}
	if err := rotate(outputDir, steps[0], keepLast); err != nil {
		return dir, fmt.Errorf("checkpoint: installed %s but could not remove old checkpoints: %w", dir, err)
	}
	return dir, nil
}

// savedPrefix starts the log line a trainer writes after each checkpoint
// it saved (SavedLine); launchers watch for it (ParseSaved).
const savedPrefix = "[checkpoint] saved step "

// SavedLine returns the log line for a checkpoint of step saved in dir,
// with detail (how much the save cost the step) after it in parentheses.
func SavedLine(step int, dir, detail string) string {
	return fmt.Sprintf("%s%d to %s (%s)", savedPrefix, step, dir, detail)
}

// ParseSaved returns the step of a SavedLine; ok is false for any other
// line.
func ParseSaved(line string) (step int, ok bool) {
	step, _, ok = ParseSavedDir(line)
	return step, ok
}

// ParseSavedDir returns the step and the directory of a SavedLine; ok is
// false for any other line.
func ParseSavedDir(line string) (step int, dir string, ok bool) {
	rest, found := strings.CutPrefix(line, savedPrefix)
	if !found {
		return 0, "", false
	}
	n, rest, found := strings.Cut(rest, " to ")
	if !found {
		return 0, "", false
	}
	step, err := strconv.Atoi(n)
	if i := strings.LastIndex(rest, " ("); i >= 0 {
		rest = rest[:i]
	}
	return step, rest, err == nil && step >= 0
}

// savingPrefix starts the log line of a save that goes on in the
// background (SavingLine); its SavedLine follows when it is written.
const savingPrefix = "[checkpoint] saving step "

// SavingLine returns the log line a trainer writes when the save of
// step begins in the background.
func SavingLine(step int) string {
	return fmt.Sprintf("%s%d in the background", savingPrefix, step)
}

// ParseSaving returns the step of a SavingLine; ok is false for any other
// line.
func ParseSaving(line string) (step int, ok bool) {
	rest, found := strings.CutPrefix(line, savingPrefix)
	if !found {
		return 0, false
	}
	n, _, _ := strings.Cut(rest, " ")
	step, err := strconv.Atoi(n)
	return step, err == nil && step >= 0
}
