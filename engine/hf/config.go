package hf

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/engine"
)

// gpt2Token is GPT-2's <|endoftext|>, its BOS and EOS token.
const gpt2Token = 50256

// layerNormEps is the LayerNorm epsilon of GPT-2 and of gptui's kernels.
const layerNormEps = 1e-5

// f32 is a float32 written in JSON with the fewest digits that read back to
// the same float32 (0.1, not 0.10000000149011612).
type f32 float32

// MarshalJSON implements json.Marshaler.
func (v f32) MarshalJSON() ([]byte, error) {
	f := float64(v)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, fmt.Errorf("unsupported value %v", f)
	}
	return strconv.AppendFloat(nil, f, 'g', -1, 32), nil
}

// exportConfig is the config.json Export writes. The field order is the
// key order of the file.
type exportConfig struct {
	Architectures      []string        `json:"architectures"`
	ModelType          string          `json:"model_type"`
	VocabSize          int             `json:"vocab_size"`
	NPositions         int             `json:"n_positions"`
	NCtx               int             `json:"n_ctx"`
	NEmbd              int             `json:"n_embd"`
	NLayer             int             `json:"n_layer"`
	NHead              int             `json:"n_head"`
	NInner             *int            `json:"n_inner"` // null means 4·n_embd
	ActivationFunction string          `json:"activation_function"`
	LayerNormEpsilon   json.Number     `json:"layer_norm_epsilon"`
	ResidPdrop         f32             `json:"resid_pdrop"`
	EmbdPdrop          f32             `json:"embd_pdrop"`
	AttnPdrop          f32             `json:"attn_pdrop"`
	InitializerRange   json.Number     `json:"initializer_range"`
	BosTokenID         json.RawMessage `json:"bos_token_id"`
	EosTokenID         json.RawMessage `json:"eos_token_id"`
	PadTokenID         json.RawMessage `json:"pad_token_id,omitempty"`
	TieWordEmbeddings  bool            `json:"tie_word_embeddings"`
	TorchDtype         string          `json:"torch_dtype"`
}

// encodeConfig returns config.json for cfg: 2-space indented, newline
// terminated, keys in a fixed order; its token ids as exportTokenIDs says.
func encodeConfig(cfg engine.ModelConfig) ([]byte, error) {
	c := exportConfig{
		Architectures:      []string{"GPT2LMHeadModel"},
		ModelType:          "gpt2",
		VocabSize:          cfg.V,
		NPositions:         cfg.MaxT,
		NCtx:               cfg.MaxT,
		NEmbd:              cfg.C,
		NLayer:             cfg.L,
		NHead:              cfg.NH,
		ActivationFunction: "gelu_new",
		LayerNormEpsilon:   "1e-05",
		ResidPdrop:         f32(cfg.HiddenDropout),
		EmbdPdrop:          f32(cfg.HiddenDropout),
		AttnPdrop:          f32(cfg.AttnDropout),
		InitializerRange:   "0.02",
		TieWordEmbeddings:  true,
		TorchDtype:         "float32",
	}
	c.BosTokenID, c.EosTokenID, c.PadTokenID = exportTokenIDs(cfg)
	if cfg.F != 4*cfg.C {
		f := cfg.F
		c.NInner = &f
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// importConfig is the part of a transformers GPT2Config that Import reads.
// Pointers tell a missing key from a zero.
type importConfig struct {
	tokenIDKeys
	ModelType                  string   `json:"model_type"`
	VocabSize                  *int     `json:"vocab_size"`
	NPositions                 *int     `json:"n_positions"`
	NCtx                       *int     `json:"n_ctx"`
	NEmbd                      *int     `json:"n_embd"`
	NLayer                     *int     `json:"n_layer"`
	NHead                      *int     `json:"n_head"`
	NInner                     *int     `json:"n_inner"`
	ActivationFunction         *string  `json:"activation_function"`
	LayerNormEpsilon           *float64 `json:"layer_norm_epsilon"`
	ResidPdrop                 *float64 `json:"resid_pdrop"`
	AttnPdrop                  *float64 `json:"attn_pdrop"`
	TieWordEmbeddings          *bool    `json:"tie_word_embeddings"`
	ScaleAttnWeights           *bool    `json:"scale_attn_weights"`
	ScaleAttnByInverseLayerIdx bool     `json:"scale_attn_by_inverse_layer_idx"`
}

// hfNames name the sizes of a ModelConfig by their config.json keys.
var hfNames = engine.ShapeNames{MaxT: "n_positions", V: "vocab_size", L: "n_layer", NH: "n_head", C: "n_embd", F: "n_inner"}

// readConfig reads a transformers GPT-2 config.json into a ModelConfig and
// reports whether the config declares the output embedding untied. The
// sizes of the weights must be there; n_positions (else n_ctx),
// resid_pdrop, attn_pdrop, bos_token_id and eos_token_id left out take
// GPT2Config's defaults (1024, 0.1, 0.1, 50256, 50256), as transformers
// applies them, and note, if not nil, is told each.
func readConfig(path string, note func(string)) (engine.ModelConfig, bool, error) {
	b, err := readConfigFile(path)
	if err != nil {
		return engine.ModelConfig{}, false, err
	}
	bad := func(format string, args ...any) error {
		return &engine.FormatError{File: path, Msg: fmt.Sprintf(format, args...)}
	}
	var c importConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return engine.ModelConfig{}, false, bad("not a GPT-2 config: %v", err)
	}
	if c.ModelType != "" && c.ModelType != "gpt2" {
		return engine.ModelConfig{}, false, bad("model_type %q is not gpt2", c.ModelType)
	}
	if c.NPositions == nil {
		c.NPositions = c.NCtx
	}
	for _, f := range []struct {
		key string
		v   *int
	}{{"vocab_size", c.VocabSize}, {"n_embd", c.NEmbd}, {"n_layer", c.NLayer}, {"n_head", c.NHead}} {
		if f.v == nil {
			return engine.ModelConfig{}, false, bad("missing %s, which sizes the weights: write it into the file", f.key)
		}
	}
	dflt := defaulter{file: path, class: "GPT2Config", note: note}
	dflt.int(&c.NPositions, "n_positions", 1024, "")
	dflt.float(&c.ResidPdrop, "resid_pdrop", 0.1)
	dflt.float(&c.AttnPdrop, "attn_pdrop", 0.1)
	gpt2 := strconv.Itoa(gpt2Token)
	ids, err := dflt.tokenIDs(c.tokenIDKeys, gpt2, gpt2)
	if err != nil {
		return engine.ModelConfig{}, false, err
	}
	// gptui's kernels compute GELU with the tanh approximation, LayerNorm
	// with ε = 1e-5 and attention scaled by 1/√head_size: a config asking
	// for anything else would import into a different function.
	if a := c.ActivationFunction; a != nil && *a != "gelu_new" && *a != "gelu_pytorch_tanh" {
		return engine.ModelConfig{}, false, bad("activation_function %q not supported (want gelu_new, GELU's tanh approximation)", *a)
	}
	if e := c.LayerNormEpsilon; e != nil && math.Abs(*e-layerNormEps) > 1e-12 {
		return engine.ModelConfig{}, false, bad("layer_norm_epsilon %g not supported (want %g)", *e, layerNormEps)
	}
	if (c.ScaleAttnWeights != nil && !*c.ScaleAttnWeights) || c.ScaleAttnByInverseLayerIdx {
		return engine.ModelConfig{}, false, bad("attention scaling other than 1/sqrt(head_size) not supported")
	}
	cfg := engine.ModelConfig{Shape: arch.Shape{
		MaxT: *c.NPositions,
		V:    *c.VocabSize,
		L:    *c.NLayer,
		NH:   *c.NHead,
		C:    *c.NEmbd,
		F:    4 * *c.NEmbd,
	}, HiddenDropout: float32(*c.ResidPdrop), AttnDropout: float32(*c.AttnPdrop), TokenIDs: ids}
	cfg.Vp = arch.PadVocab(cfg.V)
	if c.NInner != nil {
		cfg.F = *c.NInner
	}
	if err := cfg.ValidateNamed(hfNames); err != nil {
		return engine.ModelConfig{}, false, bad("%v", err)
	}
	untied := c.TieWordEmbeddings != nil && !*c.TieWordEmbeddings
	return cfg, untied, nil
}

// maxConfigLen bounds config.json (a Llama 3's is under 1 KB; models with
// label maps run to some hundred KB).
const maxConfigLen = 16 << 20

// readConfigFile reads the config.json at path, refusing, before it reads
// it, a file larger than maxConfigLen: a sparse or hostile file cannot
// make Import allocate its size.
func readConfigFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > maxConfigLen {
		return nil, &engine.FormatError{File: path, Msg: fmt.Sprintf("%d bytes, more than the %d a model config has room for; not a config.json?", fi.Size(), maxConfigLen)}
	}
	b, err := io.ReadAll(io.LimitReader(f, maxConfigLen+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxConfigLen {
		return nil, &engine.FormatError{File: path, Msg: fmt.Sprintf("more than the %d bytes a model config has room for; not a config.json?", maxConfigLen)}
	}
	return b, nil
}
