// Package arch is a model's architecture as sizes — its [Shape] — and
// what follows from the sizes alone: the parameters the model holds and
// the FLOPs one trained token costs. It is the one account of a model that
// the engine (which lays its parameters out by it), the planner (which
// prices strategies by it) and the layout rule (package layout) share.
package arch

// Shape is a GPT-2 model's sizes, named as llm.c names them (the config
// keys in parentheses).
type Shape struct {
	MaxT int // positions of the position embedding (max_position_embeddings)
	V    int // vocabulary size, real tokens (vocab_size)
	Vp   int // vocabulary padded to a multiple of 128: the rows of wte (PadVocab)
	L    int // transformer blocks (num_layers)
	NH   int // attention heads (num_attention_heads)
	C    int // hidden size, channels (hidden_size)
	F    int // MLP hidden size, 4·C in GPT-2 (ffn_hidden_size)
}

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

// LayerParams is the parameter count of one block: ln1 and ln2 (2C
// each), qkv (3C² + 3C), the attention projection (C² + C), fc (CF + F)
// and the fc projection (FC + C).
func (s Shape) LayerParams() int64 {
	C, F := int64(s.C), int64(s.F)
	return 4*C*C + 2*C*F + 9*C + F
}

// Params counts every parameter as the engine lays them out: the padded
// token embedding (Vp·C), the position embedding (MaxT·C), the blocks and
// the final LayerNorm (2C).
func (s Shape) Params() int64 {
	C := int64(s.C)
	return int64(s.Vp)*C + int64(s.MaxT)*C + int64(s.L)*s.LayerParams() + 2*C
}

// ParamBound is Params computed in float64, so that it cannot overflow
// for any sizes: what a check of an untrusted shape compares with a limit
// before anything is laid out.
func (s Shape) ParamBound() float64 {
	C, F := float64(s.C), float64(s.F)
	block := 4*C*C + 2*C*F + 9*C + F
	return float64(s.Vp)*C + float64(s.MaxT)*C + float64(s.L)*block + 2*C
}

// FLOPsPerToken is the training FLOPs of one token at sequence length T,
// the numerator of MFU: 6·N for the matrix multiplies of the forward and
// backward passes (N: every parameter but the position embedding and the
// padded vocabulary rows, which no multiply touches) plus 6·L·C·T for
// attention's scores and weighted sums (causal, so half of 12·L·C·T).
func (s Shape) FLOPsPerToken(T int) float64 {
	N := s.Params() - int64(s.MaxT)*int64(s.C) - int64(s.Vp-s.V)*int64(s.C)
	return 6*float64(N) + 6*float64(s.L)*float64(s.C)*float64(T)
}
