package hf

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/safetensors"
)

// modelFile is an opened model.safetensors whose header has been checked
// (package safetensors): every tensor's byte range lies in the file and
// matches its dtype and shape.
type modelFile struct {
	*safetensors.File
	f       *os.File
	entries []safetensors.Entry // sorted by name, so that errors are deterministic
}

// openModel opens path and parses its header.
func openModel(path string) (*modelFile, error) {
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
	entries := slices.SortedFunc(slices.Values(st.Tensors), func(a, b safetensors.Entry) int { return strings.Compare(a.Name, b.Name) })
	return &modelFile{File: st, f: f, entries: entries}, nil
}

// Close closes the file.
func (m *modelFile) Close() error { return m.f.Close() }

// read reads tensor e into dst (len(dst) == its element count), widening
// F16 and BF16 to float32 exactly.
func (m *modelFile) read(e safetensors.Entry, dst []float32) error {
	return formatError(m.Read(m.f, e, dst))
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

// writeModel writes a safetensors file of F32 tensors at path atomically,
// with the metadata transformers' save_pretrained writes; values(i)
// returns the values of tensors[i].
func writeModel(path string, tensors []safetensors.Tensor, values func(i int) []float32) error {
	return writeFileAtomic(path, func(w io.Writer) error {
		sw, err := safetensors.NewWriter(w, tensors, map[string]string{"format": "pt"})
		if err != nil {
			return err
		}
		for i := range tensors {
			if err := sw.Write(values(i)); err != nil {
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
