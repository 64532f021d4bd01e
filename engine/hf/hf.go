// Package hf converts a model's parameters between gptui's single
// parameter buffer (see [engine.Tensors]) and a Hugging Face transformers
// checkpoint directory: config.json, and model.safetensors or, for a model
// over [MaxShardBytes], shards listed by model.safetensors.index.json
// (modelfile.go). A GPT-2 is a GPT2LMHeadModel (this file), a Llama a
// LlamaForCausalLM (llama.go); config.json's model_type says which.
//
// # Tensor mapping (GPT-2)
//
// transformers' GPT-2 stores its linear layers as Conv1D modules whose
// weight is [in, out], the transpose of llm.c's (out, in):
//
//	transformer.wte.weight               [V, C]     wte rows 0..V-1 (padded rows are not written)
//	transformer.wpe.weight               [maxT, C]  wpe
//	transformer.h.i.ln_1.weight/.bias    [C]        ln1w[i], ln1b[i]
//	transformer.h.i.attn.c_attn.weight   [C, 3C]    qkvw[i]ᵀ
//	transformer.h.i.attn.c_attn.bias     [3C]       qkvb[i]
//	transformer.h.i.attn.c_proj.weight   [C, C]     attprojw[i]ᵀ
//	transformer.h.i.attn.c_proj.bias     [C]        attprojb[i]
//	transformer.h.i.ln_2.weight/.bias    [C]        ln2w[i], ln2b[i]
//	transformer.h.i.mlp.c_fc.weight      [C, F]     fcw[i]ᵀ
//	transformer.h.i.mlp.c_fc.bias        [F]        fcb[i]
//	transformer.h.i.mlp.c_proj.weight    [F, C]     fcprojw[i]ᵀ
//	transformer.h.i.mlp.c_proj.bias      [C]        fcprojb[i]
//	transformer.ln_f.weight/.bias        [C]        lnfw, lnfb
//
// The output projection lm_head.weight is tied to wte: Export leaves it out
// and sets tie_word_embeddings, as transformers' save_pretrained does.
//
// # Tensor mapping (Llama)
//
// LlamaForCausalLM's nn.Linear weights are [out, in] as gptui's, so none
// is transposed; gptui's fused tensors are cut by rows (hd = C/NH):
//
//	model.embed_tokens.weight                       [V, C]       wte rows 0..V-1
//	model.layers.i.input_layernorm.weight           [C]          ln1w[i]
//	model.layers.i.self_attn.q_proj.weight          [NH·hd, C]   qkvw[i] rows 0 … NH·hd−1
//	model.layers.i.self_attn.k_proj.weight          [NKV·hd, C]  qkvw[i] the next NKV·hd rows
//	model.layers.i.self_attn.v_proj.weight          [NKV·hd, C]  qkvw[i] the last NKV·hd rows
//	model.layers.i.self_attn.o_proj.weight          [C, NH·hd]   attprojw[i]
//	model.layers.i.post_attention_layernorm.weight  [C]          ln2w[i]
//	model.layers.i.mlp.gate_proj.weight             [F, C]       fcw[i] rows 0 … F−1
//	model.layers.i.mlp.up_proj.weight               [F, C]       fcw[i] rows F … 2F−1
//	model.layers.i.mlp.down_proj.weight             [C, F]       fcprojw[i]
//	model.norm.weight                               [C]          lnfw
//	lm_head.weight                                  [V, C]       lmhead rows 0..V-1, untied only
//
// Its rotary embeddings pair channel i with i+hd/2 (transformers'
// rotate_half), as gptui's kernels do (kernels.Backend.RoPEForward), so
// q_proj and k_proj are read and written as they are: no permutation.
// (Meta's original checkpoints pair channels 2i and 2i+1; transformers'
// conversion script permutes their rows into this layout, and a folder of
// transformers' is what Import reads.)
//
// # Checking an export with transformers
//
// A directory written by Export loads with
//
//	from transformers import AutoModelForCausalLM
//	model = AutoModelForCausalLM.from_pretrained(dir)
//
// testdata/gpt2_reference.py evaluates an exported GPT-2 with PyTorch alone
// (and with transformers too, where it is installed);
// ../testdata/llama/llama_reference.py --hf computes an exported Llama's
// logits with PyTorch alone.
package hf

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/badinput"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/safetensors"
)

// File names inside a checkpoint directory.
const (
	ModelFile  = "model.safetensors"
	IndexFile  = "model.safetensors.index.json" // a sharded model's: the shard of each tensor
	ConfigFile = "config.json"
)

// MaxShardBytes is the largest model file Export writes, transformers'
// default max_shard_size (5 GB): a larger model is written in shards.
const MaxShardBytes = 5_000_000_000

// prefix is the GPT2Model submodule's name inside GPT2LMHeadModel.
const prefix = "transformer."

// lmHead is the output projection's name, tied to wte.
const lmHead = "lm_head.weight"

// mapping places one Hugging Face tensor in the llm.c parameter buffer.
type mapping struct {
	name      string // Hugging Face name without the "transformer." prefix
	shape     []int  // Hugging Face shape
	off       int    // first element in the llm.c buffer
	transpose bool   // Conv1D weight: shape is [in, out], the buffer holds (out, in)
}

// size is the element count of the tensor.
func (m mapping) size() int {
	n := 1
	for _, d := range m.shape {
		n *= d
	}
	return n
}

// mappings lists the Hugging Face tensors of cfg in state_dict order and the
// size of the llm.c buffer they map into.
func mappings(cfg engine.ModelConfig) ([]mapping, int) {
	ts, total := engine.Tensors(cfg)
	off := make(map[string]int, len(ts))
	per := make(map[string]int, len(ts)) // per-layer size of layered tensors
	for _, t := range ts {
		off[t.Name] = t.Offset
		per[t.Name] = t.Size / cfg.L
	}
	L, C, F := cfg.L, cfg.C, cfg.F
	ms := []mapping{
		{name: "wte.weight", shape: []int{cfg.V, C}, off: off["wte"]},
		{name: "wpe.weight", shape: []int{cfg.MaxT, C}, off: off["wpe"]},
	}
	for l := range L {
		at := func(name string) int { return off[name] + l*per[name] }
		h := fmt.Sprintf("h.%d.", l)
		ms = append(ms,
			mapping{name: h + "ln_1.weight", shape: []int{C}, off: at("ln1w")},
			mapping{name: h + "ln_1.bias", shape: []int{C}, off: at("ln1b")},
			mapping{name: h + "attn.c_attn.weight", shape: []int{C, 3 * C}, off: at("qkvw"), transpose: true},
			mapping{name: h + "attn.c_attn.bias", shape: []int{3 * C}, off: at("qkvb")},
			mapping{name: h + "attn.c_proj.weight", shape: []int{C, C}, off: at("attprojw"), transpose: true},
			mapping{name: h + "attn.c_proj.bias", shape: []int{C}, off: at("attprojb")},
			mapping{name: h + "ln_2.weight", shape: []int{C}, off: at("ln2w")},
			mapping{name: h + "ln_2.bias", shape: []int{C}, off: at("ln2b")},
			mapping{name: h + "mlp.c_fc.weight", shape: []int{C, F}, off: at("fcw"), transpose: true},
			mapping{name: h + "mlp.c_fc.bias", shape: []int{F}, off: at("fcb")},
			mapping{name: h + "mlp.c_proj.weight", shape: []int{F, C}, off: at("fcprojw"), transpose: true},
			mapping{name: h + "mlp.c_proj.bias", shape: []int{C}, off: at("fcprojb")},
		)
	}
	ms = append(ms,
		mapping{name: "ln_f.weight", shape: []int{C}, off: off["lnfw"]},
		mapping{name: "ln_f.bias", shape: []int{C}, off: off["lnfb"]},
	)
	return ms, total
}

// transpose writes the transpose of the rows×cols matrix src into dst.
func transpose(dst, src []float32, rows, cols int) {
	for i := range rows {
		row := src[i*cols : (i+1)*cols]
		for j, v := range row {
			dst[j*rows+i] = v
		}
	}
}

// Export writes dir/config.json and the model's tensors (float32) for
// transformers' GPT2LMHeadModel or, for a Llama, LlamaForCausalLM (see
// the package doc), creating dir if needed: dir/model.safetensors, or
// shards of at most MaxShardBytes and their index when the model is
// larger. params is laid out by engine.Tensors(cfg); the padded vocabulary
// rows are not written. The output is deterministic, and each file is
// replaced atomically.
func Export(dir string, cfg engine.ModelConfig, params []float32) error {
	return ExportShards(dir, cfg, params, MaxShardBytes)
}

// ExportShards is Export with shards of at most maxShard bytes.
func ExportShards(dir string, cfg engine.ModelConfig, params []float32, maxShard int64) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("hf export: %w", err)
	}
	if _, total := exportMappings(cfg); len(params) != total {
		return fmt.Errorf("hf export: %d parameters, the shape %+v has %d", len(params), cfg, total)
	}
	return ExportFrom(dir, cfg, func(off, n int) ([]float32, error) { return params[off : off+n], nil }, maxShard)
}

// A Source reads the elements [off, off+n) of a model's parameters, laid
// out by engine.Tensors: a slice valid until its next call.
type Source func(off, n int) ([]float32, error)

// ExportFrom is [ExportShards] reading the parameters tensor by tensor
// from src: it holds one tensor, and its transpose, at a time, so a model
// is exported from a checkpoint without being loaded whole.
func ExportFrom(dir string, cfg engine.ModelConfig, src Source, maxShard int64) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("hf export: %w", err)
	}
	ms, _ := exportMappings(cfg)
	var conf []byte
	var err error
	if cfg.Family == arch.Llama {
		conf, err = encodeLlamaConfig(cfg)
	} else {
		conf, err = encodeConfig(cfg)
	}
	if err != nil {
		return fmt.Errorf("hf export: %s: %w", ConfigFile, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("hf export: %w", err)
	}

	largest := 0 // of the tensors transposed
	for _, m := range ms {
		if m.transpose {
			largest = max(largest, m.size())
		}
	}
	var scratch []float32 // a transpose; allocated at the first
	ts := make([]outTensor, len(ms))
	for i, m := range ms {
		ts[i] = outTensor{Tensor: safetensors.Tensor{Name: m.name, Shape: m.shape}, values: func() ([]float32, error) {
			n := m.size()
			v, err := src(m.off, n)
			if err != nil || !m.transpose {
				return v, err
			}
			// The buffer holds (out, in) = (shape[1], shape[0]).
			if scratch == nil {
				scratch = make([]float32, largest)
			}
			transpose(scratch[:n], v, m.shape[1], m.shape[0])
			return scratch[:n], nil
		}}
	}
	// config.json first: a folder whose model files are new has the
	// config they go with.
	err = writeFileAtomic(filepath.Join(dir, ConfigFile), func(w io.Writer) error {
		_, err := w.Write(conf)
		return err
	})
	if err != nil {
		return fmt.Errorf("hf export: %w", err)
	}
	if err := writeTensors(dir, ts, maxShard); err != nil {
		return fmt.Errorf("hf export: %w", err)
	}
	return nil
}

// exportMappings are the tensors an export writes, under their names in
// the files, and the size of the buffer they map from.
func exportMappings(cfg engine.ModelConfig) ([]mapping, int) {
	if cfg.Family == arch.Llama {
		return llamaMappings(cfg)
	}
	ms, total := mappings(cfg)
	for i := range ms {
		ms[i].name = prefix + ms[i].name
	}
	return ms, total
}

// Import reads a Hugging Face checkpoint directory, config.json and
// model.safetensors or the shards model.safetensors.index.json lists,
// into the buffer engine.Tensors lays out: a GPT-2 (GPT2LMHeadModel or
// GPT2Model, below) or, when config.json's model_type is "llama" or its
// architectures LlamaForCausalLM, a Llama (importLlama). The padded
// vocabulary rows are zero. Errors about the files are
// *engine.FormatError naming the file and the key or tensor, in one line;
// nothing a header declares is allocated before the files are seen to hold
// it.
func Import(dir string) (engine.ModelConfig, []float32, error) {
	return ImportWith(dir, ImportOptions{})
}

// ImportChecked is [Import] calling check, if not nil, with the shape
// config.json describes once the model files are seen to hold it, before
// anything of the model's size is allocated (a caller's memory check);
// an error from check is returned as it is.
func ImportChecked(dir string, check func(engine.ModelConfig) error) (engine.ModelConfig, []float32, error) {
	return ImportWith(dir, ImportOptions{Check: check})
}

// ImportOptions are what a caller of [ImportWith] hooks into an import.
type ImportOptions struct {
	// Check, if not nil, is called as [ImportChecked] calls it.
	Check func(engine.ModelConfig) error
	// Note, if not nil, is told, a line each, every key config.json
	// leaves out that the import fills with transformers' default (as
	// transformers does when it loads the folder): the import's log.
	Note func(string)
}

// ImportWith is [Import] with the hooks of o. The ModelConfig it returns
// carries config.json's special token ids (TokenIDs), which an export
// writes back.
func ImportWith(dir string, o ImportOptions) (engine.ModelConfig, []float32, error) {
	confPath := filepath.Join(dir, ConfigFile)
	fam, err := family(confPath)
	if err != nil {
		return engine.ModelConfig{}, nil, badinput.Wrap(fmt.Errorf("hf import: %w", err))
	}
	if fam == arch.Llama {
		return importLlama(dir, o)
	}
	return importGPT2(dir, o)
}

// importGPT2 reads a Hugging Face GPT-2 checkpoint directory into the
// buffer engine.Tensors lays out. The padded vocabulary rows of wte are
// zero. Dropout rates come from resid_pdrop and attn_pdrop
// (transformers' default 0.1 where absent); embd_pdrop is not read.
//
// Tensor names may carry the "transformer." prefix (GPT2LMHeadModel) or not
// (GPT2Model). F32 tensors are read as they are; F16 and BF16 tensors are
// widened to float32, which is exact. The attention mask buffers attn.bias
// and attn.masked_bias of older checkpoints are ignored, and so is an
// lm_head.weight equal to wte; an lm_head.weight that differs from it is an
// error, since gptui ties the output projection to wte. Any other tensor,
// a missing one, a shape that does not match config.json or another dtype
// is an error naming the file and tensor; format errors are
// *engine.FormatError.
func importGPT2(dir string, o ImportOptions) (engine.ModelConfig, []float32, error) {
	check := o.Check
	confPath := filepath.Join(dir, ConfigFile)
	// The directory the user named must hold both files.
	cfg, untied, err := readConfig(confPath, o.Note)
	if err != nil {
		return engine.ModelConfig{}, nil, badinput.Wrap(fmt.Errorf("hf import: %w", err))
	}
	st, err := openTensors(dir)
	if err != nil {
		return engine.ModelConfig{}, nil, badinput.Wrap(fmt.Errorf("hf import: %w", err))
	}
	defer st.Close()
	if err := fits(st, cfg, confPath); err != nil {
		return engine.ModelConfig{}, nil, fmt.Errorf("hf import: %w", err)
	}
	if check != nil {
		if err := check(cfg); err != nil {
			return engine.ModelConfig{}, nil, err
		}
	}
	params, err := load(st, cfg, untied)
	if err != nil {
		return engine.ModelConfig{}, nil, fmt.Errorf("hf import: %w", err)
	}
	return cfg, params, nil
}

// fits checks, before anything of the model's size is allocated, that st
// can hold the model config.json (at confPath) describes: at least as many
// tensors as layers (each has 12; [load] names the ones missing), and at
// least 2 bytes (F16 or BF16) for each of its parameters but the padded
// vocabulary rows.
func fits(st *tensorSet, cfg engine.ModelConfig, confPath string) error {
	if len(st.entries) < cfg.L {
		return &engine.FormatError{File: confPath, Msg: fmt.Sprintf("n_layer %d needs %d tensors but %s hold %d; fix n_layer or the model file",
			cfg.L, 12*cfg.L+4, st.files(), len(st.entries))}
	}
	_, total := engine.Tensors(cfg) // cfg is validated: no overflow
	params := int64(total) - int64(cfg.Vp-cfg.V)*int64(cfg.C)
	if data := st.dataLen(); 2*params > data {
		return &engine.FormatError{File: confPath, Msg: fmt.Sprintf("n_layer %d, n_embd %d, n_inner %d, vocab_size %d and n_positions %d make %d parameters, at least %d bytes, but %s hold %d bytes of tensor data; fix config.json or the model file",
			cfg.L, cfg.C, cfg.F, cfg.V, cfg.MaxT, params, 2*params, st.files(), data)}
	}
	return nil
}

// load checks st's tensors against cfg and reads them into a new buffer.
func load(st *tensorSet, cfg engine.ModelConfig, untied bool) ([]float32, error) {
	bad := func(format string, args ...any) error {
		return &engine.FormatError{File: st.path, Msg: fmt.Sprintf(format, args...)}
	}
	badIn := func(e *entry, format string, args ...any) error {
		return &engine.FormatError{File: e.file.Path, Msg: fmt.Sprintf(format, args...)}
	}
	ms, total := mappings(cfg)
	want := make(map[string]int, len(ms)) // name → index in ms
	for i, m := range ms {
		want[m.name] = i
	}
	ignored := make(map[string]bool, 2*cfg.L)
	for l := range cfg.L {
		ignored[fmt.Sprintf("h.%d.attn.bias", l)] = true
		ignored[fmt.Sprintf("h.%d.attn.masked_bias", l)] = true
	}

	found := make([]*entry, len(ms))
	var head *entry
	var unknown []*entry
	for i := range st.entries { // sorted by name: errors are deterministic
		e := &st.entries[i]
		if e.Name == lmHead {
			head = e
			continue
		}
		name := strings.TrimPrefix(e.Name, prefix)
		if ignored[name] {
			continue
		}
		k, ok := want[name]
		if !ok {
			unknown = append(unknown, e)
			continue
		}
		if found[k] != nil {
			return nil, badIn(e, "tensor %s appears twice, as %s and %s", name, found[k].Name, e.Name)
		}
		if !slices.Equal(e.Shape, ms[k].shape) {
			return nil, badIn(e, "tensor %s: shape %v, want %v for %s", e.Name, e.Shape, ms[k].shape, ConfigFile)
		}
		if !safetensors.Float(e.Dtype) {
			return nil, badIn(e, "tensor %s: dtype %s not supported (want F32, F16 or BF16)", e.Name, e.Dtype)
		}
		found[k] = e
	}
	if len(unknown) > 0 {
		return nil, badIn(unknown[0], "unknown tensor %s%s: not part of a GPT-2 with %d layers", unknown[0].Name, more(len(unknown)-1), cfg.L)
	}
	var missing []string
	for k, e := range found {
		if e == nil {
			missing = append(missing, prefix+ms[k].name)
		}
	}
	if len(missing) > 0 {
		return nil, bad("missing tensor %s%s", missing[0], more(len(missing)-1))
	}
	if head != nil {
		if !slices.Equal(head.Shape, ms[0].shape) {
			return nil, badIn(head, "tensor %s: shape %v, want %v (tied to wte)", head.Name, head.Shape, ms[0].shape)
		}
		if !safetensors.Float(head.Dtype) {
			return nil, badIn(head, "tensor %s: dtype %s not supported (want F32, F16 or BF16)", head.Name, head.Dtype)
		}
	} else if untied {
		return nil, bad("config declares tie_word_embeddings false but there is no %s", lmHead)
	}

	params := make([]float32, total)
	var scratch []float32
	for k, m := range ms {
		n := m.size()
		dst := params[m.off : m.off+n]
		if !m.transpose {
			if err := st.read(*found[k], dst); err != nil {
				return nil, err
			}
			continue
		}
		if cap(scratch) < n {
			scratch = make([]float32, n)
		}
		if err := st.read(*found[k], scratch[:n]); err != nil {
			return nil, err
		}
		// The file holds [in, out] = shape; the buffer (out, in).
		transpose(dst, scratch[:n], m.shape[0], m.shape[1])
	}
	if head != nil {
		n := ms[0].size()
		lm := make([]float32, n)
		if err := st.read(*head, lm); err != nil {
			return nil, err
		}
		wte := params[ms[0].off : ms[0].off+n]
		for i := range lm {
			if math.Float32bits(lm[i]) != math.Float32bits(wte[i]) {
				return nil, badIn(head, "tensor %s differs from wte (element %d: %g vs %g): untied output embeddings are not supported", head.Name, i, lm[i], wte[i])
			}
		}
	}
	return params, nil
}

// more describes n further items of a list cut to its first.
func more(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (and %d more)", n)
}
