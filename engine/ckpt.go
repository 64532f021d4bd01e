package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gptui/gptui/comm"
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
	// Schedule is the lr schedule the run was trained with; nil in
	// checkpoints written before gptui kept it.
	Schedule *Schedule `json:"schedule,omitempty"`
}

// Save writes a checkpoint of the state after step (0-based, completed)
// into Engine.save_load.output_dir and returns its directory. In a
// parallel job every rank calls it, each writes what it holds, all at
// once, and rank 0 publishes the checkpoint; where the ranks are on
// several machines, each machine keeps its ranks' files as its part of it
// (ckptwrite.go). The others return "".
func (tr *Trainer) Save(ctx context.Context, step int) (string, error) {
	return tr.saveParallel(ctx, step)
}

// manifest is the manifest of the checkpoint of the state after step-1
// (0-based), as its directory is named: everything but the tensors.
func (tr *Trainer) manifest(step int) checkpoint.Manifest {
	st, err := json.Marshal(trainState{AdamStep: tr.Opt.Step, Loader: tr.train.State(), Schedule: &tr.Sched})
	if err != nil {
		panic(err) // plain numbers and strings
	}
	return checkpoint.Manifest{
		Step:            step,
		Run:             tr.run,
		ConsumedSamples: int64(step) * int64(tr.Cfg.Global.GlobalBatchSize),
		Config:          string(tr.Cfg.Settled().YAML()),
		Data:            st,
		RNG:             map[string]uint64{"seed": uint64(tr.Cfg.Global.Seed)},
		LossScale:       1,
		Extra:           tr.tokenIDs.extra(),
	}
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
		c, warn, err := checkpoint.LatestOf(sl.OutputDir, sl.Run)
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

// checkFreshOutput refuses a run that starts from step 0 and saves into
// an output directory holding checkpoints, which are another run's: its
// saves would replace theirs step for step, and a resume would mix the
// two. Engine.save_load.force lets it.
func (tr *Trainer) checkFreshOutput() error {
	sl := tr.Cfg.Engine.SaveLoad
	if sl.SaveSteps <= 0 || sl.Force {
		return nil
	}
	h := checkpoint.History(sl.OutputDir)
	if len(h) == 0 {
		return nil
	}
	newest := -1
	for step := range h {
		newest = max(newest, step)
	}
	run := "of an unknown run"
	if r := h[newest].Run; r != "" {
		run = "of run " + r[:min(12, len(r))]
	}
	return &ConfigError{Msg: fmt.Sprintf("Engine.save_load.output_dir: %s holds another run's checkpoints (newest: %s, %s); a run from step 0 would replace them: resume that run (--resume), write elsewhere (-o Engine.save_load.output_dir=DIR), or train beside them with --force",
		sl.OutputDir, checkpoint.DirName(newest), run)}
}

// latestError folds the warnings about skipped checkpoints into the error
// of a directory none of whose checkpoints loads.
func latestError(err error, warn []string) error {
	if err == nil || len(warn) == 0 {
		return err
	}
	return &ConfigError{Msg: fmt.Sprintf("%v: %s", err, strings.Join(warn, "; ")), Err: err}
}

// shapeKeys are the config keys that fix the model's shape, and their
// values.
func shapeKeys(m presets.Model) map[string]string {
	return map[string]string{
		"Model.vocab_size": strconv.Itoa(m.VocabSize), "Model.hidden_size": strconv.Itoa(m.HiddenSize), "Model.num_layers": strconv.Itoa(m.NumLayers),
		"Model.num_attention_heads": strconv.Itoa(m.NumAttentionHeads), "Model.ffn_hidden_size": strconv.Itoa(m.FFNHiddenSize),
		"Model.max_position_embeddings": strconv.Itoa(m.MaxPositionEmbeddings), "Model.family": m.Family,
		"Model.num_key_value_heads": strconv.Itoa(m.NumKeyValueHeads), "Model.tie_word_embeddings": strconv.FormatBool(m.TieWordEmbeddings),
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

// compareShape names every shape key where cfg differs from the
// checkpoint in dir, which the config's key (Model.init_from,
// Engine.save_load.ckpt_dir) loads.
func compareShape(cfg, saved *presets.Config, dir, key string) error {
	a, b := shapeKeys(cfg.Model), shapeKeys(saved.Model)
	var diff []string
	for k, v := range a {
		if b[k] != v {
			diff = append(diff, fmt.Sprintf("%s=%s (checkpoint %s)", k, v, b[k]))
		}
	}
	if len(diff) == 0 {
		return nil
	}
	sortStrings(diff)
	return &ConfigError{Msg: fmt.Sprintf("model shape differs from checkpoint %s: %s; set them to the checkpoint's values or drop %s", dir, strings.Join(diff, ", "), key)}
}

// A start is what a run's model comes from, opened before the model is
// built, since it settles what the model computes: the checkpoint the run
// resumes from (Engine.save_load.ckpt_dir), which every rank has agreed
// on, and the gptui checkpoint Model.init_from names.
type start struct {
	resume   *checkpoint.Checkpoint // nil: none
	init     *checkpoint.Checkpoint // nil: no init_from, or an llm.c model file
	hosts    []string               // every rank's node name (agreeResume)
	warnings []string               // checkpoints passed over
}

// openStart opens the checkpoints cfg's run starts from (see start); w
// connects the ranks, nil for one process.
func openStart(cfg *presets.Config, w *comm.World) (*start, error) {
	ck, warn, err := openCheckpoint(cfg)
	if err != nil {
		return nil, err
	}
	st := &start{resume: ck, warnings: warn}
	if st.hosts, err = agreeResume(context.Background(), w, ck); err != nil {
		return nil, err
	}
	f := cfg.Model.InitFrom
	if f == "" {
		return st, nil
	}
	fi, err := os.Stat(f)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, &ConfigError{Err: err, Msg: fmt.Sprintf("Model.init_from %s: no such file or directory: name a gptui checkpoint directory (or, for a GPT-2, an llm.c model file)", f)}
	case err != nil:
		return nil, &ConfigError{Err: err, Msg: fmt.Sprintf("Model.init_from: %v", err)}
	case fi.IsDir():
		if st.init, _, _, err = openModelCheckpoint(f, nil); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// settle returns the config the run computes with: cfg, with the keys a
// checkpoint settles (presets.Config.Adopt: a Llama's rms_norm_eps,
// rope_theta and rope_scaling) that it leaves unset taken from the
// checkpoint the run loads — the one it resumes from, else init_from's —
// each said in a warning. A value cfg sets otherwise is refused, naming
// both, and so is a shape that differs from either checkpoint's. It also
// returns the special token ids the checkpoint carries.
func (st *start) settle(cfg *presets.Config) (*presets.Config, TokenIDs, []string, error) {
	c := *cfg
	var src *checkpoint.Checkpoint
	var srcKey string
	for _, s := range []struct {
		ck  *checkpoint.Checkpoint
		key string
	}{{st.init, "Model.init_from"}, {st.resume, "Engine.save_load.ckpt_dir"}} {
		if s.ck == nil {
			continue
		}
		saved, err := checkpointConfig(s.ck)
		if err != nil {
			return nil, TokenIDs{}, nil, err
		}
		if err := compareShape(&c, saved, s.ck.Dir, s.key); err != nil {
			return nil, TokenIDs{}, nil, err
		}
		src, srcKey = s.ck, s.key // the resume's, when there is one
	}
	if src == nil {
		return &c, TokenIDs{}, nil, nil
	}
	saved, err := checkpointConfig(src)
	if err != nil {
		return nil, TokenIDs{}, nil, err
	}
	ids, err := readTokenIDs(src)
	if err != nil {
		return nil, TokenIDs{}, nil, err
	}
	adopted, conflicts := c.Adopt(saved)
	if len(conflicts) > 0 {
		var what, unset, set []string
		for _, d := range conflicts {
			what = append(what, fmt.Sprintf("%s: the config sets %s, checkpoint %s (%s) computes with %s", d.Key, d.Config, src.Dir, srcKey, d.Checkpoint))
			unset = append(unset, fmt.Sprintf("-o %s=", d.Key))
			set = append(set, fmt.Sprintf("-o %s=%s", d.Key, d.Checkpoint))
		}
		them := "it"
		if len(conflicts) > 1 {
			them = "them"
		}
		return nil, TokenIDs{}, nil, &ConfigError{Msg: fmt.Sprintf("%s; the model would compute another function than the one its weights were trained with: leave %s unset (%s) to take the checkpoint's, or set %s",
			strings.Join(what, "; "), them, strings.Join(unset, " "), strings.Join(set, " "))}
	}
	var warn []string
	for _, d := range adopted {
		warn = append(warn, fmt.Sprintf("%s %s (the config leaves it unset, at %s)", d.Key, d.Checkpoint, d.Config))
	}
	if len(warn) > 0 {
		warn = []string{fmt.Sprintf("the model computes with checkpoint %s's %s", src.Dir, strings.Join(warn, ", "))}
	}
	return &c, ids, warn, nil
}

// readParams fills dst, a buffer of be laid out by spans (a rank's part,
// {0, 0, NumParams}, or its shard of it), with the tensors prefix+name of
// c: each element read from its place in the global tensor, so a
// checkpoint loads into any part, or shard of a part, under any parallel
// layout, reading only what the rank holds (fillSpans).
func readParams(be kernels.Backend, c *checkpoint.Checkpoint, ts []Tensor, prefix string, spans []Span, dst []float32) error {
	for _, t := range ts {
		// A tensor missing or of another shape than the config's model is
		// a checkpoint whose tensors do not match its config.
		if msg := tensorMismatch(c, prefix+t.Name, t.Global); msg != "" {
			return &checkpoint.FormatError{File: filepath.Join(c.Dir, checkpoint.ManifestFile), Msg: msg}
		}
	}
	return fillSpans(be, ts, spans, dst, ckptSource(c, prefix))
}

// ckptSource reads blocks of c's tensors prefix+name.
func ckptSource(c *checkpoint.Checkpoint, prefix string) blockSource {
	return func(t Tensor, start, shape []int, dst []float32, dstShape, dstAt []int) error {
		if err := c.ReadInto(prefix+t.Name, start, shape, dst, dstShape, dstAt); err != nil {
			return fmt.Errorf("checkpoint %s: %w", c.Dir, err)
		}
		return nil
	}
}

// holds checks, before a model of shape is allocated, that c holds each of
// its tensors, prefix+name, with its global shape: the files' sizes, which
// Load has checked against their headers, then bound what is allocated.
// shape must be valid.
func holds(c *checkpoint.Checkpoint, shape ModelConfig, prefix string) error {
	ts, _ := Tensors(shape)
	for _, t := range ts {
		if msg := tensorMismatch(c, prefix+t.Name, t.Global); msg != "" {
			return &checkpoint.FormatError{File: filepath.Join(c.Dir, checkpoint.ManifestFile), Msg: fmt.Sprintf(
				"its config's Model.* (num_layers %d, hidden_size %d, ffn_hidden_size %d, vocab_size %d, max_position_embeddings %d): %s",
				shape.L, shape.C, shape.F, shape.V, shape.MaxT, msg)}
		}
	}
	return nil
}

// tensorMismatch says how c's tensor name differs from the global shape
// the model of its config needs, or returns "" when it has that shape.
func tensorMismatch(c *checkpoint.Checkpoint, name string, global []int) string {
	ct, ok := c.Tensor(name)
	if !ok {
		return fmt.Sprintf("no tensor %q, which the model of its config needs; the checkpoint is incomplete: use another one", name)
	}
	if !slices.Equal(ct.Shape, global) {
		return fmt.Sprintf("tensor %q has shape %v, where the model of its config needs %v; its config and tensors do not match: use another checkpoint", name, ct.Shape, global)
	}
	return ""
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
	// The config's shape is the checkpoint's, and so are the keys it
	// settles (start.settle). Each rank reads what it holds and no more:
	// its part, under stage 3 its shard, and the moments of its shard, so
	// a checkpoint resumes under any layout, sharding degree and stage.
	params, spans := tr.heldParams()
	if err := readParams(tr.be, c, tr.Model.Tensors, ckptParams, spans, params); err != nil {
		return err
	}
	if !hasTensor(c, ckptAdamM+"wte") {
		return nil
	}
	for _, mv := range []struct {
		prefix string
		dst    []float32
	}{{ckptAdamM, tr.Opt.M}, {ckptAdamV, tr.Opt.V}} {
		if err := readParams(tr.be, c, tr.Model.Tensors, mv.prefix, tr.Opt.Spans, mv.dst); err != nil {
			return err
		}
	}
	var st trainState
	if err := json.Unmarshal(c.Manifest.Data, &st); err != nil {
		return &checkpoint.FormatError{File: filepath.Join(c.Dir, checkpoint.ManifestFile), Msg: "data state: " + err.Error()}
	}
	if err := tr.train.Restore(st.Loader); err != nil {
		return &ConfigError{Err: err, Msg: fmt.Sprintf("checkpoint %s: data position does not fit this run's data (%v); resume with the same data and batch sizes", c.Dir, err)}
	}
	if err := tr.restoreSchedule(st.Schedule, c.Dir); err != nil {
		return err
	}
	tr.Opt.Step = st.AdamStep
	tr.start = c.Manifest.Step
	return nil
}

// restoreSchedule checks the lr schedule a checkpoint in dir was trained
// with (saved; nil in one written before gptui kept it, whose run goes on
// with the schedule this config derives, as before) against this run's,
// tr.Sched. A value whose key was set explicitly may differ: the run takes
// it, and says so. A key left unset is derived from another (decay_steps
// from Engine.max_steps, min_lr from max_lr), and a resume that changed
// that other key (a larger max_steps, to train further) would change the
// schedule in mid-run without a word: that is refused, naming the key and
// the two values to choose from.
func (tr *Trainer) restoreSchedule(saved *Schedule, dir string) error {
	if saved == nil {
		tr.warnings = append(tr.warnings, fmt.Sprintf("%s records no lr schedule (it was written before gptui kept one): the schedule is derived from this run's config, as before", dir))
		return nil
	}
	now := tr.Sched
	var changes []string
	change := func(key, was, is string) error {
		if from, ok := tr.Cfg.DerivedFrom(key); ok {
			return &ConfigError{Msg: fmt.Sprintf("%s: checkpoint %s was trained with %s; left unset, it is now derived from %s as %s, which would change the lr schedule in mid-run: set -o %s=%s to keep the schedule, or -o %s=%s to change it",
				key, dir, was, from, is, key, was, key, is)}
		}
		changes = append(changes, fmt.Sprintf("%s %s → %s", key, was, is))
		return nil
	}
	g := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	if saved.DecaySteps != now.DecaySteps {
		if err := change("Optimizer.lr.decay_steps", strconv.Itoa(saved.DecaySteps), strconv.Itoa(now.DecaySteps)); err != nil {
			return err
		}
	}
	if saved.MinLR != now.MinLR {
		if err := change("Optimizer.lr.min_lr", g(saved.MinLR), g(now.MinLR)); err != nil {
			return err
		}
	}
	if saved.MaxLR != now.MaxLR {
		changes = append(changes, fmt.Sprintf("Optimizer.lr.max_lr %s → %s", g(saved.MaxLR), g(now.MaxLR)))
	}
	if saved.Warmup != now.Warmup {
		changes = append(changes, fmt.Sprintf("warmup %d → %d steps (warmup_rate × decay_steps)", saved.Warmup, now.Warmup))
	}
	if len(changes) > 0 {
		tr.warnings = append(tr.warnings, fmt.Sprintf("the lr schedule changes from %s's, as the config sets it: %s", dir, strings.Join(changes, ", ")))
	}
	return nil
}

// LoadModel builds a model from a checkpoint (a step_<N> directory, or an
// output directory whose `latest` names one), with the shape and dropout of
// the config it was saved with, and returns that config too.
func LoadModel(be kernels.Backend, dir string) (*Model, *presets.Config, error) {
	return LoadModelChecked(be, dir, nil)
}

// LoadModelChecked is [LoadModel] calling check, if not nil, with the
// checkpoint's config before the model is allocated; an error from check
// is returned as it is.
func LoadModelChecked(be kernels.Backend, dir string, check func(*presets.Config) error) (*Model, *presets.Config, error) {
	c, cfg, shape, err := openModelCheckpoint(dir, check)
	if err != nil {
		return nil, nil, err
	}
	m, err := newModel(be, shape, WholePart(shape))
	if err != nil {
		return nil, nil, err
	}
	if err := readParams(be, c, m.Tensors, ckptParams, m.whole(), m.Params); err != nil {
		return nil, nil, err
	}
	return m, cfg, nil
}

// A ModelSource reads a checkpoint's model weights range by range,
// without loading the model: what an export streams from.
type ModelSource struct {
	Config *presets.Config // the checkpoint's
	Shape  ModelConfig
	c      *checkpoint.Checkpoint
	ts     []Tensor
	buf    []float32
}

// OpenModelSource opens the checkpoint dir names, as [LoadModelChecked]
// does (check, if not nil, is called with its config), for reading its
// weights with [ModelSource.Read].
func OpenModelSource(dir string, check func(*presets.Config) error) (*ModelSource, error) {
	c, cfg, shape, err := openModelCheckpoint(dir, check)
	if err != nil {
		return nil, err
	}
	ts, _ := Tensors(shape)
	return &ModelSource{Config: cfg, Shape: shape, c: c, ts: ts}, nil
}

// Read returns the elements [off, off+n) of the model's weights, laid out
// by [Tensors] of its shape, read from the checkpoint's slices that hold
// them: a buffer valid until the next Read, which reuses it.
func (s *ModelSource) Read(off, n int) ([]float32, error) {
	s.buf = slices.Grow(s.buf[:0], n)[:n]
	clear(s.buf)
	return s.buf, fillRange(s.ts, off, off+n, s.buf, ckptSource(s.c, ckptParams))
}

// openModelCheckpoint opens the checkpoint dir names (as [LoadModel]
// does) and returns it with its config and model shape (with the special
// token ids it keeps), once it has checked that it holds the weights of
// that shape and check, if not nil, has accepted the config.
func openModelCheckpoint(dir string, check func(*presets.Config) error) (*checkpoint.Checkpoint, *presets.Config, ModelConfig, error) {
	cfg0 := &presets.Config{}
	cfg0.Engine.SaveLoad.CkptDir = dir
	c, _, err := openCheckpoint(cfg0)
	if err != nil {
		return nil, nil, ModelConfig{}, err
	}
	cfg, err := checkpointConfig(c)
	if err != nil {
		return nil, nil, ModelConfig{}, err
	}
	shape := ShapeOf(cfg)
	if err := shape.Validate(); err != nil {
		return nil, nil, ModelConfig{}, &checkpoint.FormatError{File: filepath.Join(c.Dir, checkpoint.ManifestFile), Msg: "config: " + err.Error()}
	}
	if err := holds(c, shape, ckptParams); err != nil {
		return nil, nil, ModelConfig{}, err
	}
	if shape.TokenIDs, err = readTokenIDs(c); err != nil {
		return nil, nil, ModelConfig{}, err
	}
	if check != nil {
		if err := check(cfg); err != nil {
			return nil, nil, ModelConfig{}, err
		}
	}
	return c, cfg, shape, nil
}

// SaveModel writes a checkpoint holding only m's weights (no optimizer
// state) with cfg as its config, and the special token ids of m's
// config: what `gptui import` makes.
func SaveModel(m *Model, cfg *presets.Config, outputDir string) (string, error) {
	var buf []float32
	params, err := hostFloats(m.be, m.Params, &buf)
	if err != nil {
		return "", err
	}
	var parts []checkpoint.Part
	for _, t := range m.Tensors {
		parts = append(parts, checkpoint.Part{Name: ckptParams + t.Name, GlobalShape: t.Global, Start: make([]int, len(t.Global)), Shape: t.Shape, Data: params[t.Offset : t.Offset+t.Size]})
	}
	man := checkpoint.Manifest{Config: string(cfg.Settled().YAML()), LossScale: 1, Extra: m.Cfg.TokenIDs.extra()}
	return checkpoint.Save(outputDir, man, parts, 0)
}
