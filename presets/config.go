// Package presets defines gptui's training configuration: its schema, which
// follows the YAML shape of PaddleFleetX's GPT configs (sections Global,
// Engine, Model, Data, Optimizer and Distributed with snake_case keys), how
// configurations are loaded, inherited (_base_), overridden ("-o
// Section.key=value"), completed with defaults and validated, and the
// presets embedded in the binary.
//
// A configuration is resolved in four steps:
//
//  1. The YAML document is read into a tree, key by key, checking every key
//     against the schema. A top-level _base_ key names another file
//     (relative to the including file) or an embedded preset; the base is
//     resolved recursively and the including document is deep-merged over
//     it, so the child wins.
//  2. Overrides are applied to the merged tree.
//  3. The tree is decoded into a [Config] and every key that was not set is
//     given its default. Because set-ness is tracked per key, an explicit 0
//     (for example hidden_dropout_prob: 0) is kept, while an empty value
//     (global_batch_size: with nothing after it, as in the PaddleFleetX
//     configs) means "unset, derive it".
//  4. The result is validated.
//
// Every error caused by user input is, or wraps, an [*Error] carrying the file,
// line and dotted key it concerns.
package presets

import (
	"strings"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/layout"
)

// Config is a complete gptui training configuration. Its YAML keys are the
// snake_case names of PaddleFleetX (see the yaml struct tags and the package
// documentation); configurations returned by [Load] and [Parse] have all
// defaults filled in and have passed [Config.Validate].
type Config struct {
	Global      Global      `yaml:"Global"`
	Engine      Engine      `yaml:"Engine"`
	Model       Model       `yaml:"Model"`
	Data        Data        `yaml:"Data"`
	Optimizer   Optimizer   `yaml:"Optimizer"`
	Distributed Distributed `yaml:"Distributed"`

	// Notes says, a line each, what loading derived that the user may not
	// expect (a batch size re-derived for the overrides' degrees); the
	// trainer logs them.
	Notes []string `yaml:"-"`

	// derived maps the keys of scheduleDerived that were left unset, and
	// so derived, to what they were derived from; nil when none was.
	// YAML writes them unset, so that a config it writes (a job's
	// config.yaml, a checkpoint's) derives them again.
	derived map[string]string
	// defaulted holds the keys a loaded checkpoint settles that a
	// Llama's config left unset (Defaulted); nil when none was. It is
	// shared by the copies of a Config and never changed in place.
	defaulted map[string]bool
}

// DerivedFrom reports whether key, one of the lr schedule's keys that
// other keys derive when it is left unset (Optimizer.lr.decay_steps from
// Engine.max_steps, Optimizer.lr.min_lr from Optimizer.lr.max_lr), was left
// unset when c was loaded, and what it was derived from. A resumed run
// refuses to let such a key change the schedule a checkpoint was trained
// with, where it accepts a key set explicitly.
func (c *Config) DerivedFrom(key string) (from string, ok bool) {
	from, ok = c.derived[key]
	return from, ok
}

// Global holds the run-wide settings: random seed, batch sizes and device.
//
// GlobalBatchSize is the number of sequences per optimizer step across all
// data-parallel ranks, LocalBatchSize the number per rank and step, and
// MicroBatchSize the number per forward/backward pass; gradients are
// accumulated over LocalBatchSize/MicroBatchSize micro-batches.
type Global struct {
	Seed            int64  `yaml:"seed"`
	GlobalBatchSize int    `yaml:"global_batch_size"`
	LocalBatchSize  int    `yaml:"local_batch_size"`
	MicroBatchSize  int    `yaml:"micro_batch_size"`
	Device          string `yaml:"device"` // "cpu" or "gpu"
}

// Engine holds the training-loop settings.
type Engine struct {
	MaxSteps    int    `yaml:"max_steps"`
	LoggingFreq int    `yaml:"logging_freq"` // log every LoggingFreq steps
	EvalFreq    int    `yaml:"eval_freq"`    // evaluate every EvalFreq steps; 0 disables evaluation
	EvalIters   int    `yaml:"eval_iters"`   // batches per evaluation
	LogDir      string `yaml:"log_dir"`
	// UseRecompute enables activation recomputation in the backward pass.
	UseRecompute bool `yaml:"use_recompute"`
	// RecomputeGranularity is "full" (recompute whole transformer blocks)
	// or "only_attn" (recompute self-attention only).
	RecomputeGranularity string       `yaml:"recompute_granularity"`
	MixPrecision         MixPrecision `yaml:"mix_precision"`
	SaveLoad             SaveLoad     `yaml:"save_load"`
}

// MixPrecision selects the training precision.
type MixPrecision struct {
	// Dtype is "fp32", "bf16" or "fp16". On input the PaddleFleetX
	// spellings "float32", "bfloat16" and "float16" are accepted too.
	Dtype string `yaml:"dtype"`
	// ScaleLoss is the static loss-scaling factor used with fp16.
	ScaleLoss float64 `yaml:"scale_loss"`
	// UsePureFP16 is the seeds' spelling of Dtype == "fp16"; after
	// loading it always agrees with Dtype.
	UsePureFP16 bool `yaml:"use_pure_fp16"`
	// ReduceDtype is the precision the replicas' gradients are summed in
	// by data parallelism and sharding stage 1: "fp32" (the default, as
	// Megatron-LM's and torchtitan's), or "bf16" (needs Dtype "bf16"):
	// each bucket is rounded to bfloat16 and summed in bfloat16, half
	// the bytes on NCCL. Stages 2 and 3 reduce-scatter in float32.
	ReduceDtype string `yaml:"reduce_dtype"`
}

// SaveLoad controls checkpoints.
type SaveLoad struct {
	SaveSteps int    `yaml:"save_steps"` // save every SaveSteps steps; 0 never saves
	OutputDir string `yaml:"output_dir"` // where checkpoints are written
	CkptDir   string `yaml:"ckpt_dir"`   // checkpoint to resume from; empty starts afresh
	KeepLast  int    `yaml:"keep_last"`  // checkpoints kept; 0 keeps all
	Async     bool   `yaml:"async"`      // write checkpoints in the background
	Replicas  int    `yaml:"replicas"`   // nodes each checkpoint is kept on (launcher with --hosts)
	// Force lets a run from step 0 write into an output_dir that holds
	// another run's checkpoints (refused otherwise).
	Force bool `yaml:"force"`
	// Run, with ckpt_dir auto, resumes only from the checkpoints of
	// this run (checkpoint.Manifest.Run): a job's restarts set it.
	Run string `yaml:"run"`
}

// Model describes the network: a GPT-2, or a Llama (Family "llama"),
// whose keys are named as Hugging Face's LlamaConfig names them.
type Model struct {
	// Family is the model family: "gpt2" (the default) or "llama".
	Family                    string  `yaml:"family"`
	VocabSize                 int     `yaml:"vocab_size"`
	HiddenSize                int     `yaml:"hidden_size"`
	NumLayers                 int     `yaml:"num_layers"`
	NumAttentionHeads         int     `yaml:"num_attention_heads"`
	FFNHiddenSize             int     `yaml:"ffn_hidden_size"` // Llama: the SwiGLU intermediate size
	HiddenDropoutProb         float64 `yaml:"hidden_dropout_prob"`
	AttentionProbsDropoutProb float64 `yaml:"attention_probs_dropout_prob"`
	MaxPositionEmbeddings     int     `yaml:"max_position_embeddings"`
	InitializerRange          float64 `yaml:"initializer_range"`
	// InitFrom names a checkpoint or weights file to initialise from;
	// empty means random initialisation.
	InitFrom string `yaml:"init_from"`

	// The Llama family's keys (see LlamaKey), defaulted and written only
	// for it.

	// NumKeyValueHeads is the key/value heads of grouped-query attention,
	// dividing num_attention_heads (default: num_attention_heads).
	NumKeyValueHeads int `yaml:"num_key_value_heads"`
	// RMSNormEps is RMSNorm's epsilon (default 1e-6; 1e-5 in Llama 3).
	RMSNormEps float64 `yaml:"rms_norm_eps"`
	// RopeTheta is the base of the rotary embeddings' frequencies
	// (default 10000; 500000 in Llama 3).
	RopeTheta float64 `yaml:"rope_theta"`
	// RopeScaling is Llama 3.1's frequency scaling, when its RopeType is
	// "llama3".
	RopeScaling RopeScaling `yaml:"rope_scaling"`
	// TieWordEmbeddings makes the head the token embedding's transpose
	// (default false: a separate lm_head). GPT-2 always ties.
	TieWordEmbeddings bool `yaml:"tie_word_embeddings"`
}

// RopeScaling is Hugging Face's rope_scaling of a Llama config.
type RopeScaling struct {
	// RopeType is "default" (no scaling) or "llama3" (Llama 3.1's).
	RopeType                      string  `yaml:"rope_type"`
	Factor                        float64 `yaml:"factor"`                           // default 8
	LowFreqFactor                 float64 `yaml:"low_freq_factor"`                  // default 1
	HighFreqFactor                float64 `yaml:"high_freq_factor"`                 // default 4
	OriginalMaxPositionEmbeddings int     `yaml:"original_max_position_embeddings"` // default 8192
}

// LlamaKey reports whether key (a full dotted path) is one of the Llama
// family's own keys, which a GPT-2 config leaves out.
func LlamaKey(key string) bool {
	switch key {
	case "Model.num_key_value_heads", "Model.rms_norm_eps", "Model.rope_theta", "Model.tie_word_embeddings":
		return true
	}
	return strings.HasPrefix(key, "Model.rope_scaling.")
}

// Llama reports whether the model is of the Llama family.
func (m Model) Llama() bool { return m.Family == "llama" }

// Data holds the training and evaluation data sets.
type Data struct {
	// Tokenizer is a Hugging Face tokenizer.json that tokenizes the
	// built-in corpus for training and that `gptui generate` uses for a
	// checkpoint trained with this config; empty means GPT-2's built-in
	// tokenizer. Shards in input_dir are tokenized already, by
	// `gptui data prepare --tokenizer`.
	Tokenizer string      `yaml:"tokenizer"`
	Train     DataSection `yaml:"Train"`
	Eval      DataSection `yaml:"Eval"`
}

// DataSection is one of Data.Train and Data.Eval.
type DataSection struct {
	Dataset Dataset `yaml:"dataset"`
}

// Dataset describes where tokens come from and how they are cut.
type Dataset struct {
	// InputDir is a file or directory of training text; empty means the
	// built-in corpus.
	InputDir string `yaml:"input_dir"`
	// Split holds the train/validation/test proportions, like PaddleFleetX's
	// '949,50,1'. On input a comma-separated string or a list is accepted.
	Split     [3]float64 `yaml:"split"`
	MaxSeqLen int        `yaml:"max_seq_len"`
	Shuffle   bool       `yaml:"shuffle"`
}

// Optimizer holds the AdamW settings.
type Optimizer struct {
	WeightDecay float64  `yaml:"weight_decay"`
	Beta1       float64  `yaml:"beta1"`   // also read as adam_beta1
	Beta2       float64  `yaml:"beta2"`   // also read as adam_beta2
	Epsilon     float64  `yaml:"epsilon"` // also read as adam_epsilon
	GradClip    GradClip `yaml:"grad_clip"`
	LR          LR       `yaml:"lr"`
}

// GradClip configures global-norm gradient clipping. On input,
// "grad_clip: 1.0" is accepted as short for "grad_clip: {clip_norm: 1.0}".
type GradClip struct {
	ClipNorm float64 `yaml:"clip_norm"` // 0 disables clipping
}

// LR is a cosine learning-rate schedule with linear warmup: the rate rises
// from 0 to MaxLR over WarmupRate×DecaySteps steps, then decays to MinLR at
// DecaySteps and stays there.
type LR struct {
	DecaySteps int     `yaml:"decay_steps"`
	WarmupRate float64 `yaml:"warmup_rate"`
	MaxLR      float64 `yaml:"max_lr"`
	MinLR      float64 `yaml:"min_lr"`
}

// Distributed holds the parallelism degrees.
type Distributed struct {
	DPDegree int `yaml:"dp_degree"` // data parallel
	MPDegree int `yaml:"mp_degree"` // tensor (model) parallel
	PPDegree int `yaml:"pp_degree"` // pipeline parallel
	// VPPDegree is the number of virtual pipeline stages (model chunks) per
	// pipeline rank: more than 1 selects the interleaved schedule.
	VPPDegree int `yaml:"vpp_degree"`
	// PPSchedule is the pipeline schedule: 1f1b, interleaved or gpipe.
	PPSchedule string   `yaml:"pp_schedule"`
	Sharding   Sharding `yaml:"sharding"`
	// SequenceParallel splits the residual stream between the
	// tensor-parallel regions along the sequence over the mp_degree ranks
	// (Megatron-LM's sequence parallelism): the norms, dropouts and
	// residual adds each run on a rank's rows, and the regions' all-reduces
	// become an all-gather in and a reduce-scatter out.
	SequenceParallel bool `yaml:"sequence_parallel"`
	// CPDegree is the context-parallel degree: each sequence cut into
	// 2·cp_degree chunks, each rank holding two (one early, one late, so
	// that the causal mask gives every rank the same work), the keys and
	// values passed around the ranks' ring inside attention.
	CPDegree int `yaml:"cp_degree"`
	// Auto lets `gptui train` choose the strategy (package planner): the
	// degrees, the micro-batch size and recomputation, for the global
	// batch and the number of workers. Degrees set above 1 beside it, or
	// given with -o, are kept (semi-auto).
	Auto bool `yaml:"auto"`
}

// Sharding configures ZeRO-style sharded data parallelism.
type Sharding struct {
	ShardingDegree int `yaml:"sharding_degree"`
	ShardingStage  int `yaml:"sharding_stage"` // 1, 2 or 3
}

// AccumulateSteps returns the number of micro-batches whose gradients are
// accumulated per optimizer step, LocalBatchSize/MicroBatchSize. It returns
// 0 when MicroBatchSize is not positive, which a validated Config excludes.
func (c *Config) AccumulateSteps() int {
	if c.Global.MicroBatchSize <= 0 {
		return 0
	}
	return c.Global.LocalBatchSize / c.Global.MicroBatchSize
}

// PaddedVocab returns Model.VocabSize rounded up to a multiple of 128, the
// row count of the embedding table (50257 pads to 50304).
func (c *Config) PaddedVocab() int { return arch.PadVocab(c.Model.VocabSize) }

// Shape is c's model as sizes: what the engine lays out, the planner
// prices and the layout rule ([layout.Check]) reads.
func (c *Config) Shape() arch.Shape {
	m := c.Model
	s := arch.Shape{MaxT: m.MaxPositionEmbeddings, V: m.VocabSize, Vp: c.PaddedVocab(), L: m.NumLayers,
		NH: m.NumAttentionHeads, C: m.HiddenSize, F: m.FFNHiddenSize}
	if m.Llama() {
		s.Family, s.NKV, s.Untied = arch.Llama, m.NumKeyValueHeads, !m.TieWordEmbeddings
	}
	return s
}

// Layout is c's parallel layout.
func (c *Config) Layout() layout.Layout {
	d := c.Distributed
	return layout.Layout{DP: d.DPDegree, Sharding: d.Sharding.ShardingDegree, MP: d.MPDegree, PP: d.PPDegree,
		VPP: d.VPPDegree, Stage: d.Sharding.ShardingStage, Schedule: d.PPSchedule, SP: d.SequenceParallel, CP: d.CPDegree}
}

// Batch is c's batch sizes.
func (c *Config) Batch() layout.Batch {
	g := c.Global
	return layout.Batch{Global: g.GlobalBatchSize, Local: g.LocalBatchSize, Micro: g.MicroBatchSize, Seq: c.Data.Train.Dataset.MaxSeqLen}
}
