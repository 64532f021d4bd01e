package planner

import (
	"fmt"

	"github.com/gptui/gptui/layout"
	"github.com/gptui/gptui/presets"
)

// Model is the shape of the GPT-2 network and the batch a plan is for.
type Model struct {
	Layers      int    // transformer blocks, L
	Hidden      int    // hidden size, h (C)
	Heads       int    // attention heads, a
	FFN         int    // MLP hidden size, F
	Vocab       int    // real vocabulary, V
	PaddedVocab int    // rows of the embedding table, Vp
	Positions   int    // rows of the position embedding
	SeqLen      int    // sequence length, s
	GlobalBatch int    // sequences per optimizer step
	Dtype       string // "fp32", "fp16" or "bf16"
}

// ModelOf returns the model and batch of cfg.
func ModelOf(cfg *presets.Config) Model {
	m := cfg.Model
	return Model{
		Layers: m.NumLayers, Hidden: m.HiddenSize, Heads: m.NumAttentionHeads, FFN: m.FFNHiddenSize,
		Vocab: m.VocabSize, PaddedVocab: cfg.PaddedVocab(), Positions: m.MaxPositionEmbeddings,
		SeqLen: cfg.Data.Train.Dataset.MaxSeqLen, GlobalBatch: cfg.Global.GlobalBatchSize,
		Dtype: cfg.Engine.MixPrecision.Dtype,
	}
}

// layout is m as the layout rule reads it.
func (m Model) layout() layout.Model {
	return layout.Model{Layers: m.Layers, Heads: m.Heads, FFN: m.FFN, PaddedVocab: m.PaddedVocab}
}

// String describes the model in one line.
func (m Model) String() string {
	return fmt.Sprintf("GPT %s params (layers %d, hidden %d, heads %d, ffn %d, vocab %d), seq %d, global batch %d, %s",
		humanCount(float64(m.Params())), m.Layers, m.Hidden, m.Heads, m.FFN, m.PaddedVocab, m.SeqLen, m.GlobalBatch, m.Dtype)
}

// layerParams is the parameter count of one transformer block: ln1 and ln2
// (2h each), qkv (3h² + 3h), attention projection (h² + h), fc (hF + F) and
// fc projection (Fh + h).
func (m Model) layerParams() int64 {
	C, F := int64(m.Hidden), int64(m.FFN)
	return 4*C*C + 2*C*F + 9*C + F
}

// layerParamsTP is one block's parameters on one of tp tensor-parallel
// ranks: the matrices and the biases of the column-split layers divided,
// the LayerNorms and the row-split layers' biases replicated.
func (m Model) layerParamsTP(tp int) int64 {
	C, F, t := int64(m.Hidden), int64(m.FFN), int64(tp)
	return (4*C*C+2*C*F+3*C+F)/t + 6*C
}

// Params counts every parameter as the engine allocates them: the padded
// embedding table, the position embedding, the blocks and the final
// LayerNorm.
func (m Model) Params() int64 {
	C := int64(m.Hidden)
	return int64(m.PaddedVocab)*C + int64(m.Positions)*C + int64(m.Layers)*m.layerParams() + 2*C
}

// FLOPsPerToken is the model FLOPs of one trained token, the engine's MFU
// numerator: 6·N for the matrix multiplies of forward and backward (N: the
// parameters but the position embedding and the padded vocabulary rows)
// plus 6·L·h·s for attention's scores and weighted sums.
func (m Model) FLOPsPerToken() float64 {
	N := m.Params() - int64(m.Positions*m.Hidden) - int64((m.PaddedVocab-m.Vocab)*m.Hidden)
	return 6*float64(N) + 6*float64(m.Layers)*float64(m.Hidden)*float64(m.SeqLen)
}

// humanCount writes n as 355M or 1.3B.
func humanCount(n float64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1fB", n/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.0fM", n/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.0fK", n/1e3)
	}
	return fmt.Sprintf("%.0f", n)
}
