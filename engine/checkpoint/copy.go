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
)

// Summary identifies a checkpoint, or the part of one that a machine
// holds, for comparing and copying it between machines: its step,
// directory name, the SHA-256 of its manifest, the run that wrote it, the
// files it holds verified and those of its manifest it lacks; and the
// other checkpoints of its output directory, by which two machines tell
// whether their checkpoints come from one run. A checkpoint whose ranks
// were on several machines is kept as parts: each machine's directory
// holds the manifest and its own ranks' files (see [Open]).
type Summary struct {
	Step     int            `json:"step"`               // -1: no checkpoint
	Name     string         `json:"name,omitempty"`     // step_NNNNNNNN
	Manifest string         `json:"manifest,omitempty"` // hex SHA-256 of manifest.json
	Run      string         `json:"run,omitempty"`      // Manifest.Run
	Files    []string       `json:"files,omitempty"`    // manifest.json first, then the data files held verified
	Missing  []string       `json:"missing,omitempty"`  // the manifest's data files not held, or damaged: a part
	History  map[int]Record `json:"history,omitempty"`  // every checkpoint directory by step, this one's included
}

// Complete reports whether s is a whole checkpoint: one that loads.
func (s Summary) Complete() bool { return s.Step >= 0 && len(s.Missing) == 0 }

// A Record is what [History] tells of one checkpoint directory: where it
// comes from, not whether it loads.
type Record struct {
	Manifest string `json:"manifest"`      // hex SHA-256 of manifest.json
	Run      string `json:"run,omitempty"` // Manifest.Run
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
	for _, f := range append(s.Files[1:], s.Missing...) {
		if msg := checkFileName(f); msg != "" {
			return bad("file %q: %s", f, msg)
		}
	}
	return nil
}

// Verified reports whether s holds the whole of the checkpoint o
// describes: the same step and manifest, nothing missing.
func (s Summary) Verified(o Summary) bool {
	return s.Complete() && s.Step == o.Step && s.Manifest == o.Manifest
}

// Holds reports whether s holds the data file f verified.
func (s Summary) Holds(f string) bool { return slices.Contains(s.Files[min(1, len(s.Files)):], f) }

// History returns a [Record] of every checkpoint directory of outputDir
// whose manifest can be read, by step. It verifies nothing else: it tells
// where checkpoints come from, not whether they load.
func History(outputDir string) map[int]Record {
	steps, _ := listSteps(outputDir)
	h := make(map[int]Record, len(steps))
	for _, name := range steps {
		n, _ := stepOf(name)
		b, err := os.ReadFile(filepath.Join(outputDir, name, ManifestFile))
		if err != nil {
			continue
		}
		var m struct {
			Run string `json:"run"`
		}
		if json.Unmarshal(b, &m) != nil || !validRun(m.Run) {
			m.Run = ""
		}
		sum := sha256.Sum256(b)
		if _, ok := h[n]; !ok { // of step_10 and step_00000010, the first listed
			h[n] = Record{Manifest: hex.EncodeToString(sum[:]), Run: m.Run}
		}
	}
	return h
}

// Describe returns the [Summary] of the checkpoint of outputDir that
// [Latest] loads, or with step >= 0 of the checkpoint of that step if it
// loads, with the [History] of outputDir; [None] (with the history) if
// there is no such checkpoint or it does not load. It is what a launcher
// asks each machine before it copies checkpoints between them.
func Describe(outputDir string, step int) (Summary, error) { return DescribeRun(outputDir, step, "") }

// DescribeRun is [Describe] of the checkpoints of the training run run
// alone ("" any): those of other runs are neither offered nor listed in
// the history.
func DescribeRun(outputDir string, step int, run string) (Summary, error) {
	sum := None()
	var c *Checkpoint
	var missing []MissingFile
	if step < 0 {
		c, missing = newestPart(outputDir, run)
	} else if name := stepDir(outputDir, step); name != "" {
		var err error
		c, missing, err = Open(filepath.Join(outputDir, name))
		if err != nil || run != "" && c.Manifest.Run != run {
			c = nil
		}
	}
	if c != nil {
		var err error
		if sum, err = Summarize(c); err != nil {
			return None(), err
		}
		for _, m := range missing {
			sum.Files = slices.DeleteFunc(sum.Files, func(f string) bool { return f == m.Name })
			sum.Missing = append(sum.Missing, m.Name)
		}
	}
	// A checkpoint that does not load, or none at all: nothing to offer.
	sum.History = History(outputDir)
	if run != "" {
		maps.DeleteFunc(sum.History, func(_ int, r Record) bool { return r.Run != run })
	}
	return sum, nil
}

// newestPart opens the checkpoint of outputDir that [LatestOf] would
// load, or the part of one: the directory latest names if its manifest
// reads, else the highest step whose manifest reads (of run, if not "");
// nil if none.
func newestPart(outputDir, run string) (*Checkpoint, []MissingFile) {
	open := func(name string) (*Checkpoint, []MissingFile) {
		c, missing, err := Open(filepath.Join(outputDir, name))
		if err != nil || run != "" && c.Manifest.Run != run {
			return nil, nil
		}
		return c, missing
	}
	if b, err := os.ReadFile(filepath.Join(outputDir, LatestFile)); err == nil {
		if name := strings.TrimSpace(string(b)); name != "" {
			if _, ok := stepOf(name); ok {
				if c, missing := open(name); c != nil {
					return c, missing
				}
			}
		}
	}
	steps, _ := listSteps(outputDir)
	for _, s := range steps {
		if c, missing := open(s); c != nil {
			return c, missing
		}
	}
	return nil, nil
}

// stepDir returns the name of the checkpoint directory of step in
// outputDir ("" if none): DirName(step), or an unpadded name.
func stepDir(outputDir string, step int) string {
	steps, _ := listSteps(outputDir)
	for _, name := range steps {
		if n, _ := stepOf(name); n == step {
			return name
		}
	}
	return ""
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
	return Summary{Step: c.Manifest.Step, Name: filepath.Base(c.Dir), Manifest: hex.EncodeToString(sum[:]), Run: c.Manifest.Run, Files: files}, nil
}

// TempCopyName returns a fresh name, in an output directory, for a
// checkpoint being copied there. [Latest] ignores it; [Install] publishes
// it.
func TempCopyName(name string) string {
	return filepath.Base(tempName(".", "copy-"+name))
}

// Install publishes the checkpoint directory tmp, a copy made in outputDir
// under a [TempCopyName], as a checkpoint of outputDir. It loads tmp
// (verifying every data file against the manifest) and checks that the
// manifest's SHA-256 is wantManifest. Then, if outputDir has no directory
// of the step, tmp is renamed to its step_ name. If it has one:
//
//   - one that loads with the same manifest is kept, and tmp removed (a
//     copy that raced with another, or one the launcher could not know
//     was there);
//   - one that loads with another manifest is not replaced: an error;
//   - one that does not load (a data file altered, truncated or missing,
//     the manifest missing or damaged) is replaced: it is moved aside to a
//     temporary name, tmp is renamed into its place, and only then is the
//     damaged one removed. If the rename fails, it is moved back.
//
// So the step's directory is never removed before the verified copy is in
// its place, and from the moment tmp is verified until Install returns a
// verified copy of the step is at tmp or in place. Then, if
// the step is the newest of outputDir, latest is pointed at it and old
// checkpoints beyond keepLast (<= 0 keeps all) are removed; an older step
// installed (a resume that goes back to the newest step every machine can
// hold) removes nothing. On error tmp is removed: what Latest would accept
// is only ever a complete, verified copy.
func Install(outputDir, tmp, wantManifest string, keepLast int) (dir string, err error) {
	return install(outputDir, tmp, wantManifest, keepLast, os.Rename)
}

// install is Install renaming with rename (tests make it fail).
func install(outputDir, tmp, wantManifest string, keepLast int, rename func(from, to string) error) (dir string, err error) {
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if filepath.Dir(filepath.Clean(tmp)) != filepath.Clean(outputDir) || !strings.HasPrefix(filepath.Base(tmp), tmpPrefix) {
		return "", fmt.Errorf("checkpoint: %s is not a temporary copy in %s", tmp, outputDir)
	}
	c, missing, err := Open(tmp)
	if err != nil {
		return "", err
	}
	s, err := Summarize(c)
	if err != nil {
		return "", err
	}
	held := make(map[string]bool) // the data files the copy brings
	for f := range c.Manifest.Files {
		held[f] = true
	}
	for _, m := range missing {
		if !errors.Is(m.Err, fs.ErrNotExist) {
			return "", m.Err // a file copied but altered
		}
		delete(held, m.Name)
	}
	if s.Manifest != wantManifest {
		return "", &FormatError{File: filepath.Join(tmp, ManifestFile), Msg: fmt.Sprintf("SHA-256 %s, the copied checkpoint's is %s: the copy was altered", s.Manifest, wantManifest)}
	}
	if err := syncDir(tmp); err != nil {
		return "", err
	}
	name := DirName(c.Manifest.Step)
	dir = filepath.Join(outputDir, name)
	if _, err := os.Lstat(dir); err != nil {
		if old := stepDir(outputDir, c.Manifest.Step); old != "" {
			// An unpadded step_N of the same step: the one to compare with.
			name, dir = old, filepath.Join(outputDir, old)
		}
	}
	if _, err := os.Lstat(dir); err == nil {
		if err := replace(outputDir, dir, tmp, wantManifest, held, rename); err != nil {
			return "", err
		}
	} else if err := rename(tmp, dir); err != nil {
		return "", err
	}
	if err := syncDir(outputDir); err != nil {
		return dir, err
	}
	if _, missing, err := Open(dir); err != nil || len(missing) > 0 {
		return dir, err // a part: latest keeps naming a whole checkpoint
	}
	steps, err := listSteps(outputDir)
	if err != nil {
		return dir, err
	}
	if len(steps) == 0 || steps[0] != name {
		return dir, nil
	}
	if err := writeLatest(outputDir, name); err != nil {
		return dir, err
	}
	if err := rotate(outputDir, name, keepLast); err != nil {
		return dir, fmt.Errorf("checkpoint: installed %s but could not remove old checkpoints: %w", dir, err)
	}
	return dir, nil
}

// replace puts the verified copy tmp, of manifest want, in the place of
// the existing checkpoint directory dir if dir's manifest does not read
// or is another's that does not load; merges the data files tmp holds
// (held) into dir if dir holds a part of the same checkpoint, each file
// dir lacks or holds damaged moved in; keeps dir (removing tmp) if it
// loads with manifest want; and returns an error if it loads with
// another.
func replace(outputDir, dir, tmp, want string, held map[string]bool, rename func(from, to string) error) error {
	if c, missing, err := Open(dir); err == nil {
		s, err := Summarize(c)
		if err != nil {
			return err
		}
		switch {
		case s.Manifest == want:
			for _, m := range missing {
				if !held[m.Name] {
					continue
				}
				if err := rename(filepath.Join(tmp, m.Name), filepath.Join(dir, m.Name)); err != nil {
					return fmt.Errorf("checkpoint: completing %s: %w", dir, err)
				}
			}
			if err := syncDir(dir); err != nil {
				return err
			}
			return os.RemoveAll(tmp)
		case len(missing) == 0:
			return fmt.Errorf("checkpoint: %s loads but is another checkpoint of step %d (manifest SHA-256 %s, the copy's %s): not replaced; remove it if the copy is the one to keep", dir, s.Step, s.Manifest, want)
		}
	}
	aside := tempName(outputDir, "damaged-"+filepath.Base(dir))
	if err := rename(dir, aside); err != nil {
		return fmt.Errorf("checkpoint: moving the damaged %s aside: %w", dir, err)
	}
	if err := rename(tmp, dir); err != nil {
		if berr := rename(aside, dir); berr != nil {
			return fmt.Errorf("checkpoint: replacing the damaged %s: %w; it stays at %s: %v", dir, err, aside, berr)
		}
		return fmt.Errorf("checkpoint: replacing the damaged %s: %w", dir, err)
	}
	if err := syncDir(outputDir); err != nil {
		return err
	}
	os.RemoveAll(aside) // best effort: a .tmp- name, which the next save removes
	return nil
}

// savedPrefix starts the log line a trainer writes after each checkpoint
// it saved (SavedLine), for people: programs learn of checkpoints from the
// trainer's typed report (engine.Options.OnCheckpoint), never from this
// line.
const savedPrefix = "[checkpoint] saved step "

// SavedLine returns the log line for a checkpoint of step saved in dir,
// with detail (how much the save cost the step) after it in parentheses.
func SavedLine(step int, dir, detail string) string {
	return fmt.Sprintf("%s%d to %s (%s)", savedPrefix, step, dir, detail)
}

// SavingLine returns the log line a trainer writes when the save of
// step begins in the background; its SavedLine follows when it is written.
func SavingLine(step int) string {
	return fmt.Sprintf("[checkpoint] saving step %d in the background", step)
}
