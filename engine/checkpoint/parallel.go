package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// A ShardReport describes one data file that a writer of a parallel save
// wrote into the checkpoint's temporary directory: what [WriteShard]
// returns, travels to the committing process, and [Commit] takes.
type ShardReport struct {
	File   string  `json:"file"`   // name in the checkpoint directory
	SHA256 string  `json:"sha256"` // hex SHA-256 of the file
	Bytes  int64   `json:"bytes"`  // its size
	Blocks []Block `json:"blocks"` // the blocks it holds
}

// A Block is one block of a global tensor held by a data file.
type Block struct {
	Tensor string `json:"tensor"` // the global tensor's name
	Key    string `json:"key"`    // the block's name in the file
	Global []int  `json:"global"` // the tensor's global shape
	Start  []int  `json:"start"`  // the block's first element, in global coordinates
	Shape  []int  `json:"shape"`
}

// validToken reports whether token may be a parallel save's token, which
// becomes part of a directory name: 8 to 64 lowercase hexadecimal digits.
// (A loop, not a regular expression: every gptui process would compile
// the expression at its start, 1.2 ms of each trivial one.)
func validToken(token string) bool {
	if len(token) < 8 || len(token) > 64 {
		return false
	}
	for _, c := range []byte(token) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ShardFile returns the name of the data file the writer rank writes:
// rank_<R>.safetensors.
func ShardFile(rank int) string { return shardFile(rank) }

// SaveDir returns the temporary directory in outputDir into which the
// writers of the parallel save of step, agreed on by token (lowercase
// hex, drawn by one of them for this save), write their files; each
// creates it with [BeginSave].
func SaveDir(outputDir string, step int, token string) string {
	return filepath.Join(outputDir, tmpPrefix+DirName(step)+"-"+token)
}

// BeginSave creates the temporary directory of a parallel save (see
// [SaveDir]) if it does not exist yet: every writer calls it, those that
// share the output directory (the ranks of one machine) create it once.
func BeginSave(outputDir string, step int, token string) (string, error) {
	if step < 0 {
		return "", fmt.Errorf("checkpoint: negative step %d", step)
	}
	if !validToken(token) {
		return "", fmt.Errorf("checkpoint: save token %q is not 8 to 64 lowercase hex digits", token)
	}
	dir := SaveDir(outputDir, step, token)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return "", fmt.Errorf("checkpoint: saving step %d: %w", step, err)
	}
	return dir, nil
}

// WriteShard writes the parts one writer (rank) holds into its data file
// in dir, a directory [BeginSave] made, fsyncs it and reports what it
// wrote. The writer's parts must not overlap one another; those of all
// the writers of a checkpoint together cover every tensor.
func WriteShard(dir string, rank int, parts []Part) (ShardReport, error) {
	entries, err := planShard(rank, parts)
	if err != nil {
		return ShardReport{}, fmt.Errorf("checkpoint: rank %d: %w", rank, err)
	}
	sh, err := writeShard(dir, rank, parts, entries, saveOptions{})
	if err != nil {
		return ShardReport{}, fmt.Errorf("checkpoint: %w", err)
	}
	r := ShardReport{File: sh.file, SHA256: sh.sum, Blocks: make([]Block, len(sh.entries))}
	if fi, err := os.Stat(filepath.Join(dir, sh.file)); err == nil {
		r.Bytes = fi.Size()
	}
	for i, e := range sh.entries {
		r.Blocks[i] = Block{Tensor: e.name, Key: e.key, Global: e.globalShape, Start: e.start, Shape: e.shape}
	}
	return r, nil
}

// Commit publishes the parallel save in tmp, a directory [BeginSave] made
// in outputDir that holds the files the reports describe, as the
// checkpoint of m.Step, as [Save] publishes its own: the manifest is
// written last into tmp, tmp renamed into place, latest replaced, and
// checkpoints beyond the newest keepLast removed. The reports are checked
// as a manifest is (the blocks of every tensor cover it without
// overlapping) and every file they name must be in tmp with its reported
// size; on an error nothing is published and tmp is removed. Debris of
// earlier interrupted saves is removed first.
func Commit(outputDir, tmp string, m Manifest, reports []ShardReport, keepLast int) (dir string, err error) {
	defer func() {
		if err != nil && dir == "" {
			os.RemoveAll(tmp)
			if !strings.HasPrefix(err.Error(), "checkpoint: ") {
				err = fmt.Errorf("checkpoint: saving step %d: %w", m.Step, err)
			}
		}
	}()
	for i, r := range reports {
		if msg := checkFileName(r.File); msg != "" {
			return "", fmt.Errorf("report %d: file %q: %s", i, r.File, msg)
		}
		fi, err := os.Stat(filepath.Join(tmp, r.File))
		if err != nil {
			return "", fmt.Errorf("a writer's file: %w", err)
		}
		if fi.Size() != r.Bytes {
			return "", fmt.Errorf("%s holds %d bytes; its writer reported %d", r.File, fi.Size(), r.Bytes)
		}
	}
	b, err := Index(m, reports)
	if err != nil {
		return "", err
	}
	return Publish(outputDir, tmp, b, keepLast)
}

// Index returns the manifest of the parallel save of m whose writers'
// files the reports describe, sealed: what [Publish] writes. The reports
// are checked as a manifest is: every tensor's blocks cover it without
// overlapping, each file reported once.
func Index(m Manifest, reports []ShardReport) ([]byte, error) {
	shards := make([]shardInfo, len(reports))
	seen := make(map[string]bool, len(reports))
	for i, r := range reports {
		if msg := checkFileName(r.File); msg != "" {
			return nil, fmt.Errorf("report %d: file %q: %s", i, r.File, msg)
		}
		if seen[r.File] {
			return nil, fmt.Errorf("two writers report %s", r.File)
		}
		seen[r.File] = true
		sh := shardInfo{file: r.File, sum: r.SHA256, entries: make([]shardEntry, len(r.Blocks))}
		for k, b := range r.Blocks {
			sh.entries[k] = shardEntry{name: b.Tensor, key: b.Key, globalShape: b.Global, start: b.Start, shape: b.Shape}
		}
		shards[i] = sh
	}
	pre := m
	pre.Tensors = mergeShards(shards)
	pre.Files = make(map[string]string, len(shards))
	for _, sh := range shards {
		pre.Files[sh.file] = sh.sum
	}
	if msg := checkManifest(&pre); msg != "" {
		return nil, errors.New(msg)
	}
	return indexBytes(m, shards)
}

// Publish writes the sealed manifest b (from [Index]) into tmp, a
// directory [BeginSave] made in outputDir, and publishes it as its step's
// checkpoint, as [Save] does: renamed into place, latest replaced, old
// checkpoints beyond keepLast removed. Where the writers of a save were
// on several machines, each machine publishes the files its writers wrote
// with the same manifest: its part of the checkpoint (see [Open]). Every
// file in tmp must be one of the manifest's. On an error nothing is
// published and tmp is removed.
func Publish(outputDir, tmp string, b []byte, keepLast int) (dir string, err error) {
	defer func() {
		if err != nil && dir == "" {
			os.RemoveAll(tmp)
		}
	}()
	if filepath.Dir(filepath.Clean(tmp)) != filepath.Clean(outputDir) {
		return "", fmt.Errorf("checkpoint: %s is not a directory of %s", tmp, outputDir)
	}
	m, err := ParseManifest(filepath.Join(tmp, ManifestFile), b)
	if err != nil {
		return "", err
	}
	des, err := os.ReadDir(tmp)
	if err != nil {
		return "", fmt.Errorf("checkpoint: saving step %d: %w", m.Step, err)
	}
	for _, de := range des {
		if _, ok := m.Files[de.Name()]; !ok {
			return "", fmt.Errorf("checkpoint: saving step %d: %s is not a file of its manifest", m.Step, filepath.Join(tmp, de.Name()))
		}
	}
	if fi, err := os.Stat(tmp); err == nil {
		removeStaleExcept(outputDir, fi.ModTime(), filepath.Base(tmp))
	}
	dir, err = publish(outputDir, tmp, m.Step, b, saveOptions{keepLast: keepLast})
	if err != nil && dir == "" {
		err = fmt.Errorf("checkpoint: saving step %d: %w", m.Step, err)
	}
	return dir, err
}

// copyLinger is how long a copy's temporary directory ([TempCopyName])
// outlives a later save: a copy that made no new file for that long is
// debris of an interrupted one.
const copyLinger = 30 * time.Minute

// removeStaleExcept removes the .tmp- entries of outputDir last modified
// before before, except the one named keep (the save in progress; ""
// none): debris of saves that crashed. It is best effort; what cannot be
// removed now is tried again by the next save.
func removeStaleExcept(outputDir string, before time.Time, keep string) {
	des, err := os.ReadDir(outputDir)
	if err != nil {
		return
	}
	for _, de := range des {
		if de.Name() == keep || !strings.HasPrefix(de.Name(), tmpPrefix) {
			continue
		}
		// A copy from another machine may be in progress while this
		// machine saves (a replica of another's part): its directory's
		// time is that of its last new file, which may be a while ago.
		limit := before
		if strings.HasPrefix(de.Name(), tmpPrefix+"copy-") {
			limit = before.Add(-copyLinger)
		}
		if fi, err := de.Info(); err == nil && fi.ModTime().Before(limit) {
			os.RemoveAll(filepath.Join(outputDir, de.Name()))
		}
	}
}

// numel is the element count of shape.
func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// Consolidate writes c, a checkpoint of any number of files, as a
// checkpoint of one file in outputDir (a step directory of the same step,
// made the latest, as [Save] does): every tensor whole, the manifest's
// state and run carried over. It reads one tensor at a time: its memory
// is the largest tensor, not the checkpoint.
func Consolidate(c *Checkpoint, outputDir string) (string, error) {
	parts := make([]Part, len(c.Manifest.Tensors))
	for i, t := range c.Manifest.Tensors {
		zero := make([]int, len(t.Shape))
		parts[i] = Part{Name: t.Name, GlobalShape: t.Shape, Start: zero, Shape: t.Shape,
			Fill: func(dst []float32) error { return c.Read(t.Name, zero, t.Shape, dst) }}
	}
	m := c.Manifest
	m.Tensors, m.Files = nil, nil
	return Save(outputDir, m, parts, 0)
}
