package presets

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// asError returns err as an *Error, failing the test if it is not one.
func asError(t *testing.T, err error) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not an *Error", err, err)
	}
	return e
}

// writeFiles writes name → content into a fresh directory and returns it.
func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestPresets(t *testing.T) {
	tests := []struct {
		name                          string
		hidden, layers, heads, seqLen int
		device, dtype                 string
		global, local, micro          int
		dp, mp, pp, shard, stage      int
		recompute                     bool
	}{
		{"tiny", 64, 2, 4, 64, "cpu", "fp32", 8, 8, 8, 1, 1, 1, 1, 1, false},
		{"llama-tiny", 64, 2, 4, 64, "cpu", "fp32", 8, 8, 8, 1, 1, 1, 1, 1, false},
		{"gpt2-124m", 768, 12, 12, 1024, "cpu", "fp32", 8, 8, 4, 1, 1, 1, 1, 1, false},
		{"345m-1card", 1024, 24, 16, 1024, "gpu", "fp16", 8, 8, 8, 1, 1, 1, 1, 1, false},
		{"llama-1b", 2048, 16, 32, 8192, "gpu", "bf16", 64, 8, 1, 8, 1, 1, 1, 1, true},
		{"1.3b-dp8", 2048, 24, 16, 1024, "gpu", "fp16", 64, 8, 8, 8, 1, 1, 1, 1, true},
		{"6.7b-sharding16", 4096, 32, 32, 1024, "gpu", "fp16", 128, 8, 8, 1, 1, 1, 16, 2, true},
		{"llama-8b-4node", 4096, 32, 32, 8192, "gpu", "bf16", 128, 32, 1, 4, 4, 2, 1, 1, true},
		{"13b-4node", 5120, 40, 40, 2048, "gpu", "fp16", 96, 24, 1, 4, 2, 4, 1, 1, true},
	}
	var names []string
	for _, tt := range tests {
		names = append(names, tt.name)
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(tt.name, nil)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if err := c.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if Describe(tt.name) == "" {
				t.Error("Describe is empty")
			}
			m, g, d := c.Model, c.Global, c.Distributed
			got := []any{m.HiddenSize, m.NumLayers, m.NumAttentionHeads, c.Data.Train.Dataset.MaxSeqLen,
				g.Device, c.Engine.MixPrecision.Dtype, g.GlobalBatchSize, g.LocalBatchSize, g.MicroBatchSize,
				d.DPDegree, d.MPDegree, d.PPDegree, d.Sharding.ShardingDegree, d.Sharding.ShardingStage, c.Engine.UseRecompute}
			want := []any{tt.hidden, tt.layers, tt.heads, tt.seqLen, tt.device, tt.dtype, tt.global, tt.local, tt.micro,
				tt.dp, tt.mp, tt.pp, tt.shard, tt.stage, tt.recompute}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %v\nwant %v", got, want)
			}
			// GPT-2's tokenizer, but for the Llama 3 presets' own.
			v, vp := 50257, 50304
			if c.Data.Tokenizer != "" {
				v, vp = 128256, 128256
			}
			if m.VocabSize != v || c.PaddedVocab() != vp {
				t.Errorf("vocab %d padded %d, want %d and %d", m.VocabSize, c.PaddedVocab(), v, vp)
			}
			if !m.Llama() && m.FFNHiddenSize != 4*m.HiddenSize {
				t.Errorf("ffn_hidden_size %d, want %d", m.FFNHiddenSize, 4*m.HiddenSize)
			}
			if c.Data.Eval.Dataset != c.Data.Train.Dataset {
				t.Errorf("Eval dataset %+v differs from Train %+v", c.Data.Eval.Dataset, c.Data.Train.Dataset)
			}
			if lr := c.Optimizer.LR; lr.MinLR > lr.MaxLR {
				t.Errorf("min_lr %v > max_lr %v", lr.MinLR, lr.MaxLR)
			}
		})
	}
	if !slices.Equal(Names(), names) {
		t.Errorf("Names() = %v, want %v", Names(), names)
	}
}

func TestPresetDetails(t *testing.T) {
	tiny, err := Load("tiny", nil)
	if err != nil {
		t.Fatal(err)
	}
	e, o := tiny.Engine, tiny.Optimizer
	if e.MaxSteps != 200 || e.EvalFreq != 50 || e.EvalIters != 5 || e.LoggingFreq != 10 ||
		o.LR.WarmupRate != 0.05 || o.LR.MaxLR != 1e-3 || o.LR.MinLR != 1e-4 || o.LR.DecaySteps != 200 ||
		tiny.Model.HiddenDropoutProb != 0 || tiny.Model.AttentionProbsDropoutProb != 0 ||
		tiny.Data.Train.Dataset.InputDir != "" {
		t.Errorf("tiny differs from its specification:\n%s", tiny.YAML())
	}
	m345, err := Load("345m-1card", nil)
	if err != nil {
		t.Fatal(err)
	}
	mp, lr := m345.Engine.MixPrecision, m345.Optimizer.LR
	if !mp.UsePureFP16 || mp.ScaleLoss != 32768 || lr.DecaySteps != 360000 || lr.MaxLR != 5e-5 || lr.MinLR != 1e-5 || lr.WarmupRate != 0.01 {
		t.Errorf("345m-1card differs from the seed: %+v %+v", mp, lr)
	}
	if got := (&Config{}).AccumulateSteps(); got != 0 {
		t.Errorf("AccumulateSteps of a zero Config = %d, want 0", got)
	}
}

func TestEmbeddedFilesMatchNames(t *testing.T) {
	entries, err := fs.ReadDir(configFS, "configs")
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), ".yaml")
		if Describe(name) == "" {
			t.Errorf("%s has no description comment on its first line", e.Name())
		}
		if !strings.HasPrefix(name, "_") {
			listed = append(listed, name)
		}
	}
	slices.Sort(listed)
	names := slices.Sorted(slices.Values(Names()))
	if !slices.Equal(listed, names) {
		t.Errorf("embedded presets %v, Names() %v", listed, names)
	}
	if Describe("no-such-preset") != "" {
		t.Error("Describe of an unknown name is not empty")
	}
}

func TestOverrides(t *testing.T) {
	tests := []struct {
		override string
		check    func(c *Config) bool
	}{
		{"Model.hidden_size=128", func(c *Config) bool { return c.Model.HiddenSize == 128 && c.Model.FFNHiddenSize == 512 }},
		{"Optimizer.lr.max_lr=3e-4", func(c *Config) bool { return c.Optimizer.LR.MaxLR == 3e-4 }},
		{"Data.Train.dataset.split=[1,0,0]", func(c *Config) bool {
			return c.Data.Train.Dataset.Split == [3]float64{1, 0, 0} && c.Data.Eval.Dataset.Split == [3]float64{1, 0, 0}
		}},
		{"Data.Train.dataset.split='98,1,1'", func(c *Config) bool { return c.Data.Train.Dataset.Split == [3]float64{98, 1, 1} }},
		{"Data.Eval.dataset.max_seq_len=32", func(c *Config) bool {
			return c.Data.Eval.Dataset.MaxSeqLen == 32 && c.Data.Train.Dataset.MaxSeqLen == 64
		}},
		{"Engine.max_steps=50", func(c *Config) bool { return c.Engine.MaxSteps == 50 && c.Optimizer.LR.DecaySteps == 50 }},
		{"Optimizer.adam_beta2=0.95", func(c *Config) bool { return c.Optimizer.Beta2 == 0.95 }},
		{"Optimizer.grad_clip=0.5", func(c *Config) bool { return c.Optimizer.GradClip.ClipNorm == 0.5 }},
		{"Optimizer.grad_clip.clip_norm=0", func(c *Config) bool { return c.Optimizer.GradClip.ClipNorm == 0 }},
		{"Optimizer.lr={max_lr: 2e-3, min_lr: 0}", func(c *Config) bool {
			lr := c.Optimizer.LR
			return lr.MaxLR == 2e-3 && lr.MinLR == 0 && lr.WarmupRate == 0.05
		}},
		{"Engine.mix_precision.dtype=float16", func(c *Config) bool {
			mp := c.Engine.MixPrecision
			return mp.Dtype == "fp16" && mp.UsePureFP16 && mp.ScaleLoss == 32768
		}},
		{"Engine.mix_precision.dtype=bf16", func(c *Config) bool {
			mp := c.Engine.MixPrecision
			return mp.Dtype == "bf16" && mp.ReduceDtype == "fp32"
		}},
		{"Engine.mix_precision={dtype: bf16, reduce_dtype: bfloat16}", func(c *Config) bool { return c.Engine.MixPrecision.ReduceDtype == "bf16" }},
		{"Global.micro_batch_size=2", func(c *Config) bool { return c.AccumulateSteps() == 4 }},
		{"Global.seed=-7", func(c *Config) bool { return c.Global.Seed == -7 }},
		{"Engine.max_steps=1e3", func(c *Config) bool { return c.Engine.MaxSteps == 1000 }},
		{"Model.hidden_dropout_prob=", func(c *Config) bool { return c.Model.HiddenDropoutProb == 0.1 }}, // unset: default
		{"Model.type_vocab_size=16", func(c *Config) bool { return c.Model.HiddenSize == 64 }},           // ignored
		{"Model.init_from=ckpt/model.bin", func(c *Config) bool { return c.Model.InitFrom == "ckpt/model.bin" }},
		{" Engine.use_recompute =true", func(c *Config) bool { return c.Engine.UseRecompute }},
	}
	for _, tt := range tests {
		t.Run(tt.override, func(t *testing.T) {
			c, err := Load("tiny", []string{tt.override})
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if !tt.check(c) {
				t.Errorf("override not applied:\n%s", c.YAML())
			}
		})
	}
}

func TestOverridesApplyInOrder(t *testing.T) {
	c, err := Load("tiny", []string{"Model.hidden_size=128", "Model.hidden_size=32"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Model.HiddenSize != 32 {
		t.Errorf("hidden_size %d, want the last override, 32", c.Model.HiddenSize)
	}
}

func TestOverrideErrors(t *testing.T) {
	tests := []struct {
		override string
		key      string
		msg      string
	}{
		{"Model.hidden_size", "", "want Section.key=value"},
		{"=3", "", "want Section.key=value"},
		{"Model.hiden_size=128", "Model.hiden_size", "did you mean Model.hidden_size?"},
		{"model.hidden_size=128", "model.hidden_size", "did you mean Model.hidden_size?"},
		{"Optimizer.lr.maxlr=1", "Optimizer.lr.maxlr", "did you mean Optimizer.lr.max_lr?"},
		{"Model.max_seq_len=128", "Model.max_seq_len", "did you mean Data.Train.dataset.max_seq_len?"},
		{"_base_=tiny", "_base_", "unknown key"},
		{"Model.hidden_size=abc", "Model.hidden_size", "want an integer"},
		{"Model.hidden_size=1.5", "Model.hidden_size", "want an integer"},
		{"Model.hidden_size=[1", "Model.hidden_size", "invalid YAML"},
		{"Model.hidden_size=66", "Model.hidden_size", "not a multiple of num_attention_heads"},
		{"Engine.use_recompute=maybe", "Engine.use_recompute", "want true or false"},
		{"Data.Train.dataset.split=[1,2]", "Data.Train.dataset.split", "got a list of 2"},
		{"Model=3", "Model", "want a mapping"},
		{"Engine.mix_precision.use_pure_fp16=true", "Engine.mix_precision.use_pure_fp16", "contradicts"},
		{"Engine.mix_precision.reduce_dtype=fp16", "Engine.mix_precision.reduce_dtype", "set it to one of"},
		{"Engine.mix_precision.reduce_dtype=bf16", "Engine.mix_precision.reduce_dtype", "set dtype to bf16"},
	}
	for _, tt := range tests {
		t.Run(tt.override, func(t *testing.T) {
			_, err := Load("tiny", []string{tt.override})
			if err == nil {
				t.Fatal("Load succeeded")
			}
			e := asError(t, err)
			if want := "override \"" + tt.override + "\""; e.File != want {
				t.Errorf("File = %q, want %q", e.File, want)
			}
			if e.Key != tt.key || !strings.Contains(e.Msg, tt.msg) {
				t.Errorf("got key %q msg %q, want key %q msg containing %q", e.Key, e.Msg, tt.key, tt.msg)
			}
		})
	}
}

func TestFileErrors(t *testing.T) {
	tests := []struct {
		name, yaml string
		line       int
		key, msg   string
	}{
		{"unknown key", "Model:\n  hidden_size: 64\n  hiden_size: 3\n", 3, "Model.hiden_size", "unknown key; did you mean Model.hidden_size?"},
		{"unknown section", "Modle:\n  hidden_size: 3\n", 1, "Modle", "did you mean Model?"},
		{"wrong section", "Global:\n  max_steps: 3\n", 2, "Global.max_steps", "did you mean Engine.max_steps?"},
		{"no suggestion", "Engine:\n  zzzzzzzzzz: 1\n", 2, "Engine.zzzzzzzzzz", "unknown key"},
		{"type error", "Model:\n  num_layers: 2\n\n  hidden_size: abc\n", 4, "Model.hidden_size", `want an integer, got "abc"`},
		{"float type error", "Optimizer:\n  beta1: [1]\n", 2, "Optimizer.beta1", "want a number, got a list"},
		{"string type error", "Model:\n  init_from: {a: 1}\n", 2, "Model.init_from", "want a string"},
		{"section type error", "Engine:\n  save_load: 3\n", 2, "Engine.save_load", "want a mapping"},
		{"duplicate", "Model:\n  hidden_size: 64\n  hidden_size: 32\n", 3, "Model.hidden_size", "duplicate key (first set at line 2)"},
		{"alias duplicate", "Optimizer:\n  beta1: 0.9\n  adam_beta1: 0.8\n", 3, "Optimizer.beta1", "adam_beta1 is another spelling of beta1"},
		{"bad split string", "Data:\n  Train:\n    dataset:\n      split: '1,x,3'\n", 4, "Data.Train.dataset.split", "want three numbers"},
		{"dotted key", "Model.hidden_size: 3\n", 1, "Model.hidden_size", "dotted keys are only for overrides"},
		{"syntax", "Model:\n  hidden_size: [\n", 2, "", "invalid YAML"},
		{"two documents", "Model: {}\n---\nModel: {}\n", 2, "", "more than one YAML document"},
		{"not a mapping", "- 1\n", 1, "", "a config is a mapping of sections"},
		{"validation", "Model:\n  hidden_size: 64\n  num_layers: 2\n  num_attention_heads: 5\n", 2, "Model.hidden_size", "not a multiple of num_attention_heads (5)"},
		{"validation of unset key", "Model:\n  num_layers: 2\n", 0, "Model.hidden_size", "positive integer"},
		{"bad base", "_base_: [a]\n", 1, "_base_", "want the name of a base"},
		{"missing base", "_base_: nope.yaml\n", 1, "_base_", `cannot find base "nope.yaml"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := writeFiles(t, map[string]string{"c.yaml": tt.yaml})
			file := filepath.Join(dir, "c.yaml")
			_, err := Load(file, nil)
			if err == nil {
				t.Fatal("Load succeeded")
			}
			e := asError(t, err)
			wantFile := file
			if tt.line == 0 {
				wantFile = ""
			}
			if e.File != wantFile || e.Line != tt.line || e.Key != tt.key || !strings.Contains(e.Msg, tt.msg) {
				t.Errorf("got %q\nwant %s:%d: %s: ...%s...", e.Error(), wantFile, tt.line, tt.key, tt.msg)
			}
			// Parse reports the same error under the given name.
			_, perr := Parse("given.yaml", []byte(tt.yaml))
			if perr == nil {
				t.Fatal("Parse succeeded")
			}
			pe := asError(t, perr)
			if pe.Line != e.Line || pe.Key != e.Key || (tt.line != 0 && pe.File != "given.yaml") {
				t.Errorf("Parse: got %q, Load: %q", pe.Error(), e.Error())
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "absent.yaml"), nil)
	if e := asError(t, err); !errors.Is(err, fs.ErrNotExist) || e.Msg != "cannot read config" {
		t.Errorf("got %v, want a wrapped fs.ErrNotExist", err)
	}
	if _, err := Load("", nil); err == nil {
		t.Error("Load(\"\") succeeded")
	} else {
		asError(t, err)
	}
}

func TestBaseInheritance(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"base.yaml": `
Global:
  local_batch_size: 4
Model:
  hidden_size: 32
  num_layers: 3
  num_attention_heads: 4
  hidden_dropout_prob: 0.2
Optimizer:
  lr:
    max_lr: 0.01
    min_lr: 0.001
`,
		"sub/mid.yaml": `
_base_: ../base.yaml
Model:
  num_layers: 5
  hidden_dropout_prob:   # null: unset, back to the default
Optimizer:
  lr:
    max_lr: 0.02
`,
		"sub/child.yaml": `
_base_: mid.yaml
Model:
  num_attention_heads: 8
Optimizer:
`,
		"onpreset.yaml": `
_base_: tiny
Model:
  num_layers: 3
`,
		"ongpubase.yaml": `
_base_: ./_gpu.yaml
Model:
  hidden_size: 64
  num_layers: 1
  num_attention_heads: 1
`,
		"other/child.yaml": "_base_: tiny\n",
		"other/tiny":       "Model:\n  hidden_size: 16\n  num_layers: 1\n  num_attention_heads: 1\n",
	})
	tests := []struct {
		file  string
		check func(c *Config) bool
	}{
		{"sub/child.yaml", func(c *Config) bool {
			m, lr := c.Model, c.Optimizer.LR
			return c.Global.LocalBatchSize == 4 && m.HiddenSize == 32 && m.NumLayers == 5 && m.NumAttentionHeads == 8 &&
				m.HiddenDropoutProb == 0.1 && lr.MaxLR == 0.02 && lr.MinLR == 0.001
		}},
		{"onpreset.yaml", func(c *Config) bool {
			return c.Model.HiddenSize == 64 && c.Model.NumLayers == 3 && c.Engine.MaxSteps == 200
		}},
		{"ongpubase.yaml", func(c *Config) bool { return c.Global.Device == "gpu" && c.Engine.MixPrecision.Dtype == "fp16" }},
		// A _base_ file wins over the preset of the same name.
		{"other/child.yaml", func(c *Config) bool { return c.Model.HiddenSize == 16 && c.Engine.MaxSteps == 1000 }},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			c, err := Load(filepath.Join(dir, tt.file), nil)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(c) {
				t.Errorf("unexpected result:\n%s", c.YAML())
			}
		})
	}
	// Parse resolves embedded bases only.
	if c, err := Parse("x", []byte("_base_: tiny\nModel:\n  num_layers: 3\n")); err != nil || c.Model.NumLayers != 3 || c.Model.HiddenSize != 64 {
		t.Errorf("Parse with an embedded base: %v", err)
	}
	_, err := Parse("x", []byte("_base_: base.yaml\n"))
	if e := asError(t, err); e.Key != "_base_" || !strings.Contains(e.Msg, "only embedded presets") {
		t.Errorf("Parse with a file base: %v", err)
	}
}

func TestBaseErrorsCarryTheirFile(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"base.yaml":  "Model:\n  hidden_size: 64\n  nm_layers: 2\n",
		"child.yaml": "_base_: base.yaml\n",
	})
	_, err := Load(filepath.Join(dir, "child.yaml"), nil)
	e := asError(t, err)
	if e.File != filepath.Join(dir, "base.yaml") || e.Line != 3 || e.Key != "Model.nm_layers" {
		t.Errorf("got %v", err)
	}
}

func TestBaseCycle(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"a.yaml":    "_base_: b.yaml\n",
		"b.yaml":    "_base_: ./c.yaml\n",
		"c.yaml":    "_base_: a.yaml\n",
		"self.yaml": "_base_: self.yaml\n",
	})
	for _, f := range []string{"a.yaml", "self.yaml"} {
		_, err := Load(filepath.Join(dir, f), nil)
		if err == nil {
			t.Fatalf("%s: Load succeeded", f)
		}
		if e := asError(t, err); e.Key != "_base_" || !strings.Contains(e.Msg, "inheritance cycle") {
			t.Errorf("%s: got %v", f, err)
		}
	}
}

func TestSeedSpellings(t *testing.T) {
	// A document in the seeds' spellings: adam_* keys, a bare grad_clip,
	// a string split, use_pure_fp16, float16, null values and ignored keys.
	doc := `
Global:
  device: gpu
  global_batch_size:
  local_batch_size: 8
  micro_batch_size: 8
Engine:
  num_train_epochs: 1
  use_recompute: False
  recompute_granularity:
  mix_precision:
    use_pure_fp16: True
    scale_loss: 32768.0
Model:
  module: "GPTModuleAuto"
  name: "GPT"
  vocab_size: 50304
  hidden_size: 1024
  num_layers: 24
  num_attention_heads: 16
  ffn_hidden_size: 4096
  type_vocab_size: 16
Data:
  Train:
    dataset:
      name: GPTDataset
      input_dir: ./data
      split: '949,50,1'
    sampler:
      name: GPTBatchSampler
      shuffle: False
    loader:
      num_workers: 1
Optimizer:
  adam_beta1: 0.9
  adam_beta2: 0.999
  adam_epsilon: 1.0e-8
  grad_clip: 1.0
  lr:
    decay_steps: 360000
    warmup_rate: 0.01
    max_lr: 5.0e-5
    min_lr: 1.0e-5
`
	c, err := Parse("seed.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if c.Engine.MixPrecision.Dtype != "fp16" || c.Optimizer.GradClip.ClipNorm != 1 || c.Optimizer.Epsilon != 1e-8 ||
		c.Data.Train.Dataset.Split != [3]float64{949, 50, 1} || c.Global.GlobalBatchSize != 8 ||
		c.Engine.RecomputeGranularity != "full" || c.PaddedVocab() != 50304 {
		t.Errorf("seed spellings decoded wrongly:\n%s", c.YAML())
	}
}

func TestDefaults(t *testing.T) {
	c, err := Parse("min.yaml", []byte("Model:\n  hidden_size: 48\n  num_layers: 2\n  num_attention_heads: 3\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Global: Global{Seed: 1234, GlobalBatchSize: 8, LocalBatchSize: 8, MicroBatchSize: 8, Device: "cpu"},
		Engine: Engine{MaxSteps: 1000, LoggingFreq: 1, EvalFreq: 0, EvalIters: 10, LogDir: "log",
			RecomputeGranularity: "full", MixPrecision: MixPrecision{Dtype: "fp32", ScaleLoss: 1, ReduceDtype: "fp32"},
			SaveLoad: SaveLoad{OutputDir: "output", KeepLast: 3, Replicas: 1}},
		Model: Model{Family: "gpt2", VocabSize: 50257, HiddenSize: 48, NumLayers: 2, NumAttentionHeads: 3, FFNHiddenSize: 192,
			HiddenDropoutProb: 0.1, AttentionProbsDropoutProb: 0.1, MaxPositionEmbeddings: 1024, InitializerRange: 0.02,
			NumKeyValueHeads: 3, RopeScaling: RopeScaling{RopeType: "default"}, TieWordEmbeddings: true},
		Data: Data{
			Train: DataSection{Dataset{Split: [3]float64{949, 50, 1}, MaxSeqLen: 1024, Shuffle: true}},
			Eval:  DataSection{Dataset{Split: [3]float64{949, 50, 1}, MaxSeqLen: 1024, Shuffle: true}},
		},
		Optimizer: Optimizer{WeightDecay: 0.01, Beta1: 0.9, Beta2: 0.999, Epsilon: 1e-8, GradClip: GradClip{ClipNorm: 1},
			LR: LR{DecaySteps: 1000, WarmupRate: 0.01, MaxLR: 1e-4, MinLR: 1e-5}},
		Distributed: Distributed{DPDegree: 1, MPDegree: 1, CPDegree: 1, PPDegree: 1, VPPDegree: 1, PPSchedule: "1f1b", Sharding: Sharding{ShardingDegree: 1, ShardingStage: 1}},
		derived:     map[string]string{"Optimizer.lr.decay_steps": "Engine.max_steps", "Optimizer.lr.min_lr": "Optimizer.lr.max_lr / 10"},
	}
	if !reflect.DeepEqual(*c, want) {
		t.Errorf("defaults:\n%s", c.YAML())
	}
}

func TestDerivedDefaults(t *testing.T) {
	const model = "Model:\n  hidden_size: 16\n  num_layers: 1\n  num_attention_heads: 1\n"
	tests := []struct {
		name, yaml string
		check      func(c *Config) bool
	}{
		{"explicit zeros kept", "  hidden_dropout_prob: 0\n  attention_probs_dropout_prob: 0.0\nOptimizer:\n  weight_decay: 0\n  grad_clip:\n    clip_norm: 0\n  lr:\n    warmup_rate: 0\n    min_lr: 0\n",
			func(c *Config) bool {
				return c.Model.HiddenDropoutProb == 0 && c.Model.AttentionProbsDropoutProb == 0 && c.Optimizer.WeightDecay == 0 &&
					c.Optimizer.GradClip.ClipNorm == 0 && c.Optimizer.LR.WarmupRate == 0 && c.Optimizer.LR.MinLR == 0
			}},
		{"local from global", "Global:\n  global_batch_size: 32\nDistributed:\n  dp_degree: 2\n  sharding:\n    sharding_degree: 2\n",
			func(c *Config) bool { return c.Global.LocalBatchSize == 8 && c.Global.MicroBatchSize == 8 }},
		{"global from local", "Global:\n  local_batch_size: 6\n  micro_batch_size: 2\nDistributed:\n  dp_degree: 3\n",
			func(c *Config) bool { return c.Global.GlobalBatchSize == 18 && c.AccumulateSteps() == 3 }},
		{"local from micro", "Global:\n  micro_batch_size: 2\n",
			func(c *Config) bool { return c.Global.LocalBatchSize == 2 && c.Global.GlobalBatchSize == 2 }},
		{"min_lr from max_lr", "Optimizer:\n  lr:\n    max_lr: 5.0e-6\n",
			func(c *Config) bool { return math.Abs(c.Optimizer.LR.MinLR-5e-7) < 1e-20 }},
		{"decay from max_steps", "Engine:\n  max_steps: 77\n",
			func(c *Config) bool { return c.Optimizer.LR.DecaySteps == 77 }},
		{"pure fp16", "Engine:\n  mix_precision:\n    use_pure_fp16: true\n",
			func(c *Config) bool { mp := c.Engine.MixPrecision; return mp.Dtype == "fp16" && mp.ScaleLoss == 32768 }},
		{"bfloat16", "Engine:\n  mix_precision:\n    dtype: bfloat16\n",
			func(c *Config) bool {
				mp := c.Engine.MixPrecision
				return mp.Dtype == "bf16" && !mp.UsePureFP16 && mp.ScaleLoss == 1
			}},
		{"eval inherits", "Data:\n  Train:\n    dataset:\n      input_dir: corpus.txt\n      shuffle: false\n  Eval:\n    dataset:\n      max_seq_len: 128\n",
			func(c *Config) bool {
				e := c.Data.Eval.Dataset
				return e.InputDir == "corpus.txt" && !e.Shuffle && e.MaxSeqLen == 128 && c.Data.Train.Dataset.MaxSeqLen == 1024
			}},
		{"yaml alias", "Data:\n  Train:\n    dataset: &ds\n      input_dir: a.txt\n  Eval:\n    dataset: *ds\n",
			func(c *Config) bool { return c.Data.Eval.Dataset.InputDir == "a.txt" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse(tt.name, []byte(model+tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(c) {
				t.Errorf("unexpected result:\n%s", c.YAML())
			}
		})
	}
}

func TestYAMLRoundTrip(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			c, err := Load(name, []string{"Model.init_from=\"yes: no\"", "Engine.log_dir=123"})
			if err != nil {
				t.Fatal(err)
			}
			out := c.YAML()
			c2, err := Parse(name+" (resolved)", out)
			if err != nil {
				t.Fatalf("re-parse: %v\n%s", err, out)
			}
			if !reflect.DeepEqual(c, c2) {
				t.Errorf("round trip changed the config:\n%s\n%s", out, c2.YAML())
			}
			if c.Model.InitFrom != "yes: no" || c.Engine.LogDir != "123" {
				t.Errorf("string overrides: init_from %q log_dir %q", c.Model.InitFrom, c.Engine.LogDir)
			}
			if !strings.HasPrefix(string(out), "Global:\n  seed: ") {
				t.Errorf("unexpected key order:\n%s", out)
			}
		})
	}
}

func TestErrorString(t *testing.T) {
	tests := []struct {
		err  Error
		want string
	}{
		{Error{File: "a.yaml", Line: 3, Key: "Model.x", Msg: "bad"}, "a.yaml:3: Model.x: bad"},
		{Error{File: "a.yaml", Key: "Model.x", Msg: "bad"}, "a.yaml: Model.x: bad"},
		{Error{Key: "Model.x", Msg: "bad"}, "Model.x: bad"},
		{Error{Msg: "bad"}, "bad"},
		{Error{Line: 4, Msg: "bad"}, "line 4: bad"},
		{Error{File: "a.yaml", Msg: "cannot read config", Err: fs.ErrNotExist}, "a.yaml: cannot read config: file does not exist"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("got %q, want %q", got, tt.want)
		}
	}
}

func TestPaddedVocab(t *testing.T) {
	tests := []struct{ vocab, want int }{{50257, 50304}, {128, 128}, {129, 256}, {1, 128}, {0, 0}}
	for _, tt := range tests {
		c := &Config{Model: Model{VocabSize: tt.vocab}}
		if got := c.PaddedVocab(); got != tt.want {
			t.Errorf("PaddedVocab(%d) = %d, want %d", tt.vocab, got, tt.want)
		}
	}
}

func TestSuggest(t *testing.T) {
	s := newSchema()
	tests := []struct{ in, want string }{
		{"Model.hiden_size", "Model.hidden_size"},
		{"Model.HiddenSize", "Model.hidden_size"},
		{"Engine.save_load.keeplast", "Engine.save_load.keep_last"},
		{"Optimizer.lr.warmup_ratio", "Optimizer.lr.warmup_rate"},
		{"Distributed.sharding_degree", "Distributed.sharding.sharding_degree"},
		{"Global.batch_size", ""},
		{"Data.Train.dataset.fused_linear", ""},
		{"Globl", "Global"},
	}
	for _, tt := range tests {
		if got := s.suggest(tt.in); got != tt.want {
			t.Errorf("suggest(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestParallelAliases: the seeds' other spellings of the degrees.
func TestParallelAliases(t *testing.T) {
	tests := []struct {
		override string
		get      func(*Config) int
	}{
		{"Distributed.tensor_parallel_degree=2", func(c *Config) int { return c.Distributed.MPDegree }},
		{"Distributed.model_parallel=2", func(c *Config) int { return c.Distributed.MPDegree }},
		{"Distributed.pipeline_parallel_degree=2", func(c *Config) int { return c.Distributed.PPDegree }},
		{"Distributed.pipeline_stage=2", func(c *Config) int { return c.Distributed.PPDegree }},
		{"Distributed.data_parallel=2", func(c *Config) int { return c.Distributed.DPDegree }},
		{"Distributed.sharding_parallel_degree=2", func(c *Config) int { return c.Distributed.Sharding.ShardingDegree }},
	}
	for _, tc := range tests {
		o := []string{tc.override, "Global.local_batch_size=4", "Global.micro_batch_size=4", "Global.global_batch_size="}
		if strings.Contains(tc.override, "data_parallel") || strings.Contains(tc.override, "sharding") {
			o[3] = "Global.global_batch_size=8"
		} else {
			o[3] = "Global.global_batch_size=4"
		}
		c, err := Load("tiny", o)
		if err != nil {
			t.Errorf("%s: %v", tc.override, err)
			continue
		}
		if got := tc.get(c); got != 2 {
			t.Errorf("%s: degree %d, want 2", tc.override, got)
		}
	}
}

// TestScheduleDerived: the lr schedule's keys left unset are derived, say
// so (DerivedFrom) and stay unset in the YAML a job's workers and a
// checkpoint read back; set ones, by a file or an override, are not.
func TestScheduleDerived(t *testing.T) {
	for _, tt := range []struct {
		name      string
		overrides []string
		derived   map[string]string // key: from; absent keys are explicit
	}{
		{"tiny", nil, map[string]string{"Optimizer.lr.decay_steps": "Engine.max_steps"}},
		{"decay set", []string{"Optimizer.lr.decay_steps=40"}, map[string]string{}},
		{"min_lr unset", []string{"Optimizer.lr.min_lr="}, map[string]string{"Optimizer.lr.decay_steps": "Engine.max_steps", "Optimizer.lr.min_lr": "Optimizer.lr.max_lr / 10"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load("tiny", tt.overrides)
			if err != nil {
				t.Fatal(err)
			}
			c2, err := Parse("resolved", c.YAML())
			if err != nil {
				t.Fatal(err)
			}
			for _, cfg := range []*Config{c, c2} {
				for _, key := range []string{"Optimizer.lr.decay_steps", "Optimizer.lr.min_lr"} {
					from, ok := cfg.DerivedFrom(key)
					if want, derived := tt.derived[key]; ok != derived || from != want {
						t.Errorf("DerivedFrom(%s) = %q, %v; want %q, %v", key, from, ok, want, derived)
					}
				}
			}
		})
	}
	c, _ := Load("tiny", []string{"Engine.max_steps=20"})
	if y := string(c.YAML()); !strings.Contains(y, "    decay_steps: # derived from Engine.max_steps: 20\n") {
		t.Errorf("the YAML does not leave decay_steps unset with its value:\n%s", y)
	}
}
