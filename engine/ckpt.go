package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/engine/data"
	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/presets"
)

// Tensor names in a checkpoint: the fp32 (master) weights and both AdamW
// moments of every parameter tensor, under its llm.c name.
const (
	ckptParams = "params/"
	ckptAdamM  = "adam_m/"
	ckptAdamV  = "adam_v/"
)

// trainState is what a checkpoint carries besides tensors and config.
type trainState struct {
	AdamStep int              `json:"adam_step"`
	Loader   data.LoaderState `json:"loader"`
}

// Save writes a checkpoint of the state after step (0-based, completed)
// into Engine.save_load.output_dir and returns its directory. In a parallel
// job every rank calls it (sharded optimizer state is gathered first) and
// rank 0 writes; the others return "".
func (tr *Trainer) Save(ctx context.Context, step int) (string, error) {
	mo, vo, err := tr.fullMoments(ctx)
	if err != nil {
		return "", err
	}
	if tr.topo.Rank != 0 {
		return "", nil
	}
	st, err := json.Marshal(trainState{AdamStep: tr.Opt.Step, Loader: tr.train.State()})
	if err != nil {
		return "", err
	}
	m := checkpoint.Manifest{
		Step:            step + 1,
		ConsumedSamples: int64(step+1) * int64(tr.Cfg.Global.GlobalBatchSize),
		Config:          string(tr.Cfg.YAML()),
		Data:            st,
		RNG:             map[string]uint64{"seed": uint64(tr.Cfg.Global.Seed)},
		LossScale:       1,
	}
	var parts []checkpoint.Part
	for _, t := range tr.Model.Tensors {
		for _, b := range []struct {
			prefix string
			buf    []float32
		}{{ckptParams, tr.Model.Params}, {ckptAdamM, mo}, {ckptAdamV, vo}} {
			parts = append(parts, checkpoint.Part{
				Name: b.prefix + t.Name, GlobalShape: t.Shape, Start: make([]int, len(t.Shape)), Shape: t.Shape,
				Data: b.buf[t.Offset : t.Offset+t.Size],
			})
		}
	}
	sl := tr.Cfg.Engine.SaveLoad
	return checkpoint.Save(sl.OutputDir, m, parts, sl.KeepLast)
}

// openCheckpoint resolves Engine.save_load.ckpt_dir: "" (none), "auto" (the
// newest loadable checkpoint in output_dir, if any), a checkpoint directory,
// or an output directory holding a `latest` file.
func openCheckpoint(cfg *presets.Config) (*checkpoint.Checkpoint, []string, error) {
	sl := cfg.Engine.SaveLoad
	dir := sl.CkptDir
	switch {
	case dir == "":
		return nil, nil, nil
	case dir == "auto":
		c, warn, err := checkpoint.Latest(sl.OutputDir)
		if errors.Is(err, checkpoint.ErrNoCheckpoint) || errors.Is(err, os.ErrNotExist) {
			return nil, append(warn, fmt.Sprintf("no checkpoint in %s: starting from step 0", sl.OutputDir)), nil
		}
		return c, warn, latestError(err, warn)
	}
	if _, err := os.Stat(filepath.Join(dir, checkpoint.ManifestFile)); err != nil {
		if _, lerr := os.Stat(filepath.Join(dir, checkpoint.LatestFile)); lerr == nil {
			c, warn, err := checkpoint.Latest(dir)
			return c, warn, latestError(err, warn)
		}
	}
	c, err := checkpoint.Load(dir)
	return c, nil, err
}

// latestError folds the warnings about skipped checkpoints into the error
// of a directory none of whose checkpoints loads.
func latestError(err error, warn []string) error {
	if err == nil || len(warn) == 0 {
		return err
	}
	return &ConfigError{fmt.Sprintf("%v: %s", err, strings.Join(warn, "; "))}
}

// shapeKeys are the config keys that fix the model's shape.
func shapeKeys(m presets.Model) map[string]int {
	return map[string]int{
		"Model.vocab_size": m.VocabSize, "Model.hidden_size": m.HiddenSize, "Model.num_layers": m.NumLayers,
		"Model.num_attention_heads": m.NumAttentionHeads, "Model.ffn_hidden_size": m.FFNHiddenSize,
		"Model.max_position_embeddings": m.MaxPositionEmbeddings,
	}
}

// checkpointConfig parses the config a checkpoint was written with.
func checkpointConfig(c *checkpoint.Checkpoint) (*presets.Config, error) {
	cfg, err := presets.Parse(filepath.Join(c.Dir, checkpoint.ManifestFile)+" (config)", []byte(c.Manifest.Config))
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", c.Dir, err)
	}
	return cfg, nil
}

// compareShape names every shape key where cfg differs from the checkpoint.
func compareShape(cfg, saved *presets.Config, dir string) error {
	a, b := shapeKeys(cfg.Model), shapeKeys(saved.Model)
	var diff []string
	for k, v := range a {
		if b[k] != v {
			diff = append(diff, fmt.Sprintf("%s=%d (checkpoint %d)", k, v, b[k]))
		}
	}
	if len(diff) == 0 {
		return nil
	}
	sortStrings(diff)
	return &ConfigError{fmt.Sprintf("model shape differs from checkpoint %s: %s; set them to the checkpoint's values or drop Engine.save_load.ckpt_dir", dir, strings.Join(diff, ", "))}
}

// readParams fills buf, laid out by ts, with the tensors prefix+name of c.
func readParams(c *checkpoint.Checkpoint, ts []Tensor, prefix string, buf []float32) error {
	for _, t := range ts {
		if err := c.Read(prefix+t.Name, make([]int, len(t.Shape)), t.Shape, buf[t.Offset:t.Offset+t.Size]); err != nil {
			return fmt.Errorf("checkpoint %s: %w", c.Dir, err)
		}
	}
	return nil
}

// hasTensor reports whether c holds a tensor called name.
func hasTensor(c *checkpoint.Checkpoint, name string) bool {
	_, ok := c.Tensor(name)
	return ok
}

// restore loads weights, optimizer moments, step and data position from c.
// A checkpoint without optimizer state (an imported model) resumes with
// fresh moments at step 0.
func (tr *Trainer) restore(c *checkpoint.Checkpoint) error {
	saved, err := checkpointConfig(c)
	if err != nil {
		return err
	}
	if err := compareShape(tr.Cfg, saved, c.Dir); err != nil {
		return err
	}
	if err := readParams(c, tr.Model.Tensors, ckptParams, tr.Model.Params); err != nil {
		return err
	}
	if !hasTensor(c, ckptAdamM+"wte") {
		return nil
	}
	// The moments are read whole and this rank keeps its shard of them, so
	// a checkpoint resumes under any sharding degree.
	full := make([]float32, tr.Model.NumParams())
	for _, mv := range []struct {
		prefix string
		dst    []float32
	}{{ckptAdamM, tr.Opt.M}, {ckptAdamV, tr.Opt.V}} {
		if err := readParams(c, tr.Model.Tensors, mv.prefix, full); err != nil {
			return err
		}
		copy(mv.dst, full[tr.Opt.Lo:tr.Opt.Hi])
	}
	var st trainState
	if err := json.Unmarshal(c.Manifest.Data, &st); err != nil {
		return &checkpoint.FormatError{File: filepath.Join(c.Dir, checkpoint.ManifestFile), Msg: "data state: " + err.Error()}
	}
	if err := tr.train.Restore(st.Loader); err != nil {
		return &ConfigError{fmt.Sprintf("checkpoint %s: data position does not fit this run's data (%v); resume with the same data and batch sizes", c.Dir, err)}
	}
	tr.Opt.Step = st.AdamStep
	tr.start = c.Manifest.Step
	return nil
}

// LoadModel builds a model from a checkpoint (a step_<N> directory, or an
// output directory whose `latest` names one), with the shape and dropout of
// the config it was saved with, and returns that config too.
func LoadModel(be kernels.Backend, dir string) (*Model, *presets.Config, error) {
	cfg0 := &presets.Config{}
	cfg0.Engine.SaveLoad.CkptDir = dir
	c, _, err := openCheckpoint(cfg0)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := checkpointConfig(c)
	if err != nil {
		return nil, nil, err
	}
	m, err := NewModel(be, shapeOf(cfg), 0, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := readParams(c, m.Tensors, ckptParams, m.Params); err != nil {
		return nil, nil, err
	}
	return m, cfg, nil
}

// shapeOf is the model shape a config asks for.
func shapeOf(cfg *presets.Config) ModelConfig {
	mc := cfg.Model
	return ModelConfig{
		MaxT: mc.MaxPositionEmbeddings, V: mc.VocabSize, Vp: cfg.PaddedVocab(), L: mc.NumLayers,
		NH: mc.NumAttentionHeads, C: mc.HiddenSize, F: mc.FFNHiddenSize,
		HiddenDropout: float32(mc.HiddenDropoutProb), AttnDropout: float32(mc.AttentionProbsDropoutProb),
	}
}

// SaveModel writes a checkpoint holding only m's weights (no optimizer
// state) with cfg as its config: what `gptui import` makes.
func SaveModel(m *Model, cfg *presets.Config, outputDir string) (string, error) {
	var parts []checkpoint.Part
	for _, t := range m.Tensors {
		parts = append(parts, checkpoint.Part{Name: ckptParams + t.Name, GlobalShape: t.Shape, Start: make([]int, len(t.Shape)), Shape: t.Shape, Data: m.Params[t.Offset : t.Offset+t.Size]})
	}
	return checkpoint.Save(outputDir, checkpoint.Manifest{Config: string(cfg.YAML()), LossScale: 1}, parts, 0)
}
