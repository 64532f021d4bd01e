package checkpoint

import (
	"bufio"
	"cmp"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gptui/gptui/engine/safetensors"
)

// LatestFile is the name of the file in the output directory that names
// the newest complete checkpoint directory.
const LatestFile = "latest"

// tmpPrefix starts the names of work in progress in the output directory.
const tmpPrefix = ".tmp-"

// A Part is what one writer holds of one tensor: the block of the global
// tensor of shape GlobalShape that starts at Start and has shape Shape,
// row-major in Data. A single process holds every tensor whole: Start is
// all zeros and Shape equals GlobalShape.
type Part struct {
	Name        string
	GlobalShape []int
	Start       []int
	Shape       []int
	Data        []float32
	// Fill, when Data is nil, writes the block's values into dst (of the
	// block's element count) as the file is written: a block that is not
	// a contiguous stretch of its holder's memory is copied out only then,
	// into a buffer the writer reuses for the next such block. Its error
	// fails the save.
	Fill func(dst []float32) error
}

// DirName returns the name of the checkpoint directory of step:
// "step_" and the step zero-padded to eight digits.
func DirName(step int) string { return fmt.Sprintf("step_%08d", step) }

// stepOf parses a checkpoint directory name written by DirName or an
// unpadded one ("step_200").
func stepOf(name string) (int, bool) {
	digits, ok := strings.CutPrefix(name, "step_")
	if !ok || digits == "" || strings.TrimLeft(digits, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	return n, err == nil
}

// Save writes the checkpoint of m.Step made of parts to
// <outputDir>/<DirName(m.Step)> and makes it the latest. It fills in
// m.FormatVersion, m.Tensors and m.Files; the rest of m is stored as given.
// The parts of each tensor must cover it without overlapping.
//
// The save is atomic: everything is written into a temporary directory and
// fsynced, the directory is renamed into place, and then the latest file
// is replaced atomically. An existing directory of the same step is
// replaced. Afterwards, if keepLast > 0, the checkpoints beyond the newest
// keepLast are removed, counting the one just written first and the others
// from the highest step down. Debris of interrupted saves (.tmp-* entries
// older than this call) is removed first.
//
// Save returns the checkpoint's directory. If only the removal of old
// checkpoints fails, it returns the directory together with the error.
func Save(outputDir string, m Manifest, parts []Part, keepLast int) (string, error) {
	return save(outputDir, m, parts, saveOptions{keepLast: keepLast})
}

// saveOptions controls save.
type saveOptions struct {
	keepLast int
	// at, if not nil, is called as each phase of a save begins; tests use
	// it to crash a save at a chosen point. Phases: "tensors" (half the
	// tensor bytes written), "manifest", "rename", "latest", "rotate".
	at func(phase string)
}

func (o saveOptions) phase(p string) {
	if o.at != nil {
		o.at(p)
	}
}

func save(outputDir string, m Manifest, parts []Part, opt saveOptions) (dir string, err error) {
	start := time.Now()
	if m.Step < 0 {
		return "", fmt.Errorf("checkpoint: negative step %d", m.Step)
	}
	defer func() {
		if err != nil && dir == "" {
			err = fmt.Errorf("checkpoint: saving step %d: %w", m.Step, err)
		}
	}()
	// Check the parts before writing anything.
	entries, err := planShard(0, parts)
	if err != nil {
		return "", err
	}
	pre := m
	pre.Tensors = mergeShards([]shardInfo{{file: shardFile(0), entries: entries}})
	pre.Files = map[string]string{shardFile(0): strings.Repeat("0", 64)} // checksum not known yet
	if msg := checkManifest(&pre); msg != "" {
		return "", errors.New(msg)
	}
	if _, err := json.Marshal(pre); err != nil {
		return "", fmt.Errorf("encoding the manifest: %w", err)
	}

	if err := os.MkdirAll(outputDir, 0o777); err != nil {
		return "", err
	}
	removeStale(outputDir, start)
	tmp, err := makeTempDir(outputDir, DirName(m.Step))
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	sh, err := writeShard(tmp, 0, parts, entries, opt)
	if err != nil {
		return "", err
	}
	return commit(outputDir, tmp, m, []shardInfo{sh}, opt)
}

// shardEntry is one block a writer holds: where it lies in the global
// tensor and its name in the writer's file.
type shardEntry struct {
	name        string // global tensor
	key         string // name in the file
	globalShape []int
	start       []int
	shape       []int
}

// shardInfo reports one written data file.
type shardInfo struct {
	file    string // name in the checkpoint directory
	sum     string // hex SHA-256
	entries []shardEntry
}

// shardFile returns the data file name of rank.
func shardFile(rank int) string { return fmt.Sprintf("rank_%05d.safetensors", rank) }

// planShard checks the parts of one writer and names their blocks in its
// file: a tensor of which the writer holds one block is stored under its
// own name, several blocks of one tensor as "<name>@<start>" (e.g. "wte@0,384").
func planShard(rank int, parts []Part) ([]shardEntry, error) {
	count := make(map[string]int)
	global := make(map[string][]int)
	for i, p := range parts {
		if p.Name == "" {
			return nil, fmt.Errorf("part %d has no name", i)
		}
		if len(p.Start) != len(p.GlobalShape) || len(p.Shape) != len(p.GlobalShape) {
			return nil, fmt.Errorf("tensor %q: start %v and shape %v do not match global shape %v", p.Name, p.Start, p.Shape, p.GlobalShape)
		}
		if g, ok := global[p.Name]; ok && !slices.Equal(g, p.GlobalShape) {
			return nil, fmt.Errorf("tensor %q: parts disagree on the global shape: %v and %v", p.Name, g, p.GlobalShape)
		}
		global[p.Name] = p.GlobalShape
		n, err := safetensors.Elements(p.Shape, 1)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: shape %v: %w", p.Name, p.Shape, err)
		}
		if (p.Fill == nil || p.Data != nil) && int64(len(p.Data)) != n {
			return nil, fmt.Errorf("tensor %q: shape %v needs %d values, have %d", p.Name, p.Shape, n, len(p.Data))
		}
		count[p.Name]++
	}
	entries := make([]shardEntry, len(parts))
	keys := make(map[string]bool, len(parts))
	for i, p := range parts {
		key := p.Name
		if count[p.Name] > 1 {
			s := make([]string, len(p.Start))
			for d, v := range p.Start {
				s[d] = strconv.Itoa(v)
			}
			key = p.Name + "@" + strings.Join(s, ",")
		}
		if keys[key] {
			return nil, fmt.Errorf("rank %d: two blocks named %q", rank, key)
		}
		keys[key] = true
		entries[i] = shardEntry{name: p.Name, key: key, globalShape: p.GlobalShape, start: p.Start, shape: p.Shape}
	}
	return entries, nil
}

// mergeShards builds the manifest's tensor list from the writers' reports,
// tensors in order of first appearance.
func mergeShards(shards []shardInfo) []TensorInfo {
	var tensors []TensorInfo
	index := make(map[string]int)
	for _, sh := range shards {
		for _, e := range sh.entries {
			i, ok := index[e.name]
			if !ok {
				i = len(tensors)
				index[e.name] = i
				tensors = append(tensors, TensorInfo{Name: e.name, Dtype: DtypeF32, Shape: e.globalShape})
			}
			s := Slice{File: sh.file, Start: e.start, Shape: e.shape}
			if e.key != e.name {
				s.Key = e.key
			}
			tensors[i].Slices = append(tensors[i].Slices, s)
		}
	}
	return tensors
}

// writeShard writes the parts of rank, named by entries, to the rank's
// data file in dir and fsyncs it.
func writeShard(dir string, rank int, parts []Part, entries []shardEntry, opt saveOptions) (shardInfo, error) {
	name := shardFile(rank)
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
	if err != nil {
		return shardInfo{}, err
	}
	defer f.Close() // a second Close after the one below is harmless
	h := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(f, h), 1<<20)
	tensors := make([]safetensors.Tensor, len(parts))
	for i, p := range parts {
		tensors[i] = safetensors.Tensor{Name: entries[i].key, Shape: p.Shape}
	}
	md := map[string]string{"format": "gptui-checkpoint", "format_version": strconv.Itoa(FormatVersion), "rank": strconv.Itoa(rank)}
	if err := encodeShard(bw, tensors, parts, md, opt); err != nil {
		return shardInfo{}, fmt.Errorf("writing %s: %w", name, err)
	}
	if err := bw.Flush(); err != nil {
		return shardInfo{}, fmt.Errorf("writing %s: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		return shardInfo{}, fmt.Errorf("writing %s: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return shardInfo{}, fmt.Errorf("writing %s: %w", name, err)
	}
	return shardInfo{file: name, sum: hex.EncodeToString(h.Sum(nil)), entries: entries}, nil
}

// encodeShard writes the parts, as tensors, as a safetensors file to bw.
// A save that crash tests watch (opt.at set) flushes bw and enters its
// "tensors" phase as soon as half of the tensor bytes are written.
func encodeShard(bw *bufio.Writer, tensors []safetensors.Tensor, parts []Part, md map[string]string, opt saveOptions) error {
	sw, err := safetensors.NewWriter(bw, tensors, md)
	if err != nil {
		return err
	}
	const step = 1 << 16 // values per Write: the granularity of "half"
	var fill []float32   // the filled blocks' buffer, reused
	for _, p := range parts {
		data := p.Data
		if data == nil && p.Fill != nil {
			n := numel(p.Shape)
			fill = slices.Grow(fill[:0], n)[:n]
			if err := p.Fill(fill); err != nil {
				return fmt.Errorf("tensor %q: %w", p.Name, err)
			}
			data = fill
		}
		for i := 0; i < len(data); i += step {
			before := sw.Written()
			if err := sw.Write(data[i:min(i+step, len(data))]); err != nil {
				return err
			}
			if total := sw.Size(); opt.at != nil && 2*before < total && 2*sw.Written() >= total {
				if err := bw.Flush(); err != nil {
					return err
				}
				opt.phase("tensors")
			}
		}
	}
	return sw.Close()
}

// commit writes the manifest of the data files that shards describe into
// tmp, publishes tmp as the checkpoint of m.Step, points latest at it and
// removes old checkpoints.
func commit(outputDir, tmp string, m Manifest, shards []shardInfo, opt saveOptions) (string, error) {
	b, err := indexBytes(m, shards)
	if err != nil {
		return "", err
	}
	return publish(outputDir, tmp, m.Step, b, opt)
}

// indexBytes is the sealed manifest of m with the data files that shards
// describe.
func indexBytes(m Manifest, shards []shardInfo) ([]byte, error) {
	m.FormatVersion = FormatVersion
	m.Tensors = mergeShards(shards)
	m.Files = make(map[string]string, len(shards))
	for _, sh := range shards {
		m.Files[sh.file] = sh.sum
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding the manifest: %w", err)
	}
	b = Seal(append(b, '\n'))
	// What is published must load.
	if _, err := ParseManifest(ManifestFile, b); err != nil {
		return nil, err
	}
	return b, nil
}

// publish writes the manifest b of the checkpoint of step into tmp,
// publishes tmp as it, points latest at it and removes old checkpoints.
func publish(outputDir, tmp string, step int, b []byte, opt saveOptions) (string, error) {
	opt.phase("manifest")
	if err := writeFileSync(filepath.Join(tmp, ManifestFile), b); err != nil {
		return "", err
	}
	if err := syncDir(tmp); err != nil {
		return "", err
	}

	opt.phase("rename")
	name := DirName(step)
	dir := filepath.Join(outputDir, name)
	var replaced string
	if _, err := os.Lstat(dir); err == nil {
		replaced = tempName(outputDir, "replaced-"+name)
		if err := os.Rename(dir, replaced); err != nil {
			return "", err
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if replaced != "" {
			os.Rename(replaced, dir) // put the old one back
		}
		return "", err
	}
	if err := syncDir(outputDir); err != nil {
		return "", err
	}

	opt.phase("latest")
	if err := writeLatest(outputDir, name); err != nil {
		return "", err
	}

	opt.phase("rotate")
	var errs []error
	if replaced != "" {
		if err := os.RemoveAll(replaced); err != nil {
			errs = append(errs, err)
		}
	}
	if err := rotate(outputDir, name, opt.keepLast); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return dir, fmt.Errorf("checkpoint: saved %s but could not remove old checkpoints: %w", dir, err)
	}
	return dir, nil
}

// writeLatest atomically replaces outputDir/latest with a file naming the
// checkpoint directory name.
func writeLatest(outputDir, name string) error {
	tmp := tempName(outputDir, LatestFile)
	if err := writeFileSync(tmp, []byte(name+"\n")); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, filepath.Join(outputDir, LatestFile)); err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(outputDir)
}

// rotate removes the checkpoints of outputDir beyond the newest keepLast,
// counting current first; keepLast <= 0 keeps all. Each is first renamed
// to a temporary name so that a crash never leaves a partial step_ directory.
func rotate(outputDir, current string, keepLast int) error {
	if keepLast <= 0 {
		return nil
	}
	steps, err := listSteps(outputDir)
	if err != nil {
		return err
	}
	kept := 1
	var errs []error
	for _, s := range steps {
		if s == current {
			continue
		}
		if kept < keepLast {
			kept++
			continue
		}
		gone := tempName(outputDir, "old-"+s)
		if err := os.Rename(filepath.Join(outputDir, s), gone); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.RemoveAll(gone); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// listSteps returns the names of the checkpoint directories in outputDir,
// highest step first.
func listSteps(outputDir string) ([]string, error) {
	des, err := os.ReadDir(outputDir)
	if err != nil {
		return nil, err
	}
	type step struct {
		name string
		n    int
	}
	var steps []step
	for _, de := range des {
		if n, ok := stepOf(de.Name()); ok && de.IsDir() {
			steps = append(steps, step{de.Name(), n})
		}
	}
	slices.SortFunc(steps, func(a, b step) int { return cmp.Or(cmp.Compare(b.n, a.n), strings.Compare(b.name, a.name)) })
	names := make([]string, len(steps))
	for i, s := range steps {
		names[i] = s.name
	}
	return names, nil
}

// removeStale removes the .tmp- entries of outputDir last modified before
// start: debris of saves that crashed. It is best effort; what cannot be
// removed now is tried again by the next save.
func removeStale(outputDir string, start time.Time) { removeStaleExcept(outputDir, start, "") }

// tempName returns a fresh path in dir for work in progress on what.
func tempName(dir, what string) string {
	var r [8]byte
	rand.Read(r[:]) // never fails
	return filepath.Join(dir, tmpPrefix+what+"-"+hex.EncodeToString(r[:]))
}

// makeTempDir creates a fresh temporary directory in dir for what.
func makeTempDir(dir, what string) (string, error) {
	for {
		p := tempName(dir, what)
		err := os.Mkdir(p, 0o777)
		if !errors.Is(err, fs.ErrExist) {
			return p, err
		}
	}
}

// writeFileSync creates path with content b and fsyncs it.
func writeFileSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// syncDir fsyncs a directory, making the creation, renaming and removal
// of its entries durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
