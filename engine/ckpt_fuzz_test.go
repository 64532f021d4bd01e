package engine

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gptui/gptui/badinput"

	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/internal/allocbound"
	"github.com/gptui/gptui/presets"
)

// FuzzLoadModel loads a small checkpoint whose manifest carries an
// arbitrary config, as `gptui generate --ckpt` and `export` do. The
// manifest is not covered by a checksum, so its config is what an edited
// or damaged checkpoint can change freely. Nothing may panic, every error
// must be a one-line user error, and no config may make LoadModel allocate
// more than allocbound.Limit of the checkpoint's size: the shape must be
// found in the data files before it is allocated. The nil backend
// allocates with make, which the measure counts.
func FuzzLoadModel(f *testing.F) {
	cfg, err := presets.Load("tiny", []string{"Model.vocab_size=100", "Model.hidden_size=16", "Model.max_position_embeddings=64"})
	if err != nil {
		f.Fatal(err)
	}
	m, err := NewModel(nil, ShapeOf(cfg), 0.02, 1)
	if err != nil {
		f.Fatal(err)
	}
	src, err := SaveModel(m, cfg, f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	mpath := filepath.Join(src, checkpoint.ManifestFile)
	b, err := os.ReadFile(mpath)
	if err != nil {
		f.Fatal(err)
	}
	var man map[string]json.RawMessage
	if err := json.Unmarshal(b, &man); err != nil {
		f.Fatal(err)
	}
	good := string(cfg.YAML())
	f.Add(good)
	f.Add(strings.Replace(good, "num_layers: 2", "num_layers: 1000000", 1))
	f.Add(strings.Replace(good, "num_layers: 2", "num_layers: 10000", 1)) // 31M parameters, 250 MB, before the fix
	f.Add(strings.Replace(good, "hidden_size: 16", "hidden_size: 262144", 1))
	f.Add(strings.Replace(good, "max_position_embeddings: 64", "max_position_embeddings: 100000000", 1))
	f.Add("Model: [")
	f.Fuzz(func(t *testing.T, conf string) {
		c, err := json.Marshal(conf)
		if err != nil {
			return // not valid UTF-8: no manifest holds it
		}
		man["config"] = c
		b, err := json.Marshal(man)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(mpath, b, 0o644); err != nil {
			t.Fatal(err)
		}
		used := allocbound.Measure(func() { _, _, err = LoadModel(nil, src) })
		// The data file is about 4 bytes per parameter of the small model.
		if limit := allocbound.Limit(len(b) + 4*m.NumParams()); used > limit {
			t.Errorf("LoadModel allocated %d bytes (limit %d); error %v", used, limit, err)
		}
		if err != nil && (!errors.Is(err, badinput.Err) || strings.Contains(err.Error(), "\n")) {
			var pe *presets.Error
			if !errors.As(err, &pe) { // presets' errors may quote a multi-line value
				t.Errorf("error %q (%T) is not a one-line user error", err, err)
			}
		}
	})
}
