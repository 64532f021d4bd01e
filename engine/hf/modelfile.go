package hf

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/safetensors"
)

// The model files of a folder are model.safetensors, or shards that
// model.safetensors.index.json lists:
//
//	{"metadata": {"total_size": BYTES},
//	 "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors", …}}
//
// each tensor in the shard its weight_map names, the shards in the folder.

// maxIndexLen bounds model.safetensors.index.json (a 405B Llama's is
// about 100 KB).
const maxIndexLen = 16 << 20

// tensorSet is the model files of a folder, opened, their headers checked
// (package safetensors: every tensor's byte range lies in its file and
// matches its dtype and shape), and for shards checked against the index.
type tensorSet struct {
	path    string   // model.safetensors, or the index: where a missing tensor is looked for
	shards  []*shard // the files, in the order the index first names them
	entries []entry  // every tensor, sorted by name, so that errors are deterministic
}

// shard is one opened model file.
type shard struct {
	*safetensors.File
	f *os.File
}

// entry is a tensor and the file that holds it.
type entry struct {
	safetensors.Entry
	file *shard
}

// openTensors opens dir's model files: model.safetensors if there is one,
// else the shards of model.safetensors.index.json.
func openTensors(dir string) (*tensorSet, error) {
	single := filepath.Join(dir, ModelFile)
	sh, err := openShard(single)
	if err == nil {
		s := &tensorSet{path: single, shards: []*shard{sh}}
		for _, e := range sh.Tensors {
			s.entries = append(s.entries, entry{e, sh})
		}
		s.sort()
		return s, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	s, ierr := openIndex(filepath.Join(dir, IndexFile))
	if errors.Is(ierr, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w, nor %s", err, IndexFile)
	}
	return s, ierr
}

// openShard opens path and parses its header.
func openShard(path string) (*shard, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	st, err := safetensors.Parse(path, f, fi.Size())
	if err != nil {
		f.Close()
		return nil, formatError(err)
	}
	return &shard{File: st, f: f}, nil
}

// index is the part of model.safetensors.index.json that Import reads.
type index struct {
	WeightMap map[string]string `json:"weight_map"`
}

// openIndex reads the index at path and opens the shards it names, each
// once; every tensor of a shard must be mapped to it and every mapped
// tensor be in its shard.
func openIndex(path string) (_ *tensorSet, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	bad := func(format string, args ...any) error {
		return &engine.FormatError{File: path, Msg: fmt.Sprintf(format, args...)}
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > maxIndexLen {
		return nil, bad("%d bytes, more than the %d an index has room for", fi.Size(), maxIndexLen)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	var ix index
	if err := json.Unmarshal(b, &ix); err != nil {
		return nil, bad("not a safetensors index: %v", err)
	}
	if len(ix.WeightMap) == 0 {
		return nil, bad("no weight_map: a sharded model's index names the shard of each tensor")
	}
	s := &tensorSet{path: path}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	dir := filepath.Dir(path)
	byName := map[string]*shard{}
	for _, name := range slices.Sorted(maps.Keys(ix.WeightMap)) {
		file := ix.WeightMap[name]
		if file == "" || file != filepath.Base(file) || file == "." || file == ".." || strings.ContainsRune(file, '\\') || !strings.HasSuffix(file, ".safetensors") {
			return nil, bad("weight_map: tensor %s is in %q, not a .safetensors file of this folder", name, file)
		}
		if byName[file] != nil {
			continue
		}
		sh, err := openShard(filepath.Join(dir, file))
		if err != nil {
			return nil, bad("weight_map: tensor %s: %v", name, err)
		}
		byName[file] = sh
		s.shards = append(s.shards, sh)
	}
	for _, sh := range s.shards {
		file := filepath.Base(sh.Path)
		for _, e := range sh.Tensors {
			if m, ok := ix.WeightMap[e.Name]; !ok || m != file {
				return nil, bad("%s holds tensor %s, which weight_map puts in %q", file, e.Name, m)
			}
			s.entries = append(s.entries, entry{e, sh})
		}
	}
	if len(s.entries) != len(ix.WeightMap) {
		for _, name := range slices.Sorted(maps.Keys(ix.WeightMap)) {
			if _, ok := byName[ix.WeightMap[name]].Tensor(name); !ok {
				return nil, bad("weight_map puts tensor %s in %s, which does not hold it", name, ix.WeightMap[name])
			}
		}
	}
	s.sort()
	return s, nil
}

// sort sorts the entries by name.
func (s *tensorSet) sort() {
	slices.SortFunc(s.entries, func(a, b entry) int { return strings.Compare(a.Name, b.Name) })
}

// Close closes the files.
func (s *tensorSet) Close() error {
	var errs []error
	for _, sh := range s.shards {
		errs = append(errs, sh.f.Close())
	}
	return errors.Join(errs...)
}

// dataLen is the bytes of tensor data of all the files.
func (s *tensorSet) dataLen() int64 {
	var n int64
	for _, sh := range s.shards {
		n += sh.DataLen()
	}
	return n
}

// files names the model files, for messages: model.safetensors, or "N
// shards".
func (s *tensorSet) files() string {
	if s.path != "" && filepath.Base(s.path) == ModelFile {
		return ModelFile
	}
	return fmt.Sprintf("the %d shards of %s", len(s.shards), IndexFile)
}

// read reads tensor e into dst (len(dst) == its element count), widening
// F16 and BF16 to float32 exactly.
func (s *tensorSet) read(e entry, dst []float32) error {
	return formatError(e.file.Read(e.file.f, e.Entry, dst))
}

// formatError returns err, a *safetensors.FormatError made an
// *engine.FormatError, the type of every error about Import's input.
func formatError(err error) error {
	var fe *safetensors.FormatError
	if !errors.As(err, &fe) {
		return err
	}
	msg := fe.Msg
	if fe.Err != nil {
		msg += ": " + fe.Err.Error()
	}
	return &engine.FormatError{File: fe.File, Msg: msg}
}

// outTensor is a tensor Export writes: its name and shape in the file, and
// its values.
type outTensor struct {
	safetensors.Tensor
	values func() ([]float32, error) // valid until the next call of any values
}

// bytes is the tensor's size in a file, as F32.
func (t outTensor) bytes() int64 {
	n := int64(4)
	for _, d := range t.Shape {
		n *= int64(d)
	}
	return n
}

// writeTensors writes ts into dir: model.safetensors when they fit in
// maxShard bytes, else shards of at most maxShard bytes (a larger tensor
// alone in its shard), in the order of ts, named
// model-00001-of-0000N.safetensors as transformers names them, and the
// index. Each file is replaced atomically; the model files of an earlier
// export that this one does not write are removed once it is complete.
func writeTensors(dir string, ts []outTensor, maxShard int64) error {
	var groups [][]outTensor
	var size, total int64
	for _, t := range ts {
		if len(groups) == 0 || size > 0 && size+t.bytes() > maxShard {
			groups = append(groups, nil)
			size = 0
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], t)
		size += t.bytes()
		total += t.bytes()
	}
	keep := map[string]bool{ConfigFile: true}
	if len(groups) <= 1 {
		if err := writeModel(filepath.Join(dir, ModelFile), ts); err != nil {
			return err
		}
		keep[ModelFile] = true
		return removeStale(dir, keep)
	}
	ix := struct {
		Metadata  map[string]int64  `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}{map[string]int64{"total_size": total}, map[string]string{}}
	for i, g := range groups {
		file := fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(groups))
		if err := writeModel(filepath.Join(dir, file), g); err != nil {
			return err
		}
		for _, t := range g {
			ix.WeightMap[t.Name] = file
		}
		keep[file] = true
	}
	b, err := json.MarshalIndent(ix, "", "  ")
	if err != nil {
		return err
	}
	err = writeFileAtomic(filepath.Join(dir, IndexFile), func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
	if err != nil {
		return err
	}
	keep[IndexFile] = true
	return removeStale(dir, keep)
}

// removeStale removes from dir the model files (model.safetensors, the
// index, model-*-of-*.safetensors shards) that keep does not hold: an
// earlier export's, which a reader would take for this one's.
func removeStale(dir string, keep map[string]bool) error {
	shards, err := filepath.Glob(filepath.Join(dir, "model-*-of-*.safetensors"))
	if err != nil {
		return err
	}
	for _, p := range append(shards, filepath.Join(dir, ModelFile), filepath.Join(dir, IndexFile)) {
		if keep[filepath.Base(p)] {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// writeModel writes a safetensors file of F32 tensors at path atomically,
// with the metadata transformers' save_pretrained writes.
func writeModel(path string, ts []outTensor) error {
	return writeFileAtomic(path, func(w io.Writer) error {
		hdr := make([]safetensors.Tensor, len(ts))
		for i, t := range ts {
			hdr[i] = t.Tensor
		}
		sw, err := safetensors.NewWriter(w, hdr, map[string]string{"format": "pt"})
		if err != nil {
			return err
		}
		for _, t := range ts {
			v, err := t.values()
			if err != nil {
				return err
			}
			if err := sw.Write(v); err != nil {
				return err
			}
		}
		return sw.Close()
	})
}

// writeFileAtomic writes path through a temporary file in the same
// directory, renamed over path only once it is complete and synced.
func writeFileAtomic(path string, write func(w io.Writer) error) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	if err := write(bw); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
