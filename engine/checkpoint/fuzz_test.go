package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gptui/gptui/internal/allocbound"
)

// FuzzLoad feeds an arbitrary manifest and safetensors file to Load and
// reads every tensor the checkpoint lists. So that inputs get past the
// checksums, a manifest that parses has each of its (at most 4) files
// written with the fuzzed data and its checksum set to match. Nothing may
// panic, every error of Load must be a one-line *FormatError, and parsing,
// loading and reading together must never allocate more than
// allocbound.Limit of the bytes on disk.
func FuzzLoad(f *testing.F) {
	src := f.TempDir()
	dir, err := Save(src, Manifest{Step: 1, LossScale: 1}, []Part{
		{Name: "a", GlobalShape: []int{4, 3}, Start: []int{0, 0}, Shape: []int{2, 3}, Data: []float32{1, 2, 3, 4, 5, 6}},
		{Name: "a", GlobalShape: []int{4, 3}, Start: []int{2, 0}, Shape: []int{2, 3}, Data: []float32{7, 8, 9, 10, 11, 12}},
		{Name: "b", GlobalShape: []int{2}, Start: []int{0}, Shape: []int{2}, Data: []float32{-1, 1}},
	}, 0)
	if err != nil {
		f.Fatal(err)
	}
	man, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		f.Fatal(err)
	}
	st, err := os.ReadFile(filepath.Join(dir, shardFile(0)))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(man, st)
	// A manifest declaring a tensor of 2^40 elements held by one small
	// slice, and one whose slice's shape is huge.
	f.Add([]byte(strings.Replace(string(man), `"shape":[4,3]`, `"shape":[1048576,1048576]`, 1)), st)
	f.Add([]byte(strings.ReplaceAll(string(man), `"shape":[2,3]`, `"shape":[1073741824,3]`)), st)
	f.Add(man, []byte("\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":{\"dtype\":\"F32\",\"shape\":[1073741824],\"data_offsets\":[0,4294967296]}}"))
	f.Add(man, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
	f.Add([]byte(`{"format_version":1,"tensors":[],"files":{}}`), []byte{})

	work := f.TempDir()
	f.Fuzz(func(t *testing.T, man, st []byte) {
		d := filepath.Join(work, "ckpt")
		if err := os.RemoveAll(d); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		disk := len(man)
		var m *Manifest
		used := allocbound.Measure(func() { m, _ = ParseManifest("manifest.json", man) })
		if limit := allocbound.Limit(len(man)); used > limit {
			t.Fatalf("ParseManifest allocated %d bytes for %d bytes (limit %d)", used, len(man), limit)
		}
		if m == nil || len(m.Files) > 4 {
			return
		}
		sum := sha256.Sum256(st)
		for name := range m.Files {
			m.Files[name] = hex.EncodeToString(sum[:])
			if err := os.WriteFile(filepath.Join(d, name), st, 0o644); err != nil {
				return // a name this file system refuses
			}
			disk += len(st)
		}
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, ManifestFile), Seal(b), 0o644); err != nil {
			t.Fatal(err)
		}
		disk += len(b)
		used = allocbound.Measure(func() {
			c, err := Load(d)
			if err != nil {
				var fe *FormatError
				if !errors.As(err, &fe) || strings.Contains(err.Error(), "\n") {
					t.Errorf("Load: error %q (%T) is not a one-line FormatError", err, err)
				}
				return
			}
			for _, ti := range c.Manifest.Tensors {
				got, shape, err := readAll(c, ti.Name)
				if err != nil {
					t.Errorf("reading %q of a loaded checkpoint: %v", ti.Name, err)
					continue
				}
				if !slices.Equal(shape, ti.Shape) {
					t.Errorf("reading %q: shape %v, manifest %v", ti.Name, shape, ti.Shape)
				}
				if int64(len(got)) != count(shape) {
					t.Errorf("reading %q: %d values for shape %v", ti.Name, len(got), shape)
				}
			}
		})
		if limit := allocbound.Limit(disk); used > limit {
			t.Errorf("Load and reading allocated %d bytes for %d bytes on disk (limit %d)", used, disk, limit)
		}
	})
}
