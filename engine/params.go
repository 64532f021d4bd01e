package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// ModelConfig is the shape of a GPT-2 model.
type ModelConfig struct {
	MaxT int // max_position_embeddings: rows of the position embedding
	V    int // vocabulary size (real tokens)
	Vp   int // vocabulary padded to a multiple of 128 (rows of wte)
	L    int // transformer blocks
	NH   int // attention heads
	C    int // hidden size (channels)
	F    int // MLP hidden size (ffn_hidden_size), 4·C in GPT-2

	HiddenDropout float32 // dropout on embeddings and on each residual branch
	AttnDropout   float32 // dropout on attention probabilities
}

// Validate reports an impossible shape.
func (c ModelConfig) Validate() error {
	switch {
	case c.MaxT <= 0 || c.V <= 0 || c.L <= 0 || c.NH <= 0 || c.C <= 0 || c.F <= 0:
		return fmt.Errorf("model shape %+v: every size must be positive", c)
	case c.Vp < c.V:
		return fmt.Errorf("padded vocabulary %d is smaller than the vocabulary %d", c.Vp, c.V)
	case c.C%c.NH != 0:
		return fmt.Errorf("hidden size %d is not divisible by %d heads", c.C, c.NH)
	case c.V > 65536:
		return fmt.Errorf("vocabulary %d does not fit uint16 token shards", c.V)
	}
	return nil
}

// Tensor is one named parameter: a view into the model's single buffer.
// Layered tensors (qkvw, …) hold all L layers, layer-major, as llm.c does.
type Tensor struct {
	Name   string // llm.c's name: wte, wpe, ln1w, …
	Shape  []int  // full shape, layer dimension first for layered tensors
	Offset int    // first element in the parameter buffer
	Size   int    // element count
	Decay  bool   // weight decay applies (matrices and embeddings, as Megatron)
}

// Layout lists the parameter tensors of cfg in llm.c's file order: wte, wpe,
// ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw,
// fcprojb, lnfw, lnfb. It returns the tensors and the total element count.
func Layout(cfg ModelConfig) ([]Tensor, int) {
	L, C, F := cfg.L, cfg.C, cfg.F
	specs := []struct {
		name  string
		shape []int
		decay bool
	}{
		{"wte", []int{cfg.Vp, C}, true},
		{"wpe", []int{cfg.MaxT, C}, true},
		{"ln1w", []int{L, C}, false},
		{"ln1b", []int{L, C}, false},
		{"qkvw", []int{L, 3 * C, C}, true},
		{"qkvb", []int{L, 3 * C}, false},
		{"attprojw", []int{L, C, C}, true},
		{"attprojb", []int{L, C}, false},
		{"ln2w", []int{L, C}, false},
		{"ln2b", []int{L, C}, false},
		{"fcw", []int{L, F, C}, true},
		{"fcb", []int{L, F}, false},
		{"fcprojw", []int{L, C, F}, true},
		{"fcprojb", []int{L, C}, false},
		{"lnfw", []int{C}, false},
		{"lnfb", []int{C}, false},
	}
	ts := make([]Tensor, len(specs))
	off := 0
	for i, s := range specs {
		n := 1
		for _, d := range s.shape {
			n *= d
		}
		ts[i] = Tensor{Name: s.name, Shape: s.shape, Offset: off, Size: n, Decay: s.decay}
		off += n
	}
	return ts, off
}

// weights are named views of one buffer laid out by Layout (parameters or
// their gradients).
type weights struct {
	wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb []float32
	ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb   []float32
}

func viewWeights(buf []float32, ts []Tensor) weights {
	v := func(i int) []float32 { return buf[ts[i].Offset : ts[i].Offset+ts[i].Size : ts[i].Offset+ts[i].Size] }
	return weights{v(0), v(1), v(2), v(3), v(4), v(5), v(6), v(7), v(8), v(9), v(10), v(11), v(12), v(13), v(14), v(15)}
}

// layer returns the views of block l of a layered tensor with per-layer size n.
func layer(x []float32, l, n int) []float32 { return x[l*n : (l+1)*n : (l+1)*n] }

// initParams fills params as GPT-2 is initialised: N(0, std) for embeddings
// and matrices, the residual output projections (attprojw, fcprojw) scaled by
// 1/√(2L), biases 0, LayerNorm weights 1 and biases 0. The padded rows of wte
// stay 0: no token reads them and no logit is computed for them.
func initParams(params []float32, ts []Tensor, cfg ModelConfig, std float64, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x6770747569)) // "gptui"
	resid := std / math.Sqrt(2*float64(cfg.L))
	for _, t := range ts {
		p := params[t.Offset : t.Offset+t.Size]
		switch t.Name {
		case "ln1w", "ln2w", "lnfw":
			for i := range p {
				p[i] = 1
			}
		case "wte":
			for i := range p[:cfg.V*cfg.C] {
				p[i] = float32(rng.NormFloat64() * std)
			}
		case "wpe", "qkvw", "fcw":
			for i := range p {
				p[i] = float32(rng.NormFloat64() * std)
			}
		case "attprojw", "fcprojw":
			for i := range p {
				p[i] = float32(rng.NormFloat64() * resid)
			}
		}
	}
}
