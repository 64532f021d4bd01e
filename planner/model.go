package planner

import (
	"fmt"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/units"

	"github.com/gptui/gptui/presets"
)

// Model is the shape of the network (GPT-2 or Llama: Shape.Family) and
// the batch a plan is for.
type Model struct {
	arch.Shape         // the network's sizes
	SeqLen      int    // sequence length, s
	GlobalBatch int    // sequences per optimizer step
	Dtype       string // "fp32", "fp16" or "bf16"
	// ReduceBF16 is Engine.mix_precision.reduce_dtype bf16: data
	// parallelism and sharding stage 1 sum the gradients in bfloat16, in
	// a bfloat16 copy of them (2 bytes a parameter on a GPU, 4 on the
	// CPU, whose bfloat16 activations are float32s), with half the bytes
	// on NCCL (the TCP ring moves the CPU's float32s).
	ReduceBF16 bool
	// Dropout is whether the model trains with dropout (hidden or
	// attention): context parallelism runs without it, and the config
	// refuses cp_degree > 1 with it. AttnDropout is the attention's alone,
	// which the GPU's tensor-core attention does not draw (flash);
	// HiddenDropout the residual branches' and the embedding's, whose
	// backward needs a buffer of its own (the engine's scratch dy).
	Dropout, AttnDropout, HiddenDropout bool
}

// ModelOf returns the model and batch of cfg.
func ModelOf(cfg *presets.Config) Model {
	return Model{Shape: cfg.Shape(), SeqLen: cfg.Data.Train.Dataset.MaxSeqLen, GlobalBatch: cfg.Global.GlobalBatchSize,
		Dtype: cfg.Engine.MixPrecision.Dtype, ReduceBF16: cfg.Engine.MixPrecision.ReduceDtype == "bf16", Dropout: cfg.Model.HiddenDropoutProb > 0 || cfg.Model.AttentionProbsDropoutProb > 0,
		AttnDropout: cfg.Model.AttentionProbsDropoutProb > 0, HiddenDropout: cfg.Model.HiddenDropoutProb > 0}
}

// String describes the model in one line.
func (m Model) String() string {
	if m.llama() {
		head := "tied"
		if !m.Tied() {
			head = "untied"
		}
		return fmt.Sprintf("Llama %s params (layers %d, hidden %d, heads %d, kv heads %d, ffn %d, vocab %d, %s), seq %d, global batch %d, %s",
			units.Params(float64(m.Params())), m.L, m.C, m.NH, m.KVHeads(), m.F, m.Vp, head, m.SeqLen, m.GlobalBatch, m.Dtype)
	}
	return fmt.Sprintf("GPT %s params (layers %d, hidden %d, heads %d, ffn %d, vocab %d), seq %d, global batch %d, %s",
		units.Params(float64(m.Params())), m.L, m.C, m.NH, m.F, m.Vp, m.SeqLen, m.GlobalBatch, m.Dtype)
}

func (m Model) llama() bool { return m.Family == arch.Llama }

// kvWidthTP is the key (or value) columns one of tp tensor-parallel ranks
// holds and computes (arch's [arch.Shape.KVWidth]).
func (m Model) kvWidthTP(tp int) int64 { return int64(m.KVWidth(tp)) }

// kvCopies is how many ranks of a tensor-parallel group of tp hold each
// key/value head alike (arch's [arch.Shape.KVCopies]).
func (m Model) kvCopies(tp int) int { return m.KVCopies(tp) }

// layerMatmulTP is one block's matrix parameters on one of tp
// tensor-parallel ranks: what its forward multiplies touch, 2 FLOPs each
// per row (arch's [arch.Shape.LayerMatmulParams]).
func (m Model) layerMatmulTP(tp int) int64 { return m.LayerMatmulParams(tp) }

// layerParamsTP is one block's parameters on one of tp tensor-parallel
// ranks: arch's account of the block's tensors ([arch.Shape.Tensors]),
// the matrices and the column-split layers' biases divided, the norms and
// the row-split layers' biases replicated.
func (m Model) layerParamsTP(tp int) int64 {
	return m.PartParams(arch.Part{MP: tp, Layers: 1})
}
