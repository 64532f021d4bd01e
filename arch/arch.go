// Package arch is a model's architecture as sizes — its [Shape] — and
// what follows from the sizes alone: the parameter tensors a rank's part
// of the model holds under a parallel layout ([Shape.Tensors]), and from
// them every parameter count, and the FLOPs one trained token costs. It
// is the one account of a model that the engine (which lays its
// parameters out by it), the planner (which prices strategies by it) and
// the layout rule (package layout) share.
package arch

import "fmt"

// Family is a model family: the layers a block is made of.
type Family int

const (
	// GPT2 is GPT-2: learned position embeddings, LayerNorm with biases,
	// multi-head attention, a GELU MLP, biases everywhere, the token
	// embedding tied to the head. The zero Family.
	GPT2 Family = iota
	// Llama is the Llama family (Llama 2 and 3): rotary position
	// embeddings, RMSNorm, grouped-query attention, a SwiGLU MLP, no
	// biases, the head tied to the embedding or not.
	Llama
)

// String is the family's config value (Model.family): gpt2 or llama.
func (f Family) String() string {
	switch f {
	case GPT2:
		return "gpt2"
	case Llama:
		return "llama"
	}
	return fmt.Sprintf("Family(%d)", int(f))
}

// Shape is a model's sizes, named as llm.c names them (the config keys
// in parentheses). The zero values of the fields after F describe GPT-2.
type Shape struct {
	MaxT int // positions: the position embedding's rows in GPT-2, the longest sequence (max_position_embeddings)
	V    int // vocabulary size, real tokens (vocab_size)
	Vp   int // vocabulary padded to a multiple of 128: the rows of wte (PadVocab)
	L    int // transformer blocks (num_layers)
	NH   int // attention (query) heads (num_attention_heads)
	C    int // hidden size, channels (hidden_size)
	F    int // MLP hidden size: 4·C in GPT-2, the SwiGLU intermediate size in Llama (ffn_hidden_size)

	Family Family // GPT2 or Llama (family)
	NKV    int    // Llama: key/value heads, dividing NH (num_key_value_heads); GPT-2: unused (NH)
	Untied bool   // Llama: the head is its own matrix, lm_head (tie_word_embeddings false); GPT-2 always ties
}

// KVHeads is the number of key/value heads: NKV for Llama, NH for GPT-2
// (and for a Llama shape that leaves NKV 0).
func (s Shape) KVHeads() int {
	if s.Family == Llama && s.NKV > 0 {
		return s.NKV
	}
	return s.NH
}

// Tied reports whether the head's weights are the token embedding's
// (always in GPT-2).
func (s Shape) Tied() bool { return s.Family != Llama || !s.Untied }

// VocabAlign is what the vocabulary is padded to a multiple of, for
// aligned rows (llm.c's padded_vocab_size).
const VocabAlign = 128

// PadVocab is v rounded up to a multiple of VocabAlign (0 for v ≤ 0).
func PadVocab(v int) int {
	if v <= 0 {
		return 0
	}
	return (v + VocabAlign - 1) / VocabAlign * VocabAlign
}

// LayerParams is the parameter count of one block, the sum of its
// [Shape.Tensors]. GPT-2: ln1 and ln2 (2C each), qkv (3C² + 3C), the
// attention projection (C² + C), fc (CF + F) and the fc projection (FC +
// C). Llama (head size hd = C/NH): input_layernorm and
// post_attention_layernorm (C each), q, k and v (C·(NH + 2·NKV)·hd),
// o_proj (C²), gate and up (2CF) and down (FC).
func (s Shape) LayerParams() int64 { return s.PartParams(Part{MP: 1, Layers: 1}) }

// headSize is C/NH (0 without heads).
func (s Shape) headSize() int {
	if s.NH <= 0 {
		return 0
	}
	return s.C / s.NH
}

// Params counts every parameter as the engine lays them out, the sum of
// the whole model's [Shape.Tensors]. GPT-2: the padded token embedding
// (Vp·C), the position embedding (MaxT·C), the blocks and the final
// LayerNorm (2C). Llama: the padded token embedding, the blocks, the final
// RMSNorm (C) and, untied, the padded lm_head (Vp·C).
func (s Shape) Params() int64 { return s.PartParams(s.Whole()) }

// FLOPsPerToken is the training FLOPs of one token at sequence length T,
// the numerator of MFU: 6·N for the matrix multiplies of the forward and
// backward passes, N the parameters a multiply touches, plus 6·L·C·T for
// attention's scores and weighted sums (causal, so half of 12·L·C·T; the
// query heads span C channels in both families). GPT-2's N is every
// parameter but the position embedding and the padded vocabulary rows;
// an untied Llama's leaves out the token embedding too (a lookup) and
// counts the lm_head's real rows.
func (s Shape) FLOPsPerToken(T int) float64 {
	C := int64(s.C)
	N := s.Params() - int64(s.Vp-s.V)*C
	switch {
	case s.Family == Llama && s.Untied:
		N -= int64(s.Vp) * C
	case s.Family != Llama:
		N -= int64(s.MaxT) * C
	}
	return 6*float64(N) + 6*float64(s.L)*float64(s.C)*float64(T)
}
