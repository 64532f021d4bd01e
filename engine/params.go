package engine

import (
	"fmt"
	"math"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/layout"
	"github.com/gptui/gptui/presets"
)

// ModelConfig is the shape of a model, GPT-2 or Llama (Shape.Family), and
// the settings of its layers.
type ModelConfig struct {
	arch.Shape // the sizes: MaxT, V, Vp, L, NH, C, F; a Llama's NKV and Untied

	HiddenDropout float32 // dropout on embeddings and on each residual branch
	AttnDropout   float32 // dropout on attention probabilities

	// The Llama family's (unused by GPT-2):
	NormEps float32      // RMSNorm's epsilon (rms_norm_eps)
	RoPE    kernels.RoPE // the rotary embeddings' frequencies (rope_theta, rope_scaling)

	// TokenIDs are the special token ids an import brought in, which a
	// checkpoint keeps and an export writes; no part of what it computes.
	TokenIDs TokenIDs
}

// ShapeOf is the model shape cfg asks for (Model.*, the padded vocabulary).
func ShapeOf(cfg *presets.Config) ModelConfig {
	mc := cfg.Model
	s := ModelConfig{Shape: cfg.Shape(),
		HiddenDropout: float32(mc.HiddenDropoutProb), AttnDropout: float32(mc.AttentionProbsDropoutProb)}
	if mc.Llama() {
		s.NormEps = float32(mc.RMSNormEps)
		s.RoPE = kernels.RoPE{Theta: mc.RopeTheta}
		if rs := mc.RopeScaling; rs.RopeType == "llama3" {
			s.RoPE.Scaling = &kernels.RoPEScaling{Factor: rs.Factor, LowFreqFactor: rs.LowFreqFactor, HighFreqFactor: rs.HighFreqFactor,
				OriginalMaxPositions: rs.OriginalMaxPositionEmbeddings}
		}
	}
	return s
}

// ShapeNames names ModelConfig's sizes as the input they came from calls
// them (a config key, a header field), for error messages.
type ShapeNames struct{ MaxT, V, L, NH, C, F, NKV string }

// configNames are the config keys of the sizes (presets' Model.*).
var configNames = ShapeNames{MaxT: "max_position_embeddings", V: "vocab_size", L: "num_layers", NH: "num_attention_heads", C: "hidden_size", F: "ffn_hidden_size",
	NKV: "num_key_value_heads"}

// Validate reports an impossible shape, naming the sizes by their config
// keys.
func (c ModelConfig) Validate() error { return c.ValidateNamed(configNames) }

// ValidateNamed reports an impossible shape, naming the sizes as n does:
// a size that is not positive, a vocabulary beyond int32 token ids, heads
// that do not divide the hidden size, more than [presets.MaxLayers] layers
// or [presets.MaxElements] parameters; for a Llama, key/value heads that
// do not divide the heads, or rotary embeddings that do not fit the head
// size. A shape that passes can be laid out ([Tensors]) without an int
// overflowing.
func (c ModelConfig) ValidateNamed(n ShapeNames) error {
	for _, f := range []struct {
		name string
		v    int
	}{{n.MaxT, c.MaxT}, {n.V, c.V}, {n.L, c.L}, {n.NH, c.NH}, {n.C, c.C}, {n.F, c.F}} {
		if f.v <= 0 {
			return fmt.Errorf("%s %d: every size must be positive", f.name, f.v)
		}
	}
	switch {
	case c.Vp < c.V:
		return fmt.Errorf("padded vocabulary %d is smaller than %s %d", c.Vp, n.V, c.V)
	case c.C%c.NH != 0:
		return fmt.Errorf("%s %d is not divisible by %d heads (%s)", n.C, c.C, c.NH, n.NH)
	case c.V > math.MaxInt32:
		return fmt.Errorf("%s %d does not fit int32 token ids", n.V, c.V)
	case c.L > presets.MaxLayers:
		return fmt.Errorf("%s %d exceeds the %d layers gptui supports", n.L, c.L, presets.MaxLayers)
	}
	if c.Family == arch.Llama {
		if err := c.validateLlama(n); err != nil {
			return err
		}
	}
	if p := c.ParamBound(); p > presets.MaxElements {
		return fmt.Errorf("%s %d, %s %d, %s %d, %s %d and %s %d make %.3g parameters, more than the %.3g gptui supports",
			n.L, c.L, n.C, c.C, n.F, c.F, n.V, c.V, n.MaxT, c.MaxT, p, float64(presets.MaxElements))
	}
	return nil
}

// Tensor is one named parameter: a view into the model's single buffer.
// Layered tensors (qkvw, …) hold all the rank's layers, layer-major, as
// llm.c does.
type Tensor struct {
	Name   string  // llm.c's name: wte, wpe, ln1w, …
	Shape  []int   // shape held by this rank, layer dimension first for layered tensors
	Global []int   // shape in the whole model (equal to Shape without parallelism)
	Pieces []Piece // where the blocks of this rank's tensor lie in the global one
	Offset int     // first element in the parameter buffer
	Size   int     // element count
	Decay  bool    // weight decay applies (matrices and embeddings, as Megatron)
	Split  bool    // split across the tensor-parallel group (else each rank holds it whole)
}

// Piece is a block of a rank's tensor and its place in the global tensor:
// the elements Local … Local+Shape of the rank's tensor are the elements
// Global … Global+Shape of the whole model's.
type Piece struct {
	Local, Global, Shape []int
	// Copies is the number of ranks of the tensor-parallel group that
	// hold this block of a split tensor alike (a Llama's key/value heads
	// when mp_degree exceeds them); 0 or 1: this rank alone. Their
	// gradients are summed over those ranks (tensorParallel.sumCopies),
	// and the gradient norm counts each 1/Copies.
	Copies int
	// Copy is set on all of them but the first: a checkpoint takes the
	// block from the first.
	Copy bool
}

// Part is the piece of the model one rank holds.
//
// Tensor parallelism (Megatron) splits each block over the MP ranks of a
// group: the QKV projection and the MLP's first layer by output columns
// (each rank holds NH/MP heads and F/MP hidden units), the attention output
// projection and the MLP's second layer by input rows (their outputs are
// partial sums, all-reduced), and the token embedding by vocabulary rows
// (Vp/MP each), which also makes the tied head vocabulary-parallel.
// Pipeline parallelism gives each stage a subset of the blocks, the
// embeddings to the first stage and the final LayerNorm and head (with its
// own copy of the tied wte) to the last.
type Part struct {
	MP, MPRank int   // tensor-parallel degree and this rank's index in the group
	Layers     []int // global indices of the blocks held, ascending
	Embed      bool  // holds wte and wpe and runs the embedding (first stage)
	Head       bool  // holds lnf and wte and runs the head and loss (last stage)
	SP         bool  // sequence parallel: between the regions, holds 1/MP of the rows (sequenceparallel.go)
	CP, CPRank int   // context parallel: this rank's chunks of every sequence (contextparallel.go); 0 or 1 for none
}

// WholePart is the part of one process holding the whole model.
func WholePart(cfg ModelConfig) Part {
	layers := make([]int, cfg.L)
	for i := range layers {
		layers[i] = i
	}
	return Part{MP: 1, Layers: layers, Embed: true, Head: true}
}

// check reports a part that cannot be cut from cfg.
func (p Part) check(cfg ModelConfig) error {
	switch {
	case p.MP < 1 || p.MPRank < 0 || p.MPRank >= p.MP:
		return fmt.Errorf("tensor-parallel rank %d of %d", p.MPRank, p.MP)
	}
	if pr := layout.Check(cfg.Shape, layout.Layout{DP: 1, Sharding: 1, MP: p.MP, PP: 1, VPP: 1, Stage: 1, SP: p.SP}, layout.Batch{}); pr != nil {
		return pr
	}
	for i, l := range p.Layers {
		if l < 0 || l >= cfg.L || i > 0 && l <= p.Layers[i-1] {
			return fmt.Errorf("layers %v: not ascending block indices below %d", p.Layers, cfg.L)
		}
	}
	return nil
}

// Tensors lists the parameter tensors of the whole model cfg and returns
// them with the total element count. A GPT-2's are in llm.c's file order:
// wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw,
// fcb, fcprojw, fcprojb, lnfw, lnfb. A Llama's follow Hugging Face's
// LlamaForCausalLM modules (their names in brackets), with hd = C/NH and
// NKV key/value heads:
//
//	wte      (Vp, C)                  [model.embed_tokens]
//	ln1w     (L, C)                   [input_layernorm]
//	qkvw     (L, (NH+2·NKV)·hd, C)    [q_proj, k_proj, v_proj: their rows one after another]
//	attprojw (L, C, NH·hd)            [o_proj]
//	ln2w     (L, C)                   [post_attention_layernorm]
//	fcw      (L, 2F, C)               [gate_proj, up_proj: the SwiGLU kernel's (N,2F) input]
//	fcprojw  (L, C, F)                [down_proj]
//	lnfw     (C)                      [model.norm]
//	lmhead   (Vp, C), untied only     [lm_head]
//
// The rows of q_proj and k_proj are HF's, for its rotate_half rotary
// embeddings (kernels.Backend.RoPEForward); Meta's checkpoints permute
// them.
func Tensors(cfg ModelConfig) ([]Tensor, int) { return PartTensors(cfg, WholePart(cfg)) }

// PartTensors lists the tensors part holds, in Tensors' order (the ones it
// does not hold left out), with their local shapes and their pieces of the
// global tensors. part must be valid for cfg. The tensors and their shapes
// are arch's account of the part ([arch.Shape.Tensors]); what this adds is
// where the rank's slices lie in the global tensors and the buffer.
func PartTensors(cfg ModelConfig, part Part) ([]Tensor, int) {
	C, F, M, r := cfg.C, cfg.F, max(part.MP, 1), part.MPRank
	Cl, Fl, Vpl := C/M, F/M, cfg.Vp/M
	// runs of consecutive layers: local start, global start, count
	var runs [][3]int
	for i, l := range part.Layers {
		if i > 0 && l == part.Layers[i-1]+1 {
			runs[len(runs)-1][2]++
			continue
		}
		runs = append(runs, [3]int{i, l, 1})
	}
	// A split says which slice of a layered tensor's per-layer block this
	// rank holds: along dimension dim (of the local shape, 0 being the
	// layer), blocks of the widths taken from the global offsets at, one
	// after another; copies are the ranks holding each block alike (nil:
	// this rank alone).
	type split struct {
		dim        int
		at, widths []int
		copies     []int
	}
	cols := func(dim, width int, at ...int) split {
		ws := make([]int, len(at))
		for i := range ws {
			ws[i] = width
		}
		return split{dim: dim, at: at, widths: ws}
	}
	// The slices of the split block tensors; the others are held whole.
	splits := map[string]split{
		// Column-parallel: this rank's heads of q, k and v (three blocks of
		// Cl rows of the QKV projection) and its Fl hidden units of fc.
		"qkvw": cols(1, Cl, r*Cl, C+r*Cl, 2*C+r*Cl),
		"qkvb": cols(1, Cl, r*Cl, C+r*Cl, 2*C+r*Cl),
		"fcw":  cols(1, Fl, r*Fl),
		"fcb":  cols(1, Fl, r*Fl),
		// Row-parallel: the input columns of attproj that this rank's heads
		// produce, and those of fcproj from its hidden units.
		"attprojw": cols(2, Cl, r*Cl),
		"fcprojw":  cols(2, Fl, r*Fl),
	}
	if cfg.Family == arch.Llama {
		// Query heads as GPT-2's; the NKV key/value heads split the same
		// way when mp divides them, else each rank holds the one its
		// query heads use, alike with the rep−1 other ranks of its group
		// (Megatron-LM's replication).
		hd, NKV, kvl, rep := C/cfg.NH, cfg.KVHeads(), cfg.KVWidth(M), cfg.KVCopies(M)
		kvOff, reps := r/rep*kvl, []int(nil)
		if rep > 1 {
			reps = []int{1, rep, rep}
		}
		splits["qkvw"] = split{dim: 1, at: []int{r * Cl, C + kvOff, C + NKV*hd + kvOff}, widths: []int{Cl, kvl, kvl}, copies: reps}
		// gate then up: this rank's Fl units of each.
		splits["fcw"] = cols(1, Fl, r*Fl, F+r*Fl)
	}
	// layered returns the pieces of a layered tensor split as sp.
	layered := func(local []int, sp split) []Piece {
		var ps []Piece
		for _, run := range runs {
			if sp.dim == 0 {
				lo, gl := make([]int, len(local)), make([]int, len(local))
				lo[0], gl[0] = run[0], run[1]
				sh := append([]int{run[2]}, local[1:]...)
				ps = append(ps, Piece{Local: lo, Global: gl, Shape: sh})
				continue
			}
			at := 0
			for j, o := range sp.at {
				lo, gl := make([]int, len(local)), make([]int, len(local))
				lo[0], gl[0] = run[0], run[1]
				lo[sp.dim], gl[sp.dim] = at, o
				sh := append([]int{run[2]}, local[1:]...)
				sh[sp.dim] = sp.widths[j]
				at += sp.widths[j]
				pc := Piece{Local: lo, Global: gl, Shape: sh}
				if sp.copies != nil && sp.copies[j] > 1 {
					pc.Copies, pc.Copy = sp.copies[j], r%sp.copies[j] != 0
				}
				ps = append(ps, pc)
			}
		}
		return ps
	}
	// Vocabulary-parallel: this rank's Vpl rows of the embedding (and of
	// a Llama's lm_head).
	vocabRows := []Piece{{Local: []int{0, 0}, Global: []int{r * Vpl, 0}, Shape: []int{Vpl, C}}}

	var ts []Tensor
	off := 0
	for _, t := range cfg.Tensors(arch.Part{MP: M, Layers: len(part.Layers), Embed: part.Embed, Head: part.Head}) {
		var pieces []Piece
		switch {
		case t.Layered:
			pieces = layered(t.Shape, splits[t.Name])
		case t.Name == "wte" || t.Name == "lmhead":
			pieces = vocabRows
		default:
			pieces = []Piece{{Local: make([]int, len(t.Shape)), Global: make([]int, len(t.Shape)), Shape: append([]int(nil), t.Shape...)}}
		}
		n := int(t.Size())
		ts = append(ts, Tensor{Name: t.Name, Shape: t.Shape, Global: t.Global, Pieces: pieces, Offset: off, Size: n, Decay: t.Decay, Split: t.Split})
		off += n
	}
	return ts, off
}

// weights are named views of one buffer laid out by PartTensors (parameters
// or their gradients); the tensors a part does not hold are nil.
type weights struct {
	wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb []float32
	ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb   []float32
	lmhead                                               []float32 // an untied Llama's head
}

func viewWeights(buf []float32, ts []Tensor) weights {
	var w weights
	field := map[string]*[]float32{
		"wte": &w.wte, "wpe": &w.wpe, "ln1w": &w.ln1w, "ln1b": &w.ln1b, "qkvw": &w.qkvw, "qkvb": &w.qkvb,
		"attprojw": &w.attprojw, "attprojb": &w.attprojb, "ln2w": &w.ln2w, "ln2b": &w.ln2b, "fcw": &w.fcw,
		"fcb": &w.fcb, "fcprojw": &w.fcprojw, "fcprojb": &w.fcprojb, "lnfw": &w.lnfw, "lnfb": &w.lnfb, "lmhead": &w.lmhead,
	}
	for _, t := range ts {
		*field[t.Name] = buf[t.Offset : t.Offset+t.Size : t.Offset+t.Size]
	}
	return w
}

// layer returns the views of block l of a layered tensor with per-layer size n.
func layer(x []float32, l, n int) []float32 { return x[l*n : (l+1)*n : (l+1)*n] }

// copyBlock copies the block of shape sh at srcAt in src (of shape srcShape)
// to dstAt in dst (of shape dstShape). All tensors are row-major.
func copyBlock(dst []float32, dstShape, dstAt []int, src []float32, srcShape, srcAt []int, sh []int) {
	n := len(sh)
	if n == 0 || numel(sh) == 0 {
		return
	}
	inner := sh[n-1]
	ds, ss := strides(dstShape), strides(srcShape)
	idx := make([]int, n-1)
	for {
		do, so := dstAt[n-1], srcAt[n-1]
		for i, v := range idx {
			do += (dstAt[i] + v) * ds[i]
			so += (srcAt[i] + v) * ss[i]
		}
		copy(dst[do:do+inner], src[so:so+inner])
		k := n - 2
		for ; k >= 0; k-- {
			idx[k]++
			if idx[k] < sh[k] {
				break
			}
			idx[k] = 0
		}
		if k < 0 {
			return
		}
	}
}

func strides(shape []int) []int {
	s := make([]int, len(shape))
	acc := 1
	for i := len(shape) - 1; i >= 0; i-- {
		s[i] = acc
		acc *= shape[i]
	}
	return s
}

// numel is the element count of shape.
func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}
