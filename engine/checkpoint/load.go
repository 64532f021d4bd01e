package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gptui/gptui/badinput"
	"github.com/gptui/gptui/engine/safetensors"
)

// ErrNoCheckpoint is returned, wrapped, by [Latest] when the output
// directory holds no checkpoint at all (as opposed to only damaged ones).
var ErrNoCheckpoint = badinput.New("no checkpoint")

// A Checkpoint is a loaded, verified checkpoint directory.
type Checkpoint struct {
	Dir      string
	Manifest Manifest

	files   map[string]*safetensors.File // by file name
	tensors map[string]int               // index into Manifest.Tensors
}

// Load opens the checkpoint in dir. It parses the manifest (refusing a
// newer format version), verifies the SHA-256 of every data file (a
// mismatch is reported as the file being truncated or altered), parses the
// files' headers and checks that every slice the manifest lists is stored
// with the right shape. Tensor data is read later, by [Checkpoint.Read].
// Errors about the content are *[FormatError]s naming the file.
func Load(dir string) (*Checkpoint, error) {
	c, missing, err := Open(dir)
	if err != nil {
		return nil, err
	}
	if len(missing) > 0 {
		return nil, missing[0].Err
	}
	return c, nil
}

// A MissingFile is a data file of a checkpoint's manifest that its
// directory does not hold verified: absent, unreadable, or not the file
// the manifest's SHA-256 names (Err says which).
type MissingFile struct {
	Name string
	Err  error // a *FormatError naming the file
}

// Open is [Load] of a checkpoint directory that may hold only some of its
// data files: a part of a checkpoint whose files lie on several machines,
// each keeping its own ranks' files. The manifest must parse and every
// file present must verify and hold its blocks; those absent or damaged
// are returned, in name order, and a Checkpoint with any missing cannot
// be read (Load refuses it).
func Open(dir string) (*Checkpoint, []MissingFile, error) {
	mpath := filepath.Join(dir, ManifestFile)
	b, err := os.ReadFile(mpath)
	if err != nil {
		return nil, nil, &FormatError{File: mpath, Msg: "cannot read the manifest", Err: err}
	}
	m, err := ParseManifest(mpath, b)
	if err != nil {
		return nil, nil, err
	}
	c := &Checkpoint{Dir: dir, Manifest: *m, files: make(map[string]*safetensors.File), tensors: make(map[string]int)}
	var missing []MissingFile
	for _, name := range slices.Sorted(maps.Keys(m.Files)) {
		st, err := verifyFile(filepath.Join(dir, name), m.Files[name])
		if err != nil {
			missing = append(missing, MissingFile{name, err})
			continue
		}
		c.files[name] = st
	}
	for i, t := range m.Tensors {
		c.tensors[t.Name] = i
		for _, s := range t.Slices {
			st := c.files[s.File]
			if st == nil {
				continue // missing
			}
			h, ok := st.Tensor(s.entry(t.Name))
			switch {
			case !ok:
				return nil, nil, &FormatError{File: st.Path, Msg: fmt.Sprintf("no entry %q for tensor %q", s.entry(t.Name), t.Name)}
			case h.Dtype != t.Dtype || !slices.Equal(h.Shape, s.Shape):
				return nil, nil, &FormatError{File: st.Path, Msg: fmt.Sprintf("entry %q is %s %v; the manifest says %s %v",
					h.Name, h.Dtype, h.Shape, t.Dtype, s.Shape)}
			}
		}
	}
	return c, missing, nil
}

// verifyFile checks the SHA-256 of the file at path against the hex digest
// want and parses its safetensors header.
func verifyFile(path, want string) (*safetensors.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &FormatError{File: path, Msg: "missing or unreadable", Err: err}
	}
	defer f.Close()
	h := sha256.New()
	size, err := io.Copy(h, f)
	if err != nil {
		return nil, &FormatError{File: path, Msg: "unreadable", Err: err}
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return nil, &FormatError{File: path, Msg: fmt.Sprintf(
			"SHA-256 %s does not match the manifest's %s: the file was truncated or altered", got, want)}
	}
	st, err := safetensors.Parse(path, f, size)
	return st, formatError(err)
}

// formatError returns err, a *safetensors.FormatError made a *FormatError,
// so that every error about a checkpoint's content has one type.
func formatError(err error) error {
	var fe *safetensors.FormatError
	if errors.As(err, &fe) {
		return &FormatError{File: fe.File, Msg: fe.Msg, Err: fe.Err}
	}
	return err
}

// Tensor returns the manifest's description of the named tensor.
func (c *Checkpoint) Tensor(name string) (TensorInfo, bool) {
	i, ok := c.tensors[name]
	if !ok {
		return TensorInfo{}, false
	}
	return c.Manifest.Tensors[i], true
}

// Read fills dst with the block of the named global tensor that starts at
// start and has shape shape, row-major, assembling it from the slices that
// hold its parts. len(dst) must be the block's element count.
func (c *Checkpoint) Read(name string, start, shape []int, dst []float32) error {
	return c.ReadInto(name, start, shape, dst, shape, make([]int, len(shape)))
}

// ReadInto is [Checkpoint.Read] writing the block into dst, a row-major
// array of shape dstShape, at dstAt (a rank's slice of a tensor is read
// into its place in the rank's buffer, without a copy). The block must fit
// there and len(dst) must be dstShape's element count.
func (c *Checkpoint) ReadInto(name string, start, shape []int, dst []float32, dstShape, dstAt []int) error {
	t, ok := c.Tensor(name)
	if !ok {
		return fmt.Errorf("checkpoint: %s: no tensor %q", c.Dir, name)
	}
	if len(start) != len(t.Shape) || len(shape) != len(t.Shape) || len(dstShape) != len(t.Shape) || len(dstAt) != len(t.Shape) {
		return fmt.Errorf("checkpoint: tensor %q has %d dimensions; block start %v shape %v, destination shape %v at %v", name, len(t.Shape), start, shape, dstShape, dstAt)
	}
	want, err := safetensors.Elements(shape, 0)
	if err != nil {
		return fmt.Errorf("checkpoint: tensor %q: block shape %v: %w", name, shape, err)
	}
	for d, g := range t.Shape {
		if start[d] < 0 || start[d] > g-shape[d] {
			return fmt.Errorf("checkpoint: tensor %q: block start %v shape %v reaches outside its shape %v", name, start, shape, t.Shape)
		}
		if dstAt[d] < 0 || dstAt[d] > dstShape[d]-shape[d] {
			return fmt.Errorf("checkpoint: tensor %q: block of shape %v at %v reaches outside its destination of shape %v", name, shape, dstAt, dstShape)
		}
	}
	if have, err := safetensors.Elements(dstShape, 0); err != nil || int64(len(dst)) != have {
		return fmt.Errorf("checkpoint: tensor %q: destination of shape %v needs %d values, dst has %d", name, dstShape, have, len(dst))
	}

	open := make(map[string]*os.File)
	defer func() {
		for _, f := range open {
			f.Close()
		}
	}()
	n := len(shape)
	lo, ext, srcLo, dstLo := make([]int, n), make([]int, n), make([]int, n), make([]int, n)
	var got int64
next:
	for _, s := range t.Slices {
		vol := int64(1)
		for d := range n {
			lo[d] = max(start[d], s.Start[d])
			hi := min(start[d]+shape[d], s.Start[d]+s.Shape[d])
			if hi <= lo[d] {
				continue next
			}
			ext[d] = hi - lo[d]
			srcLo[d] = lo[d] - s.Start[d]
			dstLo[d] = lo[d] - start[d] + dstAt[d]
			vol *= int64(ext[d])
		}
		st := c.files[s.File]
		f := open[s.File]
		if f == nil {
			var err error
			if f, err = os.Open(st.Path); err != nil {
				return fmt.Errorf("checkpoint: %w", err)
			}
			open[s.File] = f
		}
		h, _ := st.Tensor(s.entry(name)) // checked by Load
		if err := st.ReadBlock(f, h, srcLo, ext, dst, dstShape, dstLo); err != nil {
			return formatError(err)
		}
		got += vol
	}
	if got != want {
		return fmt.Errorf("checkpoint: tensor %q: slices hold %d of the %d values of block start %v shape %v", name, got, want, start, shape)
	}
	return nil
}

// Latest loads the newest loadable checkpoint of outputDir: the one the
// latest file names or, if that file or the checkpoint it names is missing
// or does not load, the highest step_* directory that loads. Every
// checkpoint passed over, and a missing or damaged latest file, is
// reported in warnings. Temporary .tmp-* entries are ignored. If outputDir
// holds no checkpoint at all, the error wraps [ErrNoCheckpoint]; if it holds
// only damaged ones, the error says so and does not.
func Latest(outputDir string) (*Checkpoint, []string, error) { return LatestOf(outputDir, "") }

// LatestOf is [Latest] taking only checkpoints of the training run run
// ([Manifest.Run]; "" any): those of another run are passed over with a
// warning naming them.
func LatestOf(outputDir, run string) (*Checkpoint, []string, error) {
	var warnings []string
	load := func(dir string) (*Checkpoint, error) {
		c, err := Load(dir)
		if err == nil && run != "" && c.Manifest.Run != run {
			return nil, fmt.Errorf("written by run %q, not %q, whose checkpoints are asked for", c.Manifest.Run, run)
		}
		return c, err
	}
	tried, haveLatest := "", false
	b, err := os.ReadFile(filepath.Join(outputDir, LatestFile))
	switch {
	case err == nil:
		haveLatest = true
		name := strings.TrimSpace(string(b))
		if _, ok := stepOf(name); !ok {
			warnings = append(warnings, fmt.Sprintf("%s: %q does not name a checkpoint directory", filepath.Join(outputDir, LatestFile), name))
			break
		}
		tried = name
		c, err := load(filepath.Join(outputDir, name))
		if err == nil {
			return c, warnings, nil
		}
		warnings = append(warnings, fmt.Sprintf("skipping %s, named by %s: %v", name, LatestFile, err))
	case errors.Is(err, fs.ErrNotExist):
	default:
		warnings = append(warnings, fmt.Sprintf("ignoring %s: %v", LatestFile, err))
	}
	steps, err := listSteps(outputDir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, warnings, fmt.Errorf("checkpoint: %s: %w", outputDir, ErrNoCheckpoint)
		}
		return nil, warnings, fmt.Errorf("checkpoint: %w", err)
	}
	if len(steps) > 0 && !haveLatest {
		warnings = append(warnings, fmt.Sprintf("%s has no readable %s file; using the newest checkpoint that loads", outputDir, LatestFile))
	}
	skipped := 0
	for _, s := range steps {
		if s == tried {
			continue
		}
		c, err := load(filepath.Join(outputDir, s))
		if err == nil {
			return c, warnings, nil
		}
		skipped++
		warnings = append(warnings, fmt.Sprintf("skipping %s: %v", s, err))
	}
	if tried == "" && skipped == 0 {
		return nil, warnings, fmt.Errorf("checkpoint: %s: %w", outputDir, ErrNoCheckpoint)
	}
	return nil, warnings, fmt.Errorf("checkpoint: %s: none of its checkpoints loads (see the warnings)", outputDir)
}
