package presets

import "strings"

// Default values of keys that are left unset. Batch sizes, the data split
// of Data.Eval, ffn_hidden_size, scale_loss, min_lr and decay_steps are
// derived from other keys instead; see applyDefaults.
const (
	defaultSeed             = 1234
	defaultDevice           = "cpu"
	defaultLocalBatchSize   = 8
	defaultMaxSteps         = 1000
	defaultLoggingFreq      = 1
	defaultEvalIters        = 10
	defaultLogDir           = "log"
	defaultGranularity      = "full"
	defaultOutputDir        = "output"
	defaultKeepLast         = 3
	defaultFP16ScaleLoss    = 32768
	defaultVocabSize        = 50257
	defaultDropout          = 0.1
	defaultMaxPositions     = 1024
	defaultInitializerRange = 0.02
	defaultMaxSeqLen        = 1024
	defaultWeightDecay      = 0.01
	defaultBeta1            = 0.9
	defaultBeta2            = 0.999
	defaultEpsilon          = 1e-8
	defaultClipNorm         = 1.0
	defaultWarmupRate       = 0.01
	defaultMaxLR            = 1e-4
	defaultRMSNormEps       = 1e-6
	defaultRopeTheta        = 10000
)

// llamaFFN is Meta's Llama intermediate size for hidden size c: 2/3 of
// 4c, rounded up to a multiple of 256 (0 for c ≤ 0 or too large).
func llamaFFN(c int) int {
	f := mulPositive(8, c) / 3
	if f <= 0 || f > maxInt-256 {
		return 0
	}
	return (f + 255) / 256 * 256
}

// defaultSplit is the PaddleFleetX train/validation/test split.
func defaultSplit() [3]float64 { return [3]float64{949, 50, 1} }

// normalizeDtype maps the PaddleFleetX dtype spellings to gptui's.
func normalizeDtype(s string) string {
	switch strings.ToLower(s) {
	case "float32", "fp32":
		return "fp32"
	case "bfloat16", "bf16":
		return "bf16"
	case "float16", "fp16":
		return "fp16"
	}
	return s
}

// mulPositive returns a*b when both are positive and the product does not
// overflow, and 0 otherwise.
func mulPositive(a, b int) int {
	if a <= 0 || b <= 0 || a > maxInt/b {
		return 0
	}
	return a * b
}

const maxInt = int(^uint(0) >> 1)

// applyDefaults fills every key of c not in set with its default.
func applyDefaults(c *Config, set map[string]pos) {
	unset := func(path string) bool { _, ok := set[path]; return !ok }
	intDef := func(path string, p *int, v int) {
		if unset(path) {
			*p = v
		}
	}
	floatDef := func(path string, p *float64, v float64) {
		if unset(path) {
			*p = v
		}
	}
	strDef := func(path string, p *string, v string) {
		if unset(path) {
			*p = v
		}
	}

	g := &c.Global
	if unset("Global.seed") {
		g.Seed = defaultSeed
	}
	strDef("Global.device", &g.Device, defaultDevice)

	d := &c.Distributed
	intDef("Distributed.dp_degree", &d.DPDegree, 1)
	intDef("Distributed.mp_degree", &d.MPDegree, 1)
	intDef("Distributed.cp_degree", &d.CPDegree, 1)
	intDef("Distributed.pp_degree", &d.PPDegree, 1)
	intDef("Distributed.vpp_degree", &d.VPPDegree, 1)
	if unset("Distributed.pp_schedule") {
		d.PPSchedule = "1f1b"
		if d.VPPDegree > 1 {
			d.PPSchedule = "interleaved"
		}
	}
	intDef("Distributed.sharding.sharding_degree", &d.Sharding.ShardingDegree, 1)
	intDef("Distributed.sharding.sharding_stage", &d.Sharding.ShardingStage, 1)

	// Batch sizes: global = local × dp × sharding, local = k × micro.
	ranks := mulPositive(d.DPDegree, d.Sharding.ShardingDegree)
	if unset("Global.local_batch_size") {
		switch {
		case !unset("Global.global_batch_size") && ranks > 0:
			g.LocalBatchSize = g.GlobalBatchSize / ranks
		case !unset("Global.micro_batch_size"):
			g.LocalBatchSize = g.MicroBatchSize
		default:
			g.LocalBatchSize = defaultLocalBatchSize
		}
	}
	intDef("Global.micro_batch_size", &g.MicroBatchSize, g.LocalBatchSize)
	intDef("Global.global_batch_size", &g.GlobalBatchSize, mulPositive(g.LocalBatchSize, ranks))

	e := &c.Engine
	intDef("Engine.max_steps", &e.MaxSteps, defaultMaxSteps)
	intDef("Engine.logging_freq", &e.LoggingFreq, defaultLoggingFreq)
	intDef("Engine.eval_freq", &e.EvalFreq, 0)
	intDef("Engine.eval_iters", &e.EvalIters, defaultEvalIters)
	strDef("Engine.log_dir", &e.LogDir, defaultLogDir)
	strDef("Engine.recompute_granularity", &e.RecomputeGranularity, defaultGranularity)
	mp := &e.MixPrecision
	if unset("Engine.mix_precision.dtype") {
		// fp32 on CPU; on a GPU bf16 (fp32 master weights), unless the
		// seeds' use_pure_fp16 asks for fp16.
		mp.Dtype = "fp32"
		if g.Device == "gpu" {
			mp.Dtype = "bf16"
		}
		if mp.UsePureFP16 {
			mp.Dtype = "fp16"
		}
	} else {
		mp.Dtype = normalizeDtype(mp.Dtype)
	}
	if unset("Engine.mix_precision.use_pure_fp16") {
		mp.UsePureFP16 = mp.Dtype == "fp16"
	}
	if unset("Engine.mix_precision.reduce_dtype") {
		mp.ReduceDtype = "fp32"
	} else {
		mp.ReduceDtype = normalizeDtype(mp.ReduceDtype)
	}
	if unset("Engine.mix_precision.scale_loss") {
		mp.ScaleLoss = 1
		if mp.Dtype == "fp16" {
			mp.ScaleLoss = defaultFP16ScaleLoss
		}
	}
	sl := &e.SaveLoad
	intDef("Engine.save_load.save_steps", &sl.SaveSteps, 0)
	strDef("Engine.save_load.output_dir", &sl.OutputDir, defaultOutputDir)
	intDef("Engine.save_load.keep_last", &sl.KeepLast, defaultKeepLast)
	intDef("Engine.save_load.replicas", &sl.Replicas, 1)

	m := &c.Model
	strDef("Model.family", &m.Family, "gpt2")
	intDef("Model.vocab_size", &m.VocabSize, defaultVocabSize)
	if m.Llama() {
		// Llama's own defaults: Hugging Face LlamaConfig's, no dropout,
		// and Meta's intermediate size, 2/3 of 4·hidden_size rounded up
		// to a multiple of 256 (2048 for hidden_size 768).
		intDef("Model.ffn_hidden_size", &m.FFNHiddenSize, llamaFFN(m.HiddenSize))
		floatDef("Model.hidden_dropout_prob", &m.HiddenDropoutProb, 0)
		floatDef("Model.attention_probs_dropout_prob", &m.AttentionProbsDropoutProb, 0)
		intDef("Model.num_key_value_heads", &m.NumKeyValueHeads, m.NumAttentionHeads)
		floatDef("Model.rms_norm_eps", &m.RMSNormEps, defaultRMSNormEps)
		floatDef("Model.rope_theta", &m.RopeTheta, defaultRopeTheta)
		rs := &m.RopeScaling
		strDef("Model.rope_scaling.rope_type", &rs.RopeType, "default")
		floatDef("Model.rope_scaling.factor", &rs.Factor, 8)
		floatDef("Model.rope_scaling.low_freq_factor", &rs.LowFreqFactor, 1)
		floatDef("Model.rope_scaling.high_freq_factor", &rs.HighFreqFactor, 4)
		intDef("Model.rope_scaling.original_max_position_embeddings", &rs.OriginalMaxPositionEmbeddings, 8192)
	} else {
		// GPT-2: the Llama keys describe it too, as their values for it,
		// so that a check of them never needs to know the family.
		intDef("Model.ffn_hidden_size", &m.FFNHiddenSize, mulPositive(4, m.HiddenSize))
		floatDef("Model.hidden_dropout_prob", &m.HiddenDropoutProb, defaultDropout)
		floatDef("Model.attention_probs_dropout_prob", &m.AttentionProbsDropoutProb, defaultDropout)
		intDef("Model.num_key_value_heads", &m.NumKeyValueHeads, m.NumAttentionHeads)
		strDef("Model.rope_scaling.rope_type", &m.RopeScaling.RopeType, "default")
		if unset("Model.tie_word_embeddings") {
			m.TieWordEmbeddings = true
		}
	}
	intDef("Model.max_position_embeddings", &m.MaxPositionEmbeddings, defaultMaxPositions)
	floatDef("Model.initializer_range", &m.InitializerRange, defaultInitializerRange)

	train, eval := &c.Data.Train.Dataset, &c.Data.Eval.Dataset
	if unset("Data.Train.dataset.split") {
		train.Split = defaultSplit()
	}
	intDef("Data.Train.dataset.max_seq_len", &train.MaxSeqLen, defaultMaxSeqLen)
	if unset("Data.Train.dataset.shuffle") {
		train.Shuffle = true
	}
	// Data.Eval.dataset inherits, key by key, from Data.Train.dataset.
	strDef("Data.Eval.dataset.input_dir", &eval.InputDir, train.InputDir)
	if unset("Data.Eval.dataset.split") {
		eval.Split = train.Split
	}
	intDef("Data.Eval.dataset.max_seq_len", &eval.MaxSeqLen, train.MaxSeqLen)
	if unset("Data.Eval.dataset.shuffle") {
		eval.Shuffle = train.Shuffle
	}

	o := &c.Optimizer
	floatDef("Optimizer.weight_decay", &o.WeightDecay, defaultWeightDecay)
	floatDef("Optimizer.beta1", &o.Beta1, defaultBeta1)
	floatDef("Optimizer.beta2", &o.Beta2, defaultBeta2)
	floatDef("Optimizer.epsilon", &o.Epsilon, defaultEpsilon)
	floatDef("Optimizer.grad_clip.clip_norm", &o.GradClip.ClipNorm, defaultClipNorm)
	intDef("Optimizer.lr.decay_steps", &o.LR.DecaySteps, e.MaxSteps)
	floatDef("Optimizer.lr.warmup_rate", &o.LR.WarmupRate, defaultWarmupRate)
	floatDef("Optimizer.lr.max_lr", &o.LR.MaxLR, defaultMaxLR)
	floatDef("Optimizer.lr.min_lr", &o.LR.MinLR, o.LR.MaxLR/10)
	c.defaulted = defaultedKeys(c, unset)
	for key, from := range scheduleDerived {
		if unset(key) {
			if c.derived == nil {
				c.derived = map[string]string{}
			}
			c.derived[key] = from
		}
	}
}

// scheduleDerived maps the lr schedule's keys that other keys derive,
// when they are left unset, to what derives them (see Config.DerivedFrom).
var scheduleDerived = map[string]string{
	"Optimizer.lr.decay_steps": "Engine.max_steps",
	"Optimizer.lr.min_lr":      "Optimizer.lr.max_lr / 10",
}
