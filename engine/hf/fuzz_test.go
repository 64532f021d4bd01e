package hf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/internal/allocbound"
)

// FuzzImport feeds arbitrary config.json and model.safetensors files to
// Import. It must not panic, every error must be an *engine.FormatError
// naming one of the files, and reading must never allocate more than
// allocbound.Limit of the files' size: no size a header declares is
// allocated before the file is seen to hold it.
func FuzzImport(f *testing.F) {
	src := f.TempDir()
	_, n := engine.Tensors(testCfg)
	if err := Export(src, testCfg, make([]float32, n)); err != nil {
		f.Fatal(err)
	}
	conf, err := os.ReadFile(filepath.Join(src, ConfigFile))
	if err != nil {
		f.Fatal(err)
	}
	model, err := os.ReadFile(filepath.Join(src, ModelFile))
	if err != nil {
		f.Fatal(err)
	}
	set := func(key, v string) []byte {
		// Replace the value of "key" in the exported config.json.
		lines := strings.Split(string(conf), "\n")
		for i, l := range lines {
			if strings.Contains(l, `"`+key+`":`) {
				lines[i] = `  "` + key + `": ` + v + `,`
			}
		}
		return []byte(strings.Join(lines, "\n"))
	}
	f.Add(conf, model)
	f.Add(set("n_layer", "1000000000"), model)
	f.Add(set("n_layer", "200000"), model) // mappings for 200000 layers: 400 MB before the fix
	f.Add(set("n_embd", "262144"), model)
	f.Add(set("n_positions", "1000000000"), model)
	f.Add(set("n_inner", "4611686018427387904"), model)
	f.Add(set("vocab_size", "-1"), model)
	huge := []byte(`{"transformer.wte.weight":{"dtype":"F32","shape":[1073741824,1073741824],"data_offsets":[0,4]}}`)
	f.Add(conf, append(binary.LittleEndian.AppendUint64(nil, uint64(len(huge))), huge...))
	f.Add(conf, binary.LittleEndian.AppendUint64(nil, 1<<62))
	f.Add([]byte("{"), []byte{})

	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, conf, model []byte) {
		if err := os.WriteFile(filepath.Join(dir, ConfigFile), conf, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ModelFile), model, 0o644); err != nil {
			t.Fatal(err)
		}
		var err error
		used := allocbound.Measure(func() { _, _, err = Import(dir) })
		if limit := allocbound.Limit(len(conf) + len(model)); used > limit {
			t.Errorf("Import allocated %d bytes for %d bytes of input (limit %d); error %v", used, len(conf)+len(model), limit, err)
		}
		if err == nil {
			return
		}
		var fe *engine.FormatError
		if !errors.As(err, &fe) || (!strings.HasSuffix(fe.File, ConfigFile) && !strings.HasSuffix(fe.File, ModelFile)) {
			t.Errorf("error %q (%T) is not a FormatError naming %s or %s", err, err, ConfigFile, ModelFile)
		}
		if bytes.ContainsRune([]byte(err.Error()), '\n') {
			t.Errorf("error %q spans lines", err)
		}
	})
}

// FuzzImportSharded feeds arbitrary config.json, model.safetensors.index.json
// and two shards to Import (a Llama's seeds, and a GPT-2's config). It must
// not panic, every error must be an *engine.FormatError naming one of the
// files in one line, and reading must never allocate more than
// allocbound.Limit of the files' size.
func FuzzImportSharded(f *testing.F) {
	const s1, s2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
	src := f.TempDir()
	_, n := engine.Tensors(llamaTied)
	for ms := int64(1 << 10); ; ms *= 2 {
		if err := ExportShards(src, llamaTied, make([]float32, n), ms); err != nil {
			f.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(src, s1)); err == nil {
			break
		}
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	conf, index, a, b := read(ConfigFile), read(IndexFile), read(s1), read(s2)
	f.Add(conf, index, a, b)
	f.Add(conf, []byte(`{"weight_map":{"model.norm.weight":"../`+s1+`"}}`), a, b)
	f.Add(conf, []byte(`{"weight_map":{"model.norm.weight":"/etc/passwd"}}`), a, b)
	f.Add(conf, []byte(`{"weight_map":{"a":"`+s1+`","b":"`+s2+`"}}`), a, b)
	f.Add(bytes.Replace(conf, []byte(`"num_hidden_layers": 2`), []byte(`"num_hidden_layers": 100000000`), 1), index, a, b)
	f.Add(bytes.Replace(conf, []byte(`"max_position_embeddings": 32`), []byte(`"max_position_embeddings": 4611686018427387904`), 1), index, a, b)
	f.Add(bytes.Replace(conf, []byte(`"intermediate_size": 24`), []byte(`"intermediate_size": 4611686018427387904`), 1), index, a, b)
	f.Add(bytes.Replace(conf, []byte(`"vocab_size": 37`), []byte(`"vocab_size": 1073741824`), 1), index, a, b)
	f.Add(bytes.Replace(conf, []byte(`"llama"`), []byte(`"gpt2"`), 1), index, a, b)
	f.Add(conf, []byte("{"), a, b)

	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, conf, index, a, b []byte) {
		for name, data := range map[string][]byte{ConfigFile: conf, IndexFile: index, s1: a, s2: b} {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		var err error
		used := allocbound.Measure(func() { _, _, err = Import(dir) })
		size := len(conf) + len(index) + len(a) + len(b)
		if limit := allocbound.Limit(size); used > limit {
			t.Errorf("Import allocated %d bytes for %d bytes of input (limit %d); error %v", used, size, limit, err)
		}
		if err == nil {
			return
		}
		var fe *engine.FormatError
		if !errors.As(err, &fe) || !slices.ContainsFunc([]string{ConfigFile, IndexFile, s1, s2}, func(s string) bool { return strings.HasSuffix(fe.File, s) }) {
			t.Errorf("error %q (%T) is not a FormatError naming one of the files", err, err)
		}
		if bytes.ContainsRune([]byte(err.Error()), '\n') {
			t.Errorf("error %q spans lines", err)
		}
	})
}
