package hf

import (
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/badinput"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/safetensors"
	"github.com/gptui/gptui/kernels"
)

// The Llama family's files: transformers' LlamaForCausalLM, mapped as the
// package doc says.

// llamaMappings lists the tensors of the Llama cfg in the order Export
// writes them, full names, and the size of the buffer they map into.
func llamaMappings(cfg engine.ModelConfig) ([]mapping, int) {
	ts, total := engine.Tensors(cfg)
	off := make(map[string]int, len(ts))
	per := make(map[string]int, len(ts)) // per-layer size of layered tensors
	for _, t := range ts {
		off[t.Name] = t.Offset
		per[t.Name] = t.Size / cfg.L
	}
	C, F, hd := cfg.C, cfg.F, cfg.C/cfg.NH
	q, kv := cfg.NH*hd, cfg.KVHeads()*hd
	ms := []mapping{{name: "model.embed_tokens.weight", shape: []int{cfg.V, C}, off: off["wte"]}}
	for l := range cfg.L {
		at := func(name string, row int) int { return off[name] + l*per[name] + row*C }
		p := fmt.Sprintf("model.layers.%d.", l)
		ms = append(ms,
			mapping{name: p + "input_layernorm.weight", shape: []int{C}, off: at("ln1w", 0)},
			mapping{name: p + "self_attn.q_proj.weight", shape: []int{q, C}, off: at("qkvw", 0)},
			mapping{name: p + "self_attn.k_proj.weight", shape: []int{kv, C}, off: at("qkvw", q)},
			mapping{name: p + "self_attn.v_proj.weight", shape: []int{kv, C}, off: at("qkvw", q+kv)},
			mapping{name: p + "self_attn.o_proj.weight", shape: []int{C, q}, off: off["attprojw"] + l*per["attprojw"]},
			mapping{name: p + "post_attention_layernorm.weight", shape: []int{C}, off: at("ln2w", 0)},
			mapping{name: p + "mlp.gate_proj.weight", shape: []int{F, C}, off: at("fcw", 0)},
			mapping{name: p + "mlp.up_proj.weight", shape: []int{F, C}, off: at("fcw", F)},
			mapping{name: p + "mlp.down_proj.weight", shape: []int{C, F}, off: off["fcprojw"] + l*per["fcprojw"]},
		)
	}
	ms = append(ms, mapping{name: "model.norm.weight", shape: []int{C}, off: off["lnfw"]})
	if !cfg.Tied() {
		ms = append(ms, mapping{name: lmHead, shape: []int{cfg.V, C}, off: off["lmhead"]})
	}
	return ms, total
}

// llamaRopeScaling is config.json's rope_scaling: Llama 3.1's when its
// rope_type (older files: type) is "llama3".
type llamaRopeScaling struct {
	RopeType                      string   `json:"rope_type"`
	Type                          string   `json:"type,omitempty"`
	Factor                        *float64 `json:"factor"`
	LowFreqFactor                 *float64 `json:"low_freq_factor"`
	HighFreqFactor                *float64 `json:"high_freq_factor"`
	OriginalMaxPositionEmbeddings *int     `json:"original_max_position_embeddings"`
}

// llamaExportConfig is the config.json Export writes for a Llama. The
// field order is the key order of the file.
type llamaExportConfig struct {
	Architectures         []string          `json:"architectures"`
	ModelType             string            `json:"model_type"`
	VocabSize             int               `json:"vocab_size"`
	HiddenSize            int               `json:"hidden_size"`
	IntermediateSize      int               `json:"intermediate_size"`
	NumHiddenLayers       int               `json:"num_hidden_layers"`
	NumAttentionHeads     int               `json:"num_attention_heads"`
	NumKeyValueHeads      int               `json:"num_key_value_heads"`
	HeadDim               int               `json:"head_dim"`
	HiddenAct             string            `json:"hidden_act"`
	MaxPositionEmbeddings int               `json:"max_position_embeddings"`
	RMSNormEps            f32               `json:"rms_norm_eps"`
	RopeTheta             json.Number       `json:"rope_theta"`
	RopeScaling           *llamaRopeScaling `json:"rope_scaling"`
	AttentionBias         bool              `json:"attention_bias"`
	AttentionDropout      f32               `json:"attention_dropout"`
	MLPBias               bool              `json:"mlp_bias"`
	PretrainingTP         int               `json:"pretraining_tp"`
	TieWordEmbeddings     bool              `json:"tie_word_embeddings"`
	InitializerRange      json.Number       `json:"initializer_range"`
	BosTokenID            json.RawMessage   `json:"bos_token_id"`
	EosTokenID            json.RawMessage   `json:"eos_token_id"`
	PadTokenID            json.RawMessage   `json:"pad_token_id,omitempty"`
	UseCache              bool              `json:"use_cache"`
	TorchDtype            string            `json:"torch_dtype"`
}

// encodeLlamaConfig returns config.json for the Llama cfg: 2-space
// indented, newline terminated, keys in a fixed order. Its BOS, EOS and
// pad ids are cfg's TokenIDs (those of the model an import brought in);
// where it has none, BOS and EOS are GPT-2's <|endoftext|> when the
// vocabulary is GPT-2's (as gptui's built-in tokenizer's), else null,
// and pad is left out. Hidden-state dropout, which LlamaForCausalLM
// lacks, is not written.
func encodeLlamaConfig(cfg engine.ModelConfig) ([]byte, error) {
	c := llamaExportConfig{
		Architectures:         []string{"LlamaForCausalLM"},
		ModelType:             "llama",
		VocabSize:             cfg.V,
		HiddenSize:            cfg.C,
		IntermediateSize:      cfg.F,
		NumHiddenLayers:       cfg.L,
		NumAttentionHeads:     cfg.NH,
		NumKeyValueHeads:      cfg.KVHeads(),
		HeadDim:               cfg.C / cfg.NH,
		HiddenAct:             "silu",
		MaxPositionEmbeddings: cfg.MaxT,
		RMSNormEps:            f32(cfg.NormEps),
		RopeTheta:             json.Number(strconv.FormatFloat(cfg.RoPE.Theta, 'g', -1, 64)),
		AttentionDropout:      f32(cfg.AttnDropout),
		PretrainingTP:         1,
		TieWordEmbeddings:     cfg.Tied(),
		InitializerRange:      "0.02",
		UseCache:              true,
		TorchDtype:            "float32",
	}
	if s := cfg.RoPE.Scaling; s != nil {
		o := s.OriginalMaxPositions
		c.RopeScaling = &llamaRopeScaling{RopeType: "llama3", Factor: &s.Factor, LowFreqFactor: &s.LowFreqFactor, HighFreqFactor: &s.HighFreqFactor,
			OriginalMaxPositionEmbeddings: &o}
	}
	c.BosTokenID, c.EosTokenID, c.PadTokenID = exportTokenIDs(cfg)
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// llamaImportConfig is the part of a transformers LlamaConfig that Import
// reads. Pointers tell a missing key from a zero.
type llamaImportConfig struct {
	tokenIDKeys
	VocabSize             *int              `json:"vocab_size"`
	HiddenSize            *int              `json:"hidden_size"`
	IntermediateSize      *int              `json:"intermediate_size"`
	NumHiddenLayers       *int              `json:"num_hidden_layers"`
	NumAttentionHeads     *int              `json:"num_attention_heads"`
	NumKeyValueHeads      *int              `json:"num_key_value_heads"`
	HeadDim               *int              `json:"head_dim"`
	MaxPositionEmbeddings *int              `json:"max_position_embeddings"`
	HiddenAct             *string           `json:"hidden_act"`
	RMSNormEps            *float64          `json:"rms_norm_eps"`
	RopeTheta             *float64          `json:"rope_theta"`
	RopeScaling           *llamaRopeScaling `json:"rope_scaling"`
	AttentionBias         bool              `json:"attention_bias"`
	MLPBias               bool              `json:"mlp_bias"`
	AttentionDropout      *float64          `json:"attention_dropout"`
	TieWordEmbeddings     *bool             `json:"tie_word_embeddings"`
}

// llamaNames name the sizes of a ModelConfig by LlamaConfig's keys.
var llamaNames = engine.ShapeNames{MaxT: "max_position_embeddings", V: "vocab_size", L: "num_hidden_layers", NH: "num_attention_heads",
	C: "hidden_size", F: "intermediate_size", NKV: "num_key_value_heads"}

// family reads config.json's model_type, or where it has none its
// architectures: arch.Llama for "llama" (LlamaForCausalLM), arch.GPT2 for
// "gpt2" or neither key.
func family(path string) (arch.Family, error) {
	b, err := readConfigFile(path)
	if err != nil {
		return 0, err
	}
	var c struct {
		ModelType     string   `json:"model_type"`
		Architectures []string `json:"architectures"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return 0, &engine.FormatError{File: path, Msg: fmt.Sprintf("not a model config: %v", err)}
	}
	switch {
	case c.ModelType == "llama", c.ModelType == "" && slices.Contains(c.Architectures, "LlamaForCausalLM"):
		return arch.Llama, nil
	case c.ModelType == "", c.ModelType == "gpt2":
		return arch.GPT2, nil
	}
	return 0, &engine.FormatError{File: path, Msg: fmt.Sprintf("model_type %q: gptui reads gpt2 and llama", c.ModelType)}
}

// llamaDefaults are transformers' LlamaConfig defaults of the keys
// readLlamaConfig takes from it where config.json leaves them out (the
// sizes of the weights it must give; rope_scaling, pad_token_id absent
// are none): as transformers loads such a file.
var llamaDefaults = struct {
	maxPositions int
	normEps      float64
	ropeTheta    float64
	bos, eos     string
}{maxPositions: 2048, normEps: 1e-6, ropeTheta: 10000, bos: "1", eos: "2"}

// readLlamaConfig reads a transformers LlamaConfig. The sizes of the
// weights must be there; every other key left out takes LlamaConfig's
// default, as transformers applies it — num_key_value_heads
// num_attention_heads, max_position_embeddings 2048, rms_norm_eps 1e-6,
// rope_theta 10000, tie_word_embeddings false, hidden_act silu,
// attention_dropout 0, bos_token_id 1, eos_token_id 2, no rope_scaling —
// and note, if not nil, is told each such key and value.
func readLlamaConfig(path string, note func(string)) (engine.ModelConfig, error) {
	b, err := readConfigFile(path)
	if err != nil {
		return engine.ModelConfig{}, err
	}
	bad := func(format string, args ...any) error {
		return &engine.FormatError{File: path, Msg: fmt.Sprintf(format, args...)}
	}
	var c llamaImportConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return engine.ModelConfig{}, bad("not a Llama config: %v", err)
	}
	for _, f := range []struct {
		key string
		v   *int
	}{{"vocab_size", c.VocabSize}, {"hidden_size", c.HiddenSize}, {"intermediate_size", c.IntermediateSize}, {"num_hidden_layers", c.NumHiddenLayers},
		{"num_attention_heads", c.NumAttentionHeads}} {
		if f.v == nil {
			return engine.ModelConfig{}, bad("missing %s, which sizes the weights: write it into the file", f.key)
		}
	}
	dflt := defaulter{file: path, class: "LlamaConfig", note: note}
	d := llamaDefaults
	dflt.int(&c.NumKeyValueHeads, "num_key_value_heads", *c.NumAttentionHeads, " (num_attention_heads)")
	dflt.int(&c.MaxPositionEmbeddings, "max_position_embeddings", d.maxPositions, "")
	dflt.float(&c.RMSNormEps, "rms_norm_eps", d.normEps)
	dflt.float(&c.RopeTheta, "rope_theta", d.ropeTheta)
	dflt.bool(&c.TieWordEmbeddings, "tie_word_embeddings", false)
	dflt.float(&c.AttentionDropout, "attention_dropout", 0)
	if c.HiddenAct == nil {
		dflt.say("hidden_act", "silu")
	}
	ids, err := dflt.tokenIDs(c.tokenIDKeys, d.bos, d.eos)
	if err != nil {
		return engine.ModelConfig{}, err
	}
	// gptui's Llama computes SiLU-gated MLPs without biases, attention
	// without biases over heads of hidden_size/num_attention_heads
	// channels: a config asking for anything else would import into a
	// different function.
	if a := c.HiddenAct; a != nil && *a != "silu" {
		return engine.ModelConfig{}, bad("hidden_act %q not supported (want silu)", *a)
	}
	if c.AttentionBias || c.MLPBias {
		return engine.ModelConfig{}, bad("attention_bias and mlp_bias must be false: gptui's Llama has no biases")
	}
	s := arch.Shape{Family: arch.Llama, MaxT: *c.MaxPositionEmbeddings, V: *c.VocabSize, L: *c.NumHiddenLayers, NH: *c.NumAttentionHeads,
		C: *c.HiddenSize, F: *c.IntermediateSize, NKV: *c.NumKeyValueHeads, Untied: !*c.TieWordEmbeddings}
	s.Vp = arch.PadVocab(s.V)
	cfg := engine.ModelConfig{Shape: s, NormEps: float32(*c.RMSNormEps), RoPE: kernels.RoPE{Theta: *c.RopeTheta}, TokenIDs: ids}
	if h := c.HeadDim; h != nil && (s.NH <= 0 || *h != s.C/s.NH || s.C%s.NH != 0) {
		return engine.ModelConfig{}, bad("head_dim %d not supported (want hidden_size/num_attention_heads)", *h)
	}
	if d := *c.AttentionDropout; !(d >= 0 && d < 1) {
		return engine.ModelConfig{}, bad("attention_dropout %g: want 0 ≤ p < 1", d)
	}
	cfg.AttnDropout = float32(*c.AttentionDropout)
	if rs := c.RopeScaling; rs != nil {
		typ := rs.RopeType
		if typ == "" {
			typ = rs.Type
		}
		switch typ {
		case "default":
		case "llama3":
			if rs.Factor == nil || rs.LowFreqFactor == nil || rs.HighFreqFactor == nil || rs.OriginalMaxPositionEmbeddings == nil {
				return engine.ModelConfig{}, bad("rope_scaling llama3 needs factor, low_freq_factor, high_freq_factor and original_max_position_embeddings")
			}
			cfg.RoPE.Scaling = &kernels.RoPEScaling{Factor: *rs.Factor, LowFreqFactor: *rs.LowFreqFactor, HighFreqFactor: *rs.HighFreqFactor,
				OriginalMaxPositions: *rs.OriginalMaxPositionEmbeddings}
		default:
			return engine.ModelConfig{}, bad("rope_scaling of rope_type %q not supported (want llama3, or none)", typ)
		}
	}
	if err := cfg.ValidateNamed(llamaNames); err != nil {
		return engine.ModelConfig{}, bad("%v", err)
	}
	return cfg, nil
}

// importLlama reads a transformers LlamaForCausalLM folder into the
// buffer engine.Tensors lays out. F32 tensors are read as they are, F16
// and BF16 widened exactly. The rotary inverse frequencies that older
// checkpoints saved (self_attn.rotary_emb.inv_freq) are ignored, and so is
// an lm_head.weight equal to model.embed_tokens.weight when the config
// ties them; a tied lm_head.weight that differs is an error, as are an
// untied config without one, any other tensor, a missing one, a shape
// that does not match config.json and another dtype, each naming the file
// and tensor.
func importLlama(dir string, o ImportOptions) (engine.ModelConfig, []float32, error) {
	check := o.Check
	confPath := filepath.Join(dir, ConfigFile)
	cfg, err := readLlamaConfig(confPath, o.Note)
	if err != nil {
		return engine.ModelConfig{}, nil, badinput.Wrap(fmt.Errorf("hf import: %w", err))
	}
	st, err := openTensors(dir)
	if err != nil {
		return engine.ModelConfig{}, nil, badinput.Wrap(fmt.Errorf("hf import: %w", err))
	}
	defer st.Close()
	if err := fitsLlama(st, cfg, confPath); err != nil {
		return engine.ModelConfig{}, nil, fmt.Errorf("hf import: %w", err)
	}
	if check != nil {
		if err := check(cfg); err != nil {
			return engine.ModelConfig{}, nil, err
		}
	}
	params, err := loadLlama(st, cfg)
	if err != nil {
		return engine.ModelConfig{}, nil, fmt.Errorf("hf import: %w", err)
	}
	return cfg, params, nil
}

// fitsLlama checks, before anything of the model's size is allocated,
// that st can hold the Llama config.json (at confPath) describes: at least
// 9 tensors a layer, and at least 2 bytes (F16 or BF16) for each of its
// parameters but the padded vocabulary rows.
func fitsLlama(st *tensorSet, cfg engine.ModelConfig, confPath string) error {
	if len(st.entries) < 9*cfg.L {
		return &engine.FormatError{File: confPath, Msg: fmt.Sprintf("num_hidden_layers %d needs %d tensors but %s hold %d; fix num_hidden_layers or the model files",
			cfg.L, 9*cfg.L+2, st.files(), len(st.entries))}
	}
	_, total := engine.Tensors(cfg) // cfg is validated: no overflow
	pad := int64(cfg.Vp-cfg.V) * int64(cfg.C)
	if !cfg.Tied() {
		pad *= 2
	}
	if params, data := int64(total)-pad, st.dataLen(); 2*params > data {
		return &engine.FormatError{File: confPath, Msg: fmt.Sprintf("num_hidden_layers %d, hidden_size %d, intermediate_size %d, num_attention_heads %d, num_key_value_heads %d and vocab_size %d make %d parameters, at least %d bytes, but %s hold %d bytes of tensor data; fix config.json or the model files",
			cfg.L, cfg.C, cfg.F, cfg.NH, cfg.KVHeads(), cfg.V, params, 2*params, st.files(), data)}
	}
	return nil
}

// loadLlama checks st's tensors against the Llama cfg and reads them into
// a new buffer.
func loadLlama(st *tensorSet, cfg engine.ModelConfig) ([]float32, error) {
	badIn := func(e *entry, format string, args ...any) error {
		return &engine.FormatError{File: e.file.Path, Msg: fmt.Sprintf(format, args...)}
	}
	ms, total := llamaMappings(cfg)
	want := make(map[string]int, len(ms)) // name → index in ms
	for i, m := range ms {
		want[m.name] = i
	}
	ignored := make(map[string]bool, cfg.L)
	for l := range cfg.L {
		ignored[fmt.Sprintf("model.layers.%d.self_attn.rotary_emb.inv_freq", l)] = true
	}
	found := make([]*entry, len(ms))
	var tiedHead *entry
	for i := range st.entries { // sorted by name: errors are deterministic
		e := &st.entries[i]
		if ignored[e.Name] {
			continue
		}
		k, ok := want[e.Name]
		if !ok && e.Name == lmHead && cfg.Tied() {
			k, tiedHead = 0, e // checked against the embedding below
		} else if !ok {
			return nil, badIn(e, "unknown tensor %s: not part of a Llama with %d layers (%s)", e.Name, cfg.L, tiedWord(cfg))
		} else {
			found[k] = e
		}
		if !slices.Equal(e.Shape, ms[k].shape) {
			return nil, badIn(e, "tensor %s: shape %v, want %v for %s", e.Name, e.Shape, ms[k].shape, ConfigFile)
		}
		if !safetensors.Float(e.Dtype) {
			return nil, badIn(e, "tensor %s: dtype %s not supported (want F32, F16 or BF16)", e.Name, e.Dtype)
		}
	}
	var missing []string
	for k, e := range found {
		if e == nil {
			missing = append(missing, ms[k].name)
		}
	}
	if len(missing) > 0 {
		return nil, &engine.FormatError{File: st.path, Msg: fmt.Sprintf("missing tensor %s%s (%s)", missing[0], more(len(missing)-1), tiedWord(cfg))}
	}
	params := make([]float32, total)
	for k, m := range ms {
		if err := st.read(*found[k], params[m.off:m.off+m.size()]); err != nil {
			return nil, err
		}
	}
	if tiedHead != nil {
		n := ms[0].size()
		lm := make([]float32, n)
		if err := st.read(*tiedHead, lm); err != nil {
			return nil, err
		}
		wte := params[ms[0].off : ms[0].off+n]
		for i := range lm {
			if math.Float32bits(lm[i]) != math.Float32bits(wte[i]) {
				return nil, badIn(tiedHead, "tensor %s differs from model.embed_tokens.weight (element %d: %g vs %g) but %s says tie_word_embeddings true",
					lmHead, i, lm[i], wte[i], ConfigFile)
			}
		}
	}
	return params, nil
}

// tiedWord says how config.json ties the head, for messages about
// lm_head.weight.
func tiedWord(cfg engine.ModelConfig) string {
	if cfg.Tied() {
		return "tie_word_embeddings true: no lm_head.weight of its own"
	}
	return "tie_word_embeddings false: an lm_head.weight"
}
