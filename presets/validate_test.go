package presets

import (
	"math"
	"path/filepath"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *Config)
		key    string // "" means valid
	}{
		{"valid", func(c *Config) {}, ""},
		{"device", func(c *Config) { c.Global.Device = "tpu" }, "Global.device"},
		{"global batch positive", func(c *Config) { c.Global.GlobalBatchSize = 0 }, "Global.global_batch_size"},
		{"local batch positive", func(c *Config) { c.Global.LocalBatchSize = -8 }, "Global.local_batch_size"},
		{"micro batch positive", func(c *Config) { c.Global.MicroBatchSize = 0 }, "Global.micro_batch_size"},
		{"batch too large", func(c *Config) { c.Global.LocalBatchSize = math.MaxInt }, "Global.local_batch_size"},
		{"global = local × dp × sharding", func(c *Config) { c.Distributed.DPDegree = 2 }, "Global.global_batch_size"},
		{"global with sharding", func(c *Config) {
			c.Distributed.Sharding.ShardingDegree = 4
			c.Global.GlobalBatchSize = 32
		}, ""},
		{"local % micro", func(c *Config) { c.Global.MicroBatchSize = 3 }, "Global.local_batch_size"},
		{"dp degree", func(c *Config) { c.Distributed.DPDegree = 0 }, "Distributed.dp_degree"},
		{"mp degree", func(c *Config) { c.Distributed.MPDegree = -1 }, "Distributed.mp_degree"},
		{"pp degree", func(c *Config) { c.Distributed.PPDegree = 0 }, "Distributed.pp_degree"},
		{"sharding degree", func(c *Config) { c.Distributed.Sharding.ShardingDegree = 0 }, "Distributed.sharding.sharding_degree"},
		{"sharding stage 0", func(c *Config) { c.Distributed.Sharding.ShardingStage = 0 }, "Distributed.sharding.sharding_stage"},
		{"sharding stage 4", func(c *Config) { c.Distributed.Sharding.ShardingStage = 4 }, "Distributed.sharding.sharding_stage"},
		{"sharding stage 3", func(c *Config) { c.Distributed.Sharding.ShardingStage = 3 }, ""},
		{"max steps", func(c *Config) { c.Engine.MaxSteps = 0 }, "Engine.max_steps"},
		{"logging freq", func(c *Config) { c.Engine.LoggingFreq = 0 }, "Engine.logging_freq"},
		{"eval freq", func(c *Config) { c.Engine.EvalFreq = -1 }, "Engine.eval_freq"},
		{"eval iters", func(c *Config) { c.Engine.EvalIters = 0 }, "Engine.eval_iters"},
		{"eval iters unused", func(c *Config) { c.Engine.EvalFreq, c.Engine.EvalIters = 0, 0 }, ""},
		{"recompute granularity", func(c *Config) { c.Engine.RecomputeGranularity = "some" }, "Engine.recompute_granularity"},
		{"only_attn", func(c *Config) { c.Engine.RecomputeGranularity = "only_attn" }, ""},
		{"dtype", func(c *Config) { c.Engine.MixPrecision.Dtype = "fp8" }, "Engine.mix_precision.dtype"},
		{"bf16", func(c *Config) { c.Engine.MixPrecision.Dtype = "bf16" }, ""},
		{"pure fp16 mismatch", func(c *Config) { c.Engine.MixPrecision.UsePureFP16 = true }, "Engine.mix_precision.use_pure_fp16"},
		{"fp16", func(c *Config) { c.Engine.MixPrecision.Dtype, c.Engine.MixPrecision.UsePureFP16 = "fp16", true }, ""},
		{"scale loss", func(c *Config) { c.Engine.MixPrecision.ScaleLoss = 0 }, "Engine.mix_precision.scale_loss"},
		{"save steps", func(c *Config) { c.Engine.SaveLoad.SaveSteps = -1 }, "Engine.save_load.save_steps"},
		{"output dir", func(c *Config) { c.Engine.SaveLoad.OutputDir = "" }, "Engine.save_load.output_dir"},
		{"keep last", func(c *Config) { c.Engine.SaveLoad.KeepLast = -1 }, "Engine.save_load.keep_last"},
		{"keep all", func(c *Config) { c.Engine.SaveLoad.KeepLast = 0 }, ""},
		{"vocab", func(c *Config) { c.Model.VocabSize = 0 }, "Model.vocab_size"},
		{"hidden", func(c *Config) { c.Model.HiddenSize = 0 }, "Model.hidden_size"},
		{"layers", func(c *Config) { c.Model.NumLayers = 0 }, "Model.num_layers"},
		{"heads", func(c *Config) { c.Model.NumAttentionHeads = 0 }, "Model.num_attention_heads"},
		{"ffn", func(c *Config) { c.Model.FFNHiddenSize = -1 }, "Model.ffn_hidden_size"},
		{"positions", func(c *Config) { c.Model.MaxPositionEmbeddings = 0 }, "Model.max_position_embeddings"},
		{"hidden % heads", func(c *Config) { c.Model.NumAttentionHeads = 3 }, "Model.hidden_size"},
		{"layers over the cap", func(c *Config) { c.Model.NumLayers = MaxLayers + 1 }, "Model.num_layers"},
		{"layers at the cap", func(c *Config) { c.Model.NumLayers = MaxLayers }, ""},
		{"parameters over the cap", func(c *Config) { c.Model.HiddenSize, c.Model.FFNHiddenSize = 1<<20, 1<<22 }, "Model.num_layers"},
		{"1e9 positions", func(c *Config) {
			c.Model.MaxPositionEmbeddings, c.Data.Train.Dataset.MaxSeqLen = 1e9, 1e9
		}, "Data.Train.dataset.max_seq_len"},
		{"1e6 positions, 1e5 tokens", func(c *Config) { c.Model.MaxPositionEmbeddings, c.Data.Train.Dataset.MaxSeqLen = 1e6, 1e5 }, ""},
		{"heads % mp", func(c *Config) { c.Distributed.MPDegree = 3 }, "Model.num_attention_heads"},
		{"layers % pp", func(c *Config) { c.Distributed.PPDegree = 3 }, "Model.num_layers"},
		{"hidden dropout 1", func(c *Config) { c.Model.HiddenDropoutProb = 1 }, "Model.hidden_dropout_prob"},
		{"attention dropout negative", func(c *Config) { c.Model.AttentionProbsDropoutProb = -0.1 }, "Model.attention_probs_dropout_prob"},
		{"dropout NaN", func(c *Config) { c.Model.HiddenDropoutProb = math.NaN() }, "Model.hidden_dropout_prob"},
		{"initializer range", func(c *Config) { c.Model.InitializerRange = 0 }, "Model.initializer_range"},
		{"seq len positive", func(c *Config) { c.Data.Train.Dataset.MaxSeqLen = 0 }, "Data.Train.dataset.max_seq_len"},
		{"seq len ≤ positions", func(c *Config) { c.Data.Train.Dataset.MaxSeqLen = 257 }, "Data.Train.dataset.max_seq_len"},
		{"eval seq len ≤ positions", func(c *Config) { c.Data.Eval.Dataset.MaxSeqLen = 1024 }, "Data.Eval.dataset.max_seq_len"},
		{"split negative", func(c *Config) { c.Data.Train.Dataset.Split = [3]float64{1, -1, 0} }, "Data.Train.dataset.split"},
		{"split zero sum", func(c *Config) { c.Data.Eval.Dataset.Split = [3]float64{} }, "Data.Eval.dataset.split"},
		{"split infinite", func(c *Config) { c.Data.Train.Dataset.Split = [3]float64{math.Inf(1), 0, 0} }, "Data.Train.dataset.split"},
		{"weight decay", func(c *Config) { c.Optimizer.WeightDecay = -0.01 }, "Optimizer.weight_decay"},
		{"beta1", func(c *Config) { c.Optimizer.Beta1 = 1 }, "Optimizer.beta1"},
		{"beta2", func(c *Config) { c.Optimizer.Beta2 = -0.5 }, "Optimizer.beta2"},
		{"epsilon", func(c *Config) { c.Optimizer.Epsilon = 0 }, "Optimizer.epsilon"},
		{"clip norm", func(c *Config) { c.Optimizer.GradClip.ClipNorm = -1 }, "Optimizer.grad_clip.clip_norm"},
		{"decay steps", func(c *Config) { c.Optimizer.LR.DecaySteps = 0 }, "Optimizer.lr.decay_steps"},
		{"warmup rate", func(c *Config) { c.Optimizer.LR.WarmupRate = 1 }, "Optimizer.lr.warmup_rate"},
		{"max lr", func(c *Config) { c.Optimizer.LR.MaxLR = -1 }, "Optimizer.lr.max_lr"},
		{"max lr infinite", func(c *Config) { c.Optimizer.LR.MaxLR = math.Inf(1) }, "Optimizer.lr.max_lr"},
		{"min lr", func(c *Config) { c.Optimizer.LR.MinLR = -1e-5 }, "Optimizer.lr.min_lr"},
		{"min ≤ max", func(c *Config) { c.Optimizer.LR.MinLR = 2e-3 }, "Optimizer.lr.min_lr"},
		{"min = max", func(c *Config) { c.Optimizer.LR.MinLR = c.Optimizer.LR.MaxLR }, ""},
	}
	base, err := Load("tiny", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := *base
			tt.mutate(&c)
			err := c.Validate()
			if tt.key == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate succeeded")
			}
			e := asError(t, err)
			if e.Key != tt.key || e.Msg == "" || strings.Contains(e.Error(), "\n") {
				t.Errorf("got %q, want a one-line error on %s", err, tt.key)
			}
		})
	}
}

// TestValidateErrorPosition checks that validation errors of loaded files
// point at the line that set the offending key.
func TestValidateErrorPosition(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"c.yaml": "_base_: tiny\nOptimizer:\n  lr:\n    max_lr: 1.0e-3\n    min_lr: 1.0e-2\n",
	})
	file := filepath.Join(dir, "c.yaml")
	_, err := Load(file, nil)
	e := asError(t, err)
	if e.File != file || e.Line != 5 || e.Key != "Optimizer.lr.min_lr" || !strings.Contains(e.Msg, "set min_lr ≤ max_lr") {
		t.Errorf("got %v", err)
	}
	// The same error from an override names the override.
	_, err = Load("tiny", []string{"Optimizer.lr.min_lr=0.5"})
	if e := asError(t, err); e.File != `override "Optimizer.lr.min_lr=0.5"` || e.Key != "Optimizer.lr.min_lr" {
		t.Errorf("got %v", err)
	}
}
