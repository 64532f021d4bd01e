package planner

import (
	"fmt"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/internal/units"

	"github.com/gptui/gptui/presets"
)

// Model is the shape of the network (GPT-2 or Llama: Shape.Family) and
// the batch a plan is for.
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
// holds and computes: its share of the key/value heads, or, when tp
// exceeds them, the one head its query heads share, replicated on
// tp/NKV ranks (the engine's split, engine.PartTensors). GPT-2: C/tp.
func (m Model) kvWidthTP(tp int) int64 {
	if !m.llama() {
		return int64(m.C / tp)
	}
	nkv, hd := m.KVHeads(), int64(m.C/m.NH)
	if tp > nkv {
		return hd
	}
	return int64(nkv/tp) * hd
}

// kvCopies is how many ranks of a tensor-parallel group of tp hold each
// key/value head alike: tp/NKV for a Llama whose key/value heads tp
// exceeds, else 1.
func (m Model) kvCopies(tp int) int {
	if m.llama() && tp > m.KVHeads() {
		return tp / m.KVHeads()
	}
	return 1
}

// layerMatmulTP is one block's matrix parameters on one of tp
// tensor-parallel ranks: what its forward multiplies touch, 2 FLOPs each
// per row. GPT-2: (4C² + 2CF)/tp. Llama: q, k and v (C·(C/tp + 2·kv
// width)), o_proj (C²/tp), gate, up and down (3CF/tp).
func (m Model) layerMatmulTP(tp int) int64 {
	C, F, t := int64(m.C), int64(m.F), int64(tp)
	if m.llama() {
		return C*(C/t+2*m.kvWidthTP(tp)) + C*C/t + 3*C*F/t
	}
	return (4*C*C + 2*C*F) / t
}

// layerParamsTP is one block's parameters on one of tp tensor-parallel
// ranks: the matrices (layerMatmulTP) and, in GPT-2, the biases of the
// column-split layers divided; the norms and the row-split layers'
// biases replicated (GPT-2: 6C; Llama: its two RMSNorms' 2C, no biases).
func (m Model) layerParamsTP(tp int) int64 {
	C, F, t := int64(m.C), int64(m.F), int64(tp)
	if m.llama() {
		return m.layerMatmulTP(tp) + 2*C
	}
	return m.layerMatmulTP(tp) + (3*C+F)/t + 6*C
}

// embedParams is what the first pipeline stage holds beside its blocks:
// its rows of the token embedding (Vp·C/tp) and GPT-2's position
// embedding (MaxT·C).
func (m Model) embedParams(tp int) int64 {
	n := int64(m.Vp) * int64(m.C) / int64(tp)
	if !m.llama() {
		n += int64(m.MaxT) * int64(m.C)
	}
	return n
}

// headParams is what the last of pp pipeline stages holds beside its
// blocks: the final norm (GPT-2's LayerNorm 2C, Llama's RMSNorm C) and
// the head's rows of the vocabulary (Vp·C/tp) when it is its own matrix —
// an untied Llama's lm_head, or the tied embedding's copy on a stage
// that is not the first.
func (m Model) headParams(tp, pp int) int64 {
	C := int64(m.C)
	n := 2 * C
	if m.llama() {
		n = C
	}
	if !m.Tied() || pp > 1 {
		n += int64(m.Vp) * C / int64(tp)
	}
	return n
}
