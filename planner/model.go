package planner

import (
	"fmt"
	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/internal/units"

	"github.com/gptui/gptui/presets"
)

// Model is the shape of the GPT-2 network and the batch a plan is for.
type Model struct {
	arch.Shape         // the network's sizes
	SeqLen      int    // sequence length, s
	GlobalBatch int    // sequences per optimizer step
	Dtype       string // "fp32", "fp16" or "bf16"
}

// ModelOf returns the model and batch of cfg.
func ModelOf(cfg *presets.Config) Model {
	return Model{Shape: cfg.Shape(), SeqLen: cfg.Data.Train.Dataset.MaxSeqLen, GlobalBatch: cfg.Global.GlobalBatchSize,
		Dtype: cfg.Engine.MixPrecision.Dtype}
}

// String describes the model in one line.
func (m Model) String() string {
	return fmt.Sprintf("GPT %s params (layers %d, hidden %d, heads %d, ffn %d, vocab %d), seq %d, global batch %d, %s",
		units.Params(float64(m.Params())), m.L, m.C, m.NH, m.F, m.Vp, m.SeqLen, m.GlobalBatch, m.Dtype)
}

// layerParamsTP is one block's parameters on one of tp tensor-parallel
// ranks: the matrices and the biases of the column-split layers divided,
// the LayerNorms and the row-split layers' biases replicated.
func (m Model) layerParamsTP(tp int) int64 {
	C, F, t := int64(m.C), int64(m.F), int64(tp)
	return (4*C*C+2*C*F+3*C+F)/t + 6*C
}
