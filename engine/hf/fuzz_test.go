package hf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
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
