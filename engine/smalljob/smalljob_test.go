package smalljob

import (
	"testing"

	"github.com/gptui/gptui/engine/data"
	"github.com/gptui/gptui/presets"
)

// TestWrite: the config loads as tiny with a vocabulary of 256 and the
// corpus's directory, whose shard holds bytes.
func TestWrite(t *testing.T) {
	path, err := Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := presets.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	tiny, _ := presets.Load("tiny", nil)
	if cfg.Model.VocabSize != 256 || cfg.Model.HiddenSize != tiny.Model.HiddenSize || cfg.Model.NumLayers != tiny.Model.NumLayers {
		t.Errorf("model %+v, want tiny's with a vocabulary of 256", cfg.Model)
	}
	toks, err := data.Load(cfg.Data.Train.Dataset.InputDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(toks) < 100000 || cfg.Data.Eval.Dataset.InputDir != cfg.Data.Train.Dataset.InputDir {
		t.Errorf("%d tokens in %s, eval from %s", len(toks), cfg.Data.Train.Dataset.InputDir, cfg.Data.Eval.Dataset.InputDir)
	}
	for _, tk := range toks {
		if tk >= 256 {
			t.Fatalf("token %d is not a byte", tk)
		}
	}
}
