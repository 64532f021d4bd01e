package presets

import (
	"fmt"
	"math"
	"strings"

	"github.com/gptui/gptui/layout"
)

// maxSize bounds every size, count and degree, so that products of a few of
// them cannot overflow.
const maxSize = 1<<31 - 1

// Validate checks that c is a usable configuration. It returns nil or an
// *Error naming the first offending key (its full dotted path) and saying
// what to do; the File and Line of the error are empty, as c carries no
// positions. [Load] and [Parse] validate for you and fill them in.
//
// Validate checks: positive sizes, steps and degrees; hidden_size divisible
// by num_attention_heads; the model family and its keys (llamaCheck); the parallel layout ([layout.Check]: mp_degree
// dividing the heads, ffn_hidden_size and the padded vocabulary, pp_degree ×
// vpp_degree the layers, the batch sizes, the sharding stage, the pipeline
// schedule);
// max_seq_len ≤ max_position_embeddings; at most [MaxLayers] layers, [MaxElements]
// parameters and [MaxElements] elements in the largest activation tensor of a
// micro-batch ([ActivationBound]); probabilities and rates in [0, 1); learning rates ≥ 0
// with min_lr ≤ max_lr; betas in [0, 1); epsilon > 0; the enumerations
// device, dtype and recompute_granularity; and data splits of
// three non-negative numbers with a positive sum.
func (c *Config) Validate() error {
	if err := c.validate(); err != nil {
		return err
	}
	return nil
}

// check is one validation rule; it returns the offending key and a message,
// or "" when the rule holds.
type check func(c *Config) (key, msg string)

// validate returns the first failed rule as an *Error.
func (c *Config) validate() *Error {
	for _, chk := range checks() {
		if key, msg := chk(c); key != "" {
			return &Error{Key: key, Msg: msg}
		}
	}
	return nil
}

// positive returns a check that the int at key is in [1, maxSize].
func positive(key string, get func(c *Config) int) check {
	return func(c *Config) (string, string) {
		switch v := get(c); {
		case v < 1:
			return key, fmt.Sprintf("got %d; set it to a positive integer", v)
		case v > maxSize:
			return key, fmt.Sprintf("got %d; set it to at most %d", v, maxSize)
		}
		return "", ""
	}
}

// nonNegative returns a check that the int at key is in [0, maxSize].
func nonNegative(key, zero string, get func(c *Config) int) check {
	return func(c *Config) (string, string) {
		if v := get(c); v < 0 || v > maxSize {
			return key, fmt.Sprintf("got %d; set it to 0 (%s) or a positive integer (at most %d)", v, zero, maxSize)
		}
		return "", ""
	}
}

// unitInterval returns a check that the float at key is in [0, 1).
func unitInterval(key string, get func(c *Config) float64) check {
	return func(c *Config) (string, string) {
		if v := get(c); !(v >= 0 && v < 1) {
			return key, fmt.Sprintf("got %v; set it to a number in [0, 1)", v)
		}
		return "", ""
	}
}

// oneOf returns a check that the string at key is one of values.
func oneOf(key string, get func(c *Config) string, values ...string) check {
	return func(c *Config) (string, string) {
		v := get(c)
		for _, w := range values {
			if v == w {
				return "", ""
			}
		}
		return key, fmt.Sprintf("got %q; set it to one of %q", v, values)
	}
}

// finiteAtLeast returns a check that the float at key is finite and ≥ lo
// (> lo when strict).
func finiteAtLeast(key string, lo float64, strict bool, get func(c *Config) float64) check {
	return func(c *Config) (string, string) {
		v := get(c)
		ok := !math.IsInf(v, 0) && !math.IsNaN(v) && v >= lo && (!strict || v > lo)
		if ok {
			return "", ""
		}
		rel := "≥"
		if strict {
			rel = ">"
		}
		return key, fmt.Sprintf("got %v; set it to a finite number %s %v", v, rel, lo)
	}
}

// divisible returns a check that the int at key is a multiple of the int at
// by (which earlier checks have made positive).
func divisible(key string, get func(c *Config) int, by string, getBy func(c *Config) int) check {
	return func(c *Config) (string, string) {
		v, d := get(c), getBy(c)
		if d > 0 && v%d != 0 {
			return key, fmt.Sprintf("%d is not a multiple of %s (%d); change one of them", v, by, d)
		}
		return "", ""
	}
}

// splitCheck checks a data split.
func splitCheck(key string, get func(c *Config) [3]float64) check {
	return func(c *Config) (string, string) {
		s := get(c)
		sum := 0.0
		for _, v := range s {
			if !(v >= 0) || math.IsInf(v, 0) {
				return key, fmt.Sprintf("got %v; set it to three non-negative numbers such as [949, 50, 1]", s)
			}
			sum += v
		}
		if !(sum > 0) || math.IsInf(sum, 0) {
			return key, fmt.Sprintf("got %v; the three proportions must have a positive, finite sum", s)
		}
		return "", ""
	}
}

// checks returns the validation rules in the order they are tried.
func checks() []check {
	return []check{
		oneOf("Global.device", func(c *Config) string { return c.Global.Device }, "cpu", "gpu"),
		positive("Global.global_batch_size", func(c *Config) int { return c.Global.GlobalBatchSize }),
		positive("Global.local_batch_size", func(c *Config) int { return c.Global.LocalBatchSize }),
		positive("Global.micro_batch_size", func(c *Config) int { return c.Global.MicroBatchSize }),

		positive("Distributed.dp_degree", func(c *Config) int { return c.Distributed.DPDegree }),
		positive("Distributed.mp_degree", func(c *Config) int { return c.Distributed.MPDegree }),
		positive("Distributed.cp_degree", func(c *Config) int { return c.Distributed.CPDegree }),
		positive("Distributed.pp_degree", func(c *Config) int { return c.Distributed.PPDegree }),
		positive("Distributed.vpp_degree", func(c *Config) int { return c.Distributed.VPPDegree }),
		positive("Distributed.sharding.sharding_degree", func(c *Config) int { return c.Distributed.Sharding.ShardingDegree }),

		positive("Engine.max_steps", func(c *Config) int { return c.Engine.MaxSteps }),
		positive("Engine.logging_freq", func(c *Config) int { return c.Engine.LoggingFreq }),
		nonNegative("Engine.eval_freq", "no evaluation", func(c *Config) int { return c.Engine.EvalFreq }),
		func(c *Config) (string, string) {
			e := c.Engine
			if e.EvalFreq > 0 && (e.EvalIters < 1 || e.EvalIters > maxSize) {
				return "Engine.eval_iters", fmt.Sprintf("got %d; set it to a positive integer, or set eval_freq to 0 to disable evaluation", e.EvalIters)
			}
			if e.EvalIters < 0 || e.EvalIters > maxSize {
				return "Engine.eval_iters", fmt.Sprintf("got %d; set it to a positive integer", e.EvalIters)
			}
			return "", ""
		},
		oneOf("Engine.recompute_granularity", func(c *Config) string { return c.Engine.RecomputeGranularity }, "full", "only_attn"),
		oneOf("Engine.mix_precision.dtype", func(c *Config) string { return c.Engine.MixPrecision.Dtype }, "fp32", "bf16", "fp16"),
		func(c *Config) (string, string) {
			mp := c.Engine.MixPrecision
			if mp.UsePureFP16 != (mp.Dtype == "fp16") {
				return "Engine.mix_precision.use_pure_fp16", fmt.Sprintf(
					"%v contradicts dtype %q; use_pure_fp16 means dtype fp16, so set only one of them", mp.UsePureFP16, mp.Dtype)
			}
			return "", ""
		},
		finiteAtLeast("Engine.mix_precision.scale_loss", 0, true, func(c *Config) float64 { return c.Engine.MixPrecision.ScaleLoss }),
		oneOf("Engine.mix_precision.reduce_dtype", func(c *Config) string { return c.Engine.MixPrecision.ReduceDtype }, "fp32", "bf16"),
		func(c *Config) (string, string) {
			if mp := c.Engine.MixPrecision; mp.ReduceDtype == "bf16" && mp.Dtype != "bf16" {
				return "Engine.mix_precision.reduce_dtype", fmt.Sprintf(
					"bf16 sums the gradients as bfloat16 activations, which dtype %q does not have; set dtype to bf16, or reduce_dtype to fp32", mp.Dtype)
			}
			return "", ""
		},
		nonNegative("Engine.save_load.save_steps", "never save", func(c *Config) int { return c.Engine.SaveLoad.SaveSteps }),
		func(c *Config) (string, string) {
			if c.Engine.SaveLoad.OutputDir == "" {
				return "Engine.save_load.output_dir", "is empty; set it to the directory checkpoints go to"
			}
			return "", ""
		},
		nonNegative("Engine.save_load.keep_last", "keep every checkpoint", func(c *Config) int { return c.Engine.SaveLoad.KeepLast }),
		positive("Engine.save_load.replicas", func(c *Config) int { return c.Engine.SaveLoad.Replicas }),
		func(c *Config) (string, string) {
			if r := c.Engine.SaveLoad.Run; len(r) > 64 || strings.Trim(r, "0123456789abcdef") != "" {
				return "Engine.save_load.run", fmt.Sprintf("%q is not a run identifier; give the run of a checkpoint's manifest (up to 64 lowercase hex digits), or leave it empty", r)
			}
			return "", ""
		},

		oneOf("Model.family", func(c *Config) string { return c.Model.Family }, "gpt2", "llama"),
		positive("Model.vocab_size", func(c *Config) int { return c.Model.VocabSize }),
		positive("Model.hidden_size", func(c *Config) int { return c.Model.HiddenSize }),
		positive("Model.num_layers", func(c *Config) int { return c.Model.NumLayers }),
		positive("Model.num_attention_heads", func(c *Config) int { return c.Model.NumAttentionHeads }),
		positive("Model.ffn_hidden_size", func(c *Config) int { return c.Model.FFNHiddenSize }),
		positive("Model.max_position_embeddings", func(c *Config) int { return c.Model.MaxPositionEmbeddings }),
		divisible("Model.hidden_size", func(c *Config) int { return c.Model.HiddenSize },
			"num_attention_heads", func(c *Config) int { return c.Model.NumAttentionHeads }),
		llamaCheck,
		// The parallel layout: the one rule the engine and the planner
		// also follow.
		func(c *Config) (string, string) {
			if p := layout.Check(c.Shape(), c.Layout(), c.Batch()); p != nil {
				return p.Key, p.Msg
			}
			return "", ""
		},
		func(c *Config) (string, string) {
			m := c.Model
			if m.NumLayers > MaxLayers {
				return "Model.num_layers", fmt.Sprintf("%d exceeds the %d layers gptui supports; lower it", m.NumLayers, MaxLayers)
			}
			if n := c.Shape().ParamBound(); n > MaxElements {
				return "Model.num_layers", fmt.Sprintf("the model would have %.3g parameters, more than the %.3g gptui supports; lower Model.num_layers, hidden_size, ffn_hidden_size, vocab_size or max_position_embeddings", n, float64(MaxElements))
			}
			return "", ""
		},
		unitInterval("Model.hidden_dropout_prob", func(c *Config) float64 { return c.Model.HiddenDropoutProb }),
		unitInterval("Model.attention_probs_dropout_prob", func(c *Config) float64 { return c.Model.AttentionProbsDropoutProb }),
		finiteAtLeast("Model.initializer_range", 0, true, func(c *Config) float64 { return c.Model.InitializerRange }),

		positive("Data.Train.dataset.max_seq_len", func(c *Config) int { return c.Data.Train.Dataset.MaxSeqLen }),
		seqLenCheck("Data.Train.dataset.max_seq_len", func(c *Config) int { return c.Data.Train.Dataset.MaxSeqLen }),
		func(c *Config) (string, string) {
			m, T := c.Model, c.Data.Train.Dataset.MaxSeqLen
			if n := ActivationBound(c.Global.MicroBatchSize, T, m.NumAttentionHeads, m.HiddenSize, m.FFNHiddenSize, c.PaddedVocab()); n > MaxElements {
				return "Data.Train.dataset.max_seq_len", fmt.Sprintf("%d with Global.micro_batch_size %d needs an activation tensor of %.3g elements, more than the %.3g gptui supports; lower them", T, c.Global.MicroBatchSize, n, float64(MaxElements))
			}
			return "", ""
		},
		splitCheck("Data.Train.dataset.split", func(c *Config) [3]float64 { return c.Data.Train.Dataset.Split }),
		positive("Data.Eval.dataset.max_seq_len", func(c *Config) int { return c.Data.Eval.Dataset.MaxSeqLen }),
		seqLenCheck("Data.Eval.dataset.max_seq_len", func(c *Config) int { return c.Data.Eval.Dataset.MaxSeqLen }),
		splitCheck("Data.Eval.dataset.split", func(c *Config) [3]float64 { return c.Data.Eval.Dataset.Split }),
		func(c *Config) (string, string) {
			// The training sequence's rules are the layout's (layout.Check);
			// the evaluation's sequences are cut the same way.
			d, T := c.Distributed, c.Data.Eval.Dataset.MaxSeqLen
			if d.SequenceParallel && d.MPDegree > 0 && T%d.MPDegree != 0 {
				return "Data.Eval.dataset.max_seq_len", fmt.Sprintf("%d is not a multiple of mp_degree %d, which sequence parallelism splits each sequence into; change one of them", T, d.MPDegree)
			}
			if d.CPDegree > 1 && T%(2*d.CPDegree) != 0 {
				return "Data.Eval.dataset.max_seq_len", fmt.Sprintf("%d is not a multiple of 2 × cp_degree (%d), the chunks context parallelism cuts each sequence into; change one of them", T, 2*d.CPDegree)
			}
			if d.CPDegree > 1 && c.Model.AttentionProbsDropoutProb > 0 {
				return "Model.attention_probs_dropout_prob", fmt.Sprintf("%g: context parallelism's ring attention has no dropout; set it to 0 or cp_degree to 1", c.Model.AttentionProbsDropoutProb)
			}
			if d.CPDegree > 1 && c.Model.HiddenDropoutProb > 0 {
				return "Model.hidden_dropout_prob", fmt.Sprintf("%g: context parallelism runs without dropout; set it to 0 or cp_degree to 1", c.Model.HiddenDropoutProb)
			}
			return "", ""
		},

		unitInterval("Optimizer.weight_decay", func(c *Config) float64 { return c.Optimizer.WeightDecay }),
		unitInterval("Optimizer.beta1", func(c *Config) float64 { return c.Optimizer.Beta1 }),
		unitInterval("Optimizer.beta2", func(c *Config) float64 { return c.Optimizer.Beta2 }),
		finiteAtLeast("Optimizer.epsilon", 0, true, func(c *Config) float64 { return c.Optimizer.Epsilon }),
		finiteAtLeast("Optimizer.grad_clip.clip_norm", 0, false, func(c *Config) float64 { return c.Optimizer.GradClip.ClipNorm }),
		positive("Optimizer.lr.decay_steps", func(c *Config) int { return c.Optimizer.LR.DecaySteps }),
		unitInterval("Optimizer.lr.warmup_rate", func(c *Config) float64 { return c.Optimizer.LR.WarmupRate }),
		finiteAtLeast("Optimizer.lr.max_lr", 0, false, func(c *Config) float64 { return c.Optimizer.LR.MaxLR }),
		finiteAtLeast("Optimizer.lr.min_lr", 0, false, func(c *Config) float64 { return c.Optimizer.LR.MinLR }),
		func(c *Config) (string, string) {
			if lr := c.Optimizer.LR; lr.MinLR > lr.MaxLR {
				return "Optimizer.lr.min_lr", fmt.Sprintf("%v exceeds max_lr %v; set min_lr ≤ max_lr", lr.MinLR, lr.MaxLR)
			}
			return "", ""
		},
	}
}

// seqLenCheck checks that a sequence length fits the position embeddings.
func seqLenCheck(key string, get func(c *Config) int) check {
	return func(c *Config) (string, string) {
		if v, p := get(c), c.Model.MaxPositionEmbeddings; v > p {
			return key, fmt.Sprintf("%d exceeds Model.max_position_embeddings (%d); lower it or raise max_position_embeddings", v, p)
		}
		return "", ""
	}
}

// llamaCheck checks the Llama family's keys: for a Llama, key/value heads
// dividing the heads, an even head size (rotary embeddings turn pairs of
// channels), positive finite rms_norm_eps and rope_theta, and a rope
// scaling of a known type with usable factors; for a GPT-2, that none of
// them asks for what GPT-2 does not have.
func llamaCheck(c *Config) (string, string) {
	m := c.Model
	if !m.Llama() {
		const gpt2 = "; drop the key, or set Model.family to llama"
		switch rs := m.RopeScaling; {
		case m.NumKeyValueHeads != m.NumAttentionHeads:
			return "Model.num_key_value_heads", fmt.Sprintf("%d: a GPT-2 has as many key/value heads as attention heads (%d)%s", m.NumKeyValueHeads, m.NumAttentionHeads, gpt2)
		case !m.TieWordEmbeddings:
			return "Model.tie_word_embeddings", "false: a GPT-2's head is its token embedding" + gpt2
		case m.RMSNormEps != 0:
			return "Model.rms_norm_eps", "a GPT-2 has LayerNorm, not RMSNorm" + gpt2
		case m.RopeTheta != 0 || rs.RopeType != "default" || rs.Factor != 0 || rs.LowFreqFactor != 0 || rs.HighFreqFactor != 0 || rs.OriginalMaxPositionEmbeddings != 0:
			return "Model.rope_theta", "a GPT-2 has learned position embeddings, not rotary ones: no rope_theta or rope_scaling" + gpt2
		}
		return "", ""
	}
	nh, nkv := m.NumAttentionHeads, m.NumKeyValueHeads
	switch {
	case nkv < 1 || nkv > maxSize:
		return "Model.num_key_value_heads", fmt.Sprintf("got %d; set it to a positive divisor of num_attention_heads (%d)", nkv, nh)
	case nh%nkv != 0:
		return "Model.num_key_value_heads", fmt.Sprintf("%d does not divide num_attention_heads (%d); set it to a divisor", nkv, nh)
	case (m.HiddenSize/nh)%2 != 0:
		return "Model.hidden_size", fmt.Sprintf("%d / num_attention_heads %d = head size %d: rotary embeddings need an even head size; change one of them", m.HiddenSize, nh, m.HiddenSize/nh)
	}
	for _, f := range []struct {
		key string
		v   float64
	}{{"Model.rms_norm_eps", m.RMSNormEps}, {"Model.rope_theta", m.RopeTheta}} {
		if !(f.v > 0) || math.IsInf(f.v, 0) {
			return f.key, fmt.Sprintf("got %v; set it to a finite number > 0", f.v)
		}
	}
	rs := m.RopeScaling
	switch rs.RopeType {
	case "default":
		return "", ""
	case "llama3":
	default:
		return "Model.rope_scaling.rope_type", fmt.Sprintf("got %q; set it to default (no scaling) or llama3 (Llama 3.1's)", rs.RopeType)
	}
	switch {
	case !(rs.Factor > 0) || math.IsInf(rs.Factor, 0):
		return "Model.rope_scaling.factor", fmt.Sprintf("got %v; set it to a finite number > 0 (8 in Llama 3.1)", rs.Factor)
	case !(rs.LowFreqFactor > 0) || math.IsInf(rs.LowFreqFactor, 0):
		return "Model.rope_scaling.low_freq_factor", fmt.Sprintf("got %v; set it to a finite number > 0 (1 in Llama 3.1)", rs.LowFreqFactor)
	case !(rs.HighFreqFactor > rs.LowFreqFactor) || math.IsInf(rs.HighFreqFactor, 0):
		return "Model.rope_scaling.high_freq_factor", fmt.Sprintf("got %v; set it to a finite number above low_freq_factor %v (4 in Llama 3.1)", rs.HighFreqFactor, rs.LowFreqFactor)
	case rs.OriginalMaxPositionEmbeddings < 1 || rs.OriginalMaxPositionEmbeddings > maxSize:
		return "Model.rope_scaling.original_max_position_embeddings", fmt.Sprintf("got %d; set it to a positive number of positions (8192 in Llama 3.1)", rs.OriginalMaxPositionEmbeddings)
	}
	return "", ""
}
