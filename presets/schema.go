package presets

import (
	"strings"
	"unicode/utf8"
)

// field is one leaf key of the schema.
type field struct {
	path string
	// ref returns a pointer to the field's storage in c: *int, *int64,
	// *float64, *bool, *string or *[3]float64.
	ref func(c *Config) any
}

// fields returns the schema's leaf keys in the order YAML emits them.
func fields() []field {
	fs := []field{
		{"Global.seed", func(c *Config) any { return &c.Global.Seed }},
		{"Global.global_batch_size", func(c *Config) any { return &c.Global.GlobalBatchSize }},
		{"Global.local_batch_size", func(c *Config) any { return &c.Global.LocalBatchSize }},
		{"Global.micro_batch_size", func(c *Config) any { return &c.Global.MicroBatchSize }},
		{"Global.device", func(c *Config) any { return &c.Global.Device }},

		{"Engine.max_steps", func(c *Config) any { return &c.Engine.MaxSteps }},
		{"Engine.logging_freq", func(c *Config) any { return &c.Engine.LoggingFreq }},
		{"Engine.eval_freq", func(c *Config) any { return &c.Engine.EvalFreq }},
		{"Engine.eval_iters", func(c *Config) any { return &c.Engine.EvalIters }},
		{"Engine.log_dir", func(c *Config) any { return &c.Engine.LogDir }},
		{"Engine.use_recompute", func(c *Config) any { return &c.Engine.UseRecompute }},
		{"Engine.recompute_granularity", func(c *Config) any { return &c.Engine.RecomputeGranularity }},
		{"Engine.mix_precision.dtype", func(c *Config) any { return &c.Engine.MixPrecision.Dtype }},
		{"Engine.mix_precision.scale_loss", func(c *Config) any { return &c.Engine.MixPrecision.ScaleLoss }},
		{"Engine.mix_precision.use_pure_fp16", func(c *Config) any { return &c.Engine.MixPrecision.UsePureFP16 }},
		{"Engine.mix_precision.reduce_dtype", func(c *Config) any { return &c.Engine.MixPrecision.ReduceDtype }},
		{"Engine.save_load.save_steps", func(c *Config) any { return &c.Engine.SaveLoad.SaveSteps }},
		{"Engine.save_load.output_dir", func(c *Config) any { return &c.Engine.SaveLoad.OutputDir }},
		{"Engine.save_load.ckpt_dir", func(c *Config) any { return &c.Engine.SaveLoad.CkptDir }},
		{"Engine.save_load.keep_last", func(c *Config) any { return &c.Engine.SaveLoad.KeepLast }},
		{"Engine.save_load.async", func(c *Config) any { return &c.Engine.SaveLoad.Async }},
		{"Engine.save_load.force", func(c *Config) any { return &c.Engine.SaveLoad.Force }},
		{"Engine.save_load.run", func(c *Config) any { return &c.Engine.SaveLoad.Run }},
		{"Engine.save_load.replicas", func(c *Config) any { return &c.Engine.SaveLoad.Replicas }},

		{"Model.family", func(c *Config) any { return &c.Model.Family }},
		{"Model.vocab_size", func(c *Config) any { return &c.Model.VocabSize }},
		{"Model.hidden_size", func(c *Config) any { return &c.Model.HiddenSize }},
		{"Model.num_layers", func(c *Config) any { return &c.Model.NumLayers }},
		{"Model.num_attention_heads", func(c *Config) any { return &c.Model.NumAttentionHeads }},
		{"Model.ffn_hidden_size", func(c *Config) any { return &c.Model.FFNHiddenSize }},
		{"Model.hidden_dropout_prob", func(c *Config) any { return &c.Model.HiddenDropoutProb }},
		{"Model.attention_probs_dropout_prob", func(c *Config) any { return &c.Model.AttentionProbsDropoutProb }},
		{"Model.max_position_embeddings", func(c *Config) any { return &c.Model.MaxPositionEmbeddings }},
		{"Model.initializer_range", func(c *Config) any { return &c.Model.InitializerRange }},
		{"Model.init_from", func(c *Config) any { return &c.Model.InitFrom }},
		{"Model.num_key_value_heads", func(c *Config) any { return &c.Model.NumKeyValueHeads }},
		{"Model.rms_norm_eps", func(c *Config) any { return &c.Model.RMSNormEps }},
		{"Model.rope_theta", func(c *Config) any { return &c.Model.RopeTheta }},
		{"Model.rope_scaling.rope_type", func(c *Config) any { return &c.Model.RopeScaling.RopeType }},
		{"Model.rope_scaling.factor", func(c *Config) any { return &c.Model.RopeScaling.Factor }},
		{"Model.rope_scaling.low_freq_factor", func(c *Config) any { return &c.Model.RopeScaling.LowFreqFactor }},
		{"Model.rope_scaling.high_freq_factor", func(c *Config) any { return &c.Model.RopeScaling.HighFreqFactor }},
		{"Model.rope_scaling.original_max_position_embeddings", func(c *Config) any { return &c.Model.RopeScaling.OriginalMaxPositionEmbeddings }},
		{"Model.tie_word_embeddings", func(c *Config) any { return &c.Model.TieWordEmbeddings }},

		{"Data.tokenizer", func(c *Config) any { return &c.Data.Tokenizer }},
	}
	for _, s := range []struct {
		name string
		ds   func(c *Config) *Dataset
	}{
		{"Train", func(c *Config) *Dataset { return &c.Data.Train.Dataset }},
		{"Eval", func(c *Config) *Dataset { return &c.Data.Eval.Dataset }},
	} {
		p, ds := "Data."+s.name+".dataset.", s.ds
		fs = append(fs,
			field{p + "input_dir", func(c *Config) any { return &ds(c).InputDir }},
			field{p + "split", func(c *Config) any { return &ds(c).Split }},
			field{p + "max_seq_len", func(c *Config) any { return &ds(c).MaxSeqLen }},
			field{p + "shuffle", func(c *Config) any { return &ds(c).Shuffle }},
		)
	}
	return append(fs,
		field{"Optimizer.weight_decay", func(c *Config) any { return &c.Optimizer.WeightDecay }},
		field{"Optimizer.beta1", func(c *Config) any { return &c.Optimizer.Beta1 }},
		field{"Optimizer.beta2", func(c *Config) any { return &c.Optimizer.Beta2 }},
		field{"Optimizer.epsilon", func(c *Config) any { return &c.Optimizer.Epsilon }},
		field{"Optimizer.grad_clip.clip_norm", func(c *Config) any { return &c.Optimizer.GradClip.ClipNorm }},
		field{"Optimizer.lr.decay_steps", func(c *Config) any { return &c.Optimizer.LR.DecaySteps }},
		field{"Optimizer.lr.warmup_rate", func(c *Config) any { return &c.Optimizer.LR.WarmupRate }},
		field{"Optimizer.lr.max_lr", func(c *Config) any { return &c.Optimizer.LR.MaxLR }},
		field{"Optimizer.lr.min_lr", func(c *Config) any { return &c.Optimizer.LR.MinLR }},

		field{"Distributed.dp_degree", func(c *Config) any { return &c.Distributed.DPDegree }},
		field{"Distributed.mp_degree", func(c *Config) any { return &c.Distributed.MPDegree }},
		field{"Distributed.pp_degree", func(c *Config) any { return &c.Distributed.PPDegree }},
		field{"Distributed.vpp_degree", func(c *Config) any { return &c.Distributed.VPPDegree }},
		field{"Distributed.pp_schedule", func(c *Config) any { return &c.Distributed.PPSchedule }},
		field{"Distributed.sharding.sharding_degree", func(c *Config) any { return &c.Distributed.Sharding.ShardingDegree }},
		field{"Distributed.sharding.sharding_stage", func(c *Config) any { return &c.Distributed.Sharding.ShardingStage }},
		field{"Distributed.sequence_parallel", func(c *Config) any { return &c.Distributed.SequenceParallel }},
		field{"Distributed.cp_degree", func(c *Config) any { return &c.Distributed.CPDegree }},
		field{"Distributed.auto", func(c *Config) any { return &c.Distributed.Auto }},
	)
}

// CanonicalKey is the schema's spelling of a dotted config key: the seeds'
// alternative spellings (PaddleNLP's tensor_parallel_degree, Megatron's
// adam_beta1, …) map to it, any other key to itself.
func CanonicalKey(key string) string { return canonical(key) }

// canonical maps the seeds' alternative spellings of a key to the schema's.
func canonical(path string) string {
	switch path {
	case "Optimizer.adam_beta1":
		return "Optimizer.beta1"
	case "Optimizer.adam_beta2":
		return "Optimizer.beta2"
	case "Optimizer.adam_epsilon":
		return "Optimizer.epsilon"
	// PaddleNLP's and MindFormers' names for the parallel degrees.
	case "Distributed.tensor_parallel_degree", "Distributed.model_parallel":
		return "Distributed.mp_degree"
	case "Distributed.pipeline_parallel_degree", "Distributed.pipeline_stage":
		return "Distributed.pp_degree"
	case "Distributed.virtual_pp_degree", "Distributed.virtual_pipeline_model_parallel_size":
		return "Distributed.vpp_degree"
	case "Distributed.data_parallel":
		return "Distributed.dp_degree"
	case "Distributed.sharding_parallel_degree":
		return "Distributed.sharding.sharding_degree"
	case "Model.sequence_parallel": // PaddleFleetX's place for it
		return "Distributed.sequence_parallel"
	case "Distributed.context_parallel_degree", "Distributed.context_parallel_size": // PaddleNLP's, Megatron's
		return "Distributed.cp_degree"
	}
	return path
}

// ignorable reports whether path is a key found in the PaddleFleetX seeds
// that gptui accepts and ignores, with whatever value. The list is kept
// deliberately short; anything else unknown is an error:
//
//   - Model.type_vocab_size, Model.name, Model.module: BERT-style token types
//     and Paddle's module registry, meaningless for gptui's GPT-2;
//   - Data.{Train,Eval}.dataset.name: the Paddle dataset class;
//   - Data.{Train,Eval}.sampler and .loader (whole subtrees): Paddle's
//     data-loader plumbing;
//   - Engine.num_train_epochs: gptui trains for max_steps steps.
func ignorable(path string) bool {
	switch path {
	case "Model.type_vocab_size", "Model.name", "Model.module",
		"Data.Train.dataset.name", "Data.Eval.dataset.name",
		"Data.Train.sampler", "Data.Eval.sampler",
		"Data.Train.loader", "Data.Eval.loader",
		"Engine.num_train_epochs":
		return true
	}
	return false
}

// gradClipPath is the section that also accepts a bare number (clip_norm).
const gradClipPath = "Optimizer.grad_clip"

// schema indexes the valid keys.
type schema struct {
	fields  []field
	leaf    map[string]int  // leaf path → index into fields
	section map[string]bool // section paths, such as "Engine.save_load"
	all     []string        // sections and leaves, for suggestions
}

func newSchema() *schema {
	s := &schema{fields: fields(), leaf: map[string]int{}, section: map[string]bool{}}
	for i, f := range s.fields {
		s.leaf[f.path] = i
		for p := f.path; ; {
			j := strings.LastIndexByte(p, '.')
			if j < 0 {
				break
			}
			p = p[:j]
			if !s.section[p] {
				s.section[p] = true
				s.all = append(s.all, p)
			}
		}
		s.all = append(s.all, f.path)
	}
	return s
}

// suggest returns the valid key closest to the unknown key path, or "".
// It first looks among path's siblings, comparing last segments, then
// anywhere in the schema for a key whose last segment is close, preferring
// the closest and then the first in schema order (so Data.Train before
// Data.Eval). Comparison ignores case.
func (s *schema) suggest(path string) string {
	parent, last := splitLast(path)
	last = strings.ToLower(last)
	limit := max(2, utf8.RuneCountInString(last)/3)
	best, bestD := "", limit+1
	for _, c := range s.all {
		cp, cl := splitLast(c)
		if cp != parent {
			continue
		}
		if d := levenshtein(last, strings.ToLower(cl)); d < bestD {
			best, bestD = c, d
		}
	}
	if best != "" {
		return best
	}
	bestD = limit + 1
	for _, c := range s.all {
		_, cl := splitLast(c)
		if d := levenshtein(last, strings.ToLower(cl)); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// unknownKey returns the error for an unknown key at p.
func (s *schema) unknownKey(p pos, path string) *Error {
	msg := "unknown key"
	if sug := s.suggest(path); sug != "" && sug != path {
		msg += "; did you mean " + sug + "?"
	}
	return errAt(p, path, msg)
}

// splitLast splits a dotted path into its parent and last segment.
func splitLast(path string) (parent, last string) {
	if i := strings.LastIndexByte(path, '.'); i >= 0 {
		return path[:i], path[i+1:]
	}
	return "", path
}

// join appends name to the dotted path prefix.
func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// levenshtein returns the edit distance between a and b, counted in runes.
func levenshtein(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}
