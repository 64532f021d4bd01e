package hf

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/safetensors"
	"github.com/gptui/gptui/internal/allocbound"
	"github.com/gptui/gptui/internal/torchtest"
	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
)

// llamaTied is a tied Llama with 4 query heads sharing 2 key/value heads.
var llamaTied = engine.ModelConfig{Shape: arch.Shape{Family: arch.Llama, MaxT: 32, V: 37, Vp: 128, L: 2, NH: 4, C: 16, F: 24, NKV: 2},
	NormEps: 1e-5, RoPE: kernels.RoPE{Theta: 10000}}

// llamaUntied is an untied Llama with one key/value head, Llama 3's
// rotary scaling and attention dropout.
var llamaUntied = engine.ModelConfig{Shape: arch.Shape{Family: arch.Llama, MaxT: 64, V: 130, Vp: 256, L: 3, NH: 4, C: 16, F: 40, NKV: 1, Untied: true},
	AttnDropout: 0.1, NormEps: 1e-6, RoPE: kernels.RoPE{Theta: 500000, Scaling: &kernels.RoPEScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 16}}}

// modelFiles lists the model files of dir: model.safetensors, or the
// index and its shards.
func modelFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if e.Name() != ConfigFile {
			names = append(names, e.Name())
		}
	}
	return names
}

// padded reports whether element i of a buffer laid out for cfg is a
// padded vocabulary row (of wte, or of an untied lmhead), which neither
// format holds.
func padded(t *testing.T, cfg engine.ModelConfig, i int) bool {
	for _, name := range []string{"wte", "lmhead"} {
		if name == "lmhead" && cfg.Tied() {
			continue
		}
		x := tensorOf(t, cfg, name)
		if i >= x.Offset+cfg.V*cfg.C && i < x.Offset+x.Size {
			return true
		}
	}
	return false
}

// TestLlamaRoundTrip: a Llama exported, in one file or in shards, imports
// with its config and bit-identical tensors (the padded vocabulary rows
// zero), and exporting the import again writes the same bytes; a GPT-2
// alike in shards.
func TestLlamaRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      engine.ModelConfig
		maxShard int64
		shards   int // 0: one model.safetensors
	}{
		{"tied one file", llamaTied, MaxShardBytes, 0},
		{"untied shards", llamaUntied, 8 << 10, 6},
		{"gpt2 shards", testCfg, 2 << 10, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := []string{ModelFile}
			if tc.shards > 0 {
				files = nil
				for i := range tc.shards {
					files = append(files, fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, tc.shards))
				}
				files = append(files, IndexFile)
			}
			params := randomParams(tc.cfg, 1, 7)
			dir := t.TempDir()
			if err := ExportShards(dir, tc.cfg, params, tc.maxShard); err != nil {
				t.Fatal(err)
			}
			if got := modelFiles(t, dir); !slices.Equal(got, files) {
				t.Errorf("model files %v, want %v", got, files)
			}
			cfg, got, err := Import(dir)
			if err != nil {
				t.Fatal(err)
			}
			if want := imported(tc.cfg); !reflect.DeepEqual(cfg, want) {
				t.Errorf("config %+v, want %+v", cfg, want)
			}
			if len(got) != len(params) {
				t.Fatalf("%d parameters, want %d", len(got), len(params))
			}
			for i, v := range params {
				if padded(t, tc.cfg, i) {
					v = 0
				}
				if math.Float32bits(got[i]) != math.Float32bits(v) {
					t.Fatalf("parameter %d: %g, want %g", i, got[i], v)
				}
			}
			again := t.TempDir()
			if err := ExportShards(again, cfg, got, tc.maxShard); err != nil {
				t.Fatal(err)
			}
			for _, f := range append(files, ConfigFile) {
				if a, b := readFile(t, filepath.Join(dir, f)), readFile(t, filepath.Join(again, f)); string(a) != string(b) {
					t.Errorf("%s differs after import and export (%d vs %d bytes)", f, len(a), len(b))
				}
			}
		})
	}
}

// TestExportReplacesModelFiles: exporting in shards over a folder that
// holds one model file, and in one file over shards, leaves only the new
// model files, which import.
func TestExportReplacesModelFiles(t *testing.T) {
	dir := t.TempDir()
	p := randomParams(llamaUntied, 1, 8)
	if err := Export(dir, llamaUntied, p); err != nil {
		t.Fatal(err)
	}
	if err := ExportShards(dir, llamaUntied, p, 8<<10); err != nil {
		t.Fatal(err)
	}
	if got := modelFiles(t, dir); len(got) != 7 || slices.Contains(got, ModelFile) {
		t.Errorf("after a sharded export over one file: %v", got)
	}
	if _, _, err := Import(dir); err != nil {
		t.Error(err)
	}
	if err := Export(dir, llamaUntied, p); err != nil {
		t.Fatal(err)
	}
	if got := modelFiles(t, dir); !slices.Equal(got, []string{ModelFile}) {
		t.Errorf("after a one-file export over shards: %v", got)
	}
	if _, _, err := Import(dir); err != nil {
		t.Error(err)
	}
}

// readExported reads every tensor of an exported folder (one file or
// shards) with the tests' own parser, by name.
func readExported(t *testing.T, dir string) map[string]*rawTensor {
	t.Helper()
	all := map[string]*rawTensor{}
	for _, f := range modelFiles(t, dir) {
		if f == IndexFile {
			continue
		}
		_, ts, _ := parseFile(t, filepath.Join(dir, f))
		for name, x := range ts {
			all[name] = x
		}
	}
	return all
}

// TestLlamaExportMapping checks element by element that each Hugging Face
// tensor holds the rows of the gptui tensor it should: q_proj, k_proj and
// v_proj the rows of qkvw one after another, gate_proj and up_proj those
// of fcw, the others whole (no transpose: nn.Linear is [out, in] as gptui).
// A round trip cannot see this: a consistent error would survive it.
func TestLlamaExportMapping(t *testing.T) {
	for _, cfg := range []engine.ModelConfig{llamaTied, llamaUntied} {
		params := randomParams(cfg, 1, 9)
		dir := t.TempDir()
		if err := ExportShards(dir, cfg, params, 8<<10); err != nil {
			t.Fatal(err)
		}
		ts := readExported(t, dir)
		C, F, hd, nkv := cfg.C, cfg.F, cfg.C/cfg.NH, cfg.KVHeads()
		type check struct {
			hf       string
			ours     string
			layered  bool
			row, end int // the rows of ours (of a layer's slice) the HF tensor holds
		}
		checks := []check{
			{"model.embed_tokens.weight", "wte", false, 0, cfg.V},
			{"model.norm.weight", "lnfw", false, 0, 1},
			{"input_layernorm.weight", "ln1w", true, 0, 1},
			{"self_attn.q_proj.weight", "qkvw", true, 0, cfg.NH * hd},
			{"self_attn.k_proj.weight", "qkvw", true, cfg.NH * hd, (cfg.NH + nkv) * hd},
			{"self_attn.v_proj.weight", "qkvw", true, (cfg.NH + nkv) * hd, (cfg.NH + 2*nkv) * hd},
			{"self_attn.o_proj.weight", "attprojw", true, 0, C},
			{"post_attention_layernorm.weight", "ln2w", true, 0, 1},
			{"mlp.gate_proj.weight", "fcw", true, 0, F},
			{"mlp.up_proj.weight", "fcw", true, F, 2 * F},
			{"mlp.down_proj.weight", "fcprojw", true, 0, C},
		}
		want := 2 + 9*cfg.L
		if !cfg.Tied() {
			checks = append(checks, check{"lm_head.weight", "lmhead", false, 0, cfg.V})
			want++
		}
		if len(ts) != want {
			t.Errorf("%d tensors, want %d", len(ts), want)
		}
		for _, c := range checks {
			ours := tensorOf(t, cfg, c.ours)
			layers, shape := 1, ours.Shape
			if c.layered {
				layers, shape = cfg.L, ours.Shape[1:]
			}
			cols := 1
			for _, d := range shape[1:] {
				cols *= d
			}
			if len(shape) == 1 {
				cols = shape[0]
			}
			for l := range layers {
				name := c.hf
				if c.layered {
					name = fmt.Sprintf("model.layers.%d.%s", l, c.hf)
				}
				x, ok := ts[name]
				if !ok {
					t.Fatalf("no tensor %s", name)
				}
				base := ours.Offset + l*(ours.Size/layers) + c.row*cols
				n := (c.end - c.row) * cols
				if len(x.data) != 4*n {
					t.Fatalf("%s: %d bytes, want %d", name, len(x.data), 4*n)
				}
				for k := range n {
					if got := math.Float32frombits(binary.LittleEndian.Uint32(x.data[4*k:])); got != params[base+k] {
						t.Fatalf("%s[%d] = %g, want %s = %g", name, k, got, c.ours, params[base+k])
					}
				}
			}
		}
	}
}

func TestLlamaConfigJSON(t *testing.T) {
	dir := t.TempDir()
	_, n := engine.Tensors(llamaUntied)
	if err := Export(dir, llamaUntied, make([]float32, n)); err != nil {
		t.Fatal(err)
	}
	want := `{
  "architectures": [
    "LlamaForCausalLM"
  ],
  "model_type": "llama",
  "vocab_size": 130,
  "hidden_size": 16,
  "intermediate_size": 40,
  "num_hidden_layers": 3,
  "num_attention_heads": 4,
  "num_key_value_heads": 1,
  "head_dim": 4,
  "hidden_act": "silu",
  "max_position_embeddings": 64,
  "rms_norm_eps": 1e-06,
  "rope_theta": 500000,
  "rope_scaling": {
    "rope_type": "llama3",
    "factor": 8,
    "low_freq_factor": 1,
    "high_freq_factor": 4,
    "original_max_position_embeddings": 16
  },
  "attention_bias": false,
  "attention_dropout": 0.1,
  "mlp_bias": false,
  "pretraining_tp": 1,
  "tie_word_embeddings": false,
  "initializer_range": 0.02,
  "bos_token_id": null,
  "eos_token_id": null,
  "use_cache": true,
  "torch_dtype": "float32"
}
`
	if got := string(readFile(t, filepath.Join(dir, ConfigFile))); got != want {
		t.Errorf("config.json:\n%s\nwant:\n%s", got, want)
	}
}

// llamaExported writes the Llama cfg with parameters k/8 (exact in F16
// and BF16) as one file and returns its folder and parameters (padded rows
// zero).
func llamaExported(t *testing.T, cfg engine.ModelConfig) (string, []float32) {
	t.Helper()
	_, n := engine.Tensors(cfg)
	params := make([]float32, n)
	r := rand.New(rand.NewPCG(5, 6))
	for i := range params {
		if !padded(t, cfg, i) {
			params[i] = float32(r.IntN(129)-64) / 8
		}
	}
	dir := t.TempDir()
	if err := Export(dir, cfg, params); err != nil {
		t.Fatal(err)
	}
	return dir, params
}

// TestLlamaImportVariants: what transformers' own folders hold imports
// alike: BF16 tensors, older checkpoints' rotary inv_freq buffers, a tied
// lm_head.weight saved beside the embedding, a config with only the keys
// LlamaConfig requires (its defaults for the rest), rope_scaling's older
// "type" key.
func TestLlamaImportVariants(t *testing.T) {
	mha := llamaTied
	mha.NKV, mha.NormEps, mha.Untied = 4, 1e-6, true
	tests := []struct {
		name    string
		cfg     engine.ModelConfig // as exported
		want    engine.ModelConfig // as imported
		config  func(c map[string]any)
		tensors func(f *tensorFile)
	}{
		{"BF16", llamaTied, llamaTied, nil, func(f *tensorFile) {
			f.mapTensors(func(b []byte) (string, []byte) {
				out := make([]byte, len(b)/2)
				for i := range len(b) / 4 {
					copy(out[2*i:], b[4*i+2:4*i+4]) // the high half of each float32
				}
				return "BF16", out
			})
		}},
		{"inv_freq buffers", llamaUntied, llamaUntied, nil, func(f *tensorFile) {
			for l := range llamaUntied.L {
				f.set(fmt.Sprintf("model.layers.%d.self_attn.rotary_emb.inv_freq", l), "F32", []int{2}, make([]byte, 8))
			}
		}},
		{"tied lm_head saved", llamaTied, llamaTied, nil, func(f *tensorFile) {
			e := f.ts["model.embed_tokens.weight"]
			f.set(lmHead, "F32", e.Shape, e.data)
		}},
		{"LlamaConfig defaults", mha, mha, func(c map[string]any) {
			for _, k := range []string{"num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "attention_bias",
				"attention_dropout", "mlp_bias", "pretraining_tp", "tie_word_embeddings", "hidden_act", "model_type"} {
				delete(c, k)
			}
		}, nil},
		{"rope_scaling type", llamaUntied, llamaUntied, func(c map[string]any) {
			rs := c["rope_scaling"].(map[string]any)
			rs["type"] = rs["rope_type"]
			delete(rs, "rope_type")
		}, nil},
		{"rope_scaling default", llamaTied, llamaTied, func(c map[string]any) {
			c["rope_scaling"] = map[string]any{"rope_type": "default"}
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, params := llamaExported(t, tt.cfg)
			if tt.config != nil {
				editJSON(t, filepath.Join(dir, ConfigFile), tt.config)
			}
			if tt.tensors != nil {
				path := filepath.Join(dir, ModelFile)
				f := loadTensorFile(t, path)
				tt.tensors(f)
				f.write(t, path)
			}
			cfg, got, err := Import(dir)
			if err != nil {
				t.Fatal(err)
			}
			if want := imported(tt.want); !reflect.DeepEqual(cfg, want) {
				t.Errorf("config %+v, want %+v", cfg, want)
			}
			if !slices.Equal(got, params) {
				t.Error("parameters differ from the exported ones")
			}
		})
	}
}

// editJSON rewrites the JSON object at path through edit.
func editJSON(t *testing.T, path string, edit func(c map[string]any)) {
	t.Helper()
	var c map[string]any
	if err := json.Unmarshal(readFile(t, path), &c); err != nil {
		t.Fatal(err)
	}
	edit(c)
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	writeBytes(t, filepath.Dir(path), filepath.Base(path), b)
}

// TestLlamaImportErrors: each bad folder is a one-line *engine.FormatError
// (a missing file: the os error) naming the file and the key or tensor.
func TestLlamaImportErrors(t *testing.T) {
	const shard1 = "model-00001-of-00006.safetensors"
	sharded := func(t *testing.T) string {
		dir := t.TempDir()
		if err := ExportShards(dir, llamaUntied, randomParams(llamaUntied, 1, 3), 8<<10); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	one := func(t *testing.T) string { d, _ := llamaExported(t, llamaTied); return d }
	config := func(edit func(c map[string]any)) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) { editJSON(t, filepath.Join(dir, ConfigFile), edit) }
	}
	index := func(edit func(wm map[string]any)) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			editJSON(t, filepath.Join(dir, IndexFile), func(c map[string]any) { edit(c["weight_map"].(map[string]any)) })
		}
	}
	tensors := func(edit func(f *tensorFile)) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			path := filepath.Join(dir, ModelFile)
			f := loadTensorFile(t, path)
			edit(f)
			f.write(t, path)
		}
	}
	tests := []struct {
		name   string
		dir    func(t *testing.T) string
		mutate func(t *testing.T, dir string)
		want   []string
		format bool
	}{
		{"no model files", one, func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, ModelFile)) },
			[]string{ModelFile, "no such file", "nor " + IndexFile}, false},
		{"hidden_act", one, config(func(c map[string]any) { c["hidden_act"] = "gelu" }), []string{ConfigFile, `hidden_act "gelu"`}, true},
		{"biases", one, config(func(c map[string]any) { c["attention_bias"] = true }), []string{ConfigFile, "attention_bias"}, true},
		{"head_dim", one, config(func(c map[string]any) { c["head_dim"] = 8 }), []string{ConfigFile, "head_dim 8"}, true},
		{"missing size", one, config(func(c map[string]any) { delete(c, "intermediate_size") }), []string{ConfigFile, "missing intermediate_size"}, true},
		{"key/value heads", one, config(func(c map[string]any) { c["num_key_value_heads"] = 3 }), []string{ConfigFile, "num_key_value_heads 3 does not divide num_attention_heads 4"}, true},
		{"rope_scaling yarn", one, config(func(c map[string]any) { c["rope_scaling"] = map[string]any{"rope_type": "yarn", "factor": 4} }),
			[]string{ConfigFile, `rope_type "yarn"`}, true},
		{"rope_scaling incomplete", one, config(func(c map[string]any) { c["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": 8} }),
			[]string{ConfigFile, "rope_scaling llama3 needs"}, true},
		{"rope_theta", one, config(func(c map[string]any) { c["rope_theta"] = -1 }), []string{ConfigFile, "hidden_size 16 and num_attention_heads 4", "heta"}, true},
		{"rms_norm_eps", one, config(func(c map[string]any) { c["rms_norm_eps"] = 0 }), []string{ConfigFile, "rms_norm_eps"}, true},
		{"size not a number", one, config(func(c map[string]any) { c["hidden_size"] = "16" }), []string{ConfigFile, "not a Llama config", "hidden_size"}, true},
		{"too few bytes", one, config(func(c map[string]any) { c["num_hidden_layers"] = 1000 }), []string{ConfigFile, "num_hidden_layers 1000 needs 9002 tensors"}, true},
		{"untied without lm_head", one, config(func(c map[string]any) { c["tie_word_embeddings"] = false }),
			[]string{ModelFile, "missing tensor lm_head.weight", "tie_word_embeddings false"}, true},
		{"tied lm_head differs", one, tensors(func(f *tensorFile) {
			e := f.ts["model.embed_tokens.weight"]
			data := slices.Clone(e.data)
			data[40] ^= 1
			f.set(lmHead, "F32", e.Shape, data)
		}), []string{ModelFile, "lm_head.weight differs from model.embed_tokens.weight (element 10", "tie_word_embeddings true"}, true},
		{"missing tensor", one, tensors(func(f *tensorFile) { f.remove("model.layers.1.mlp.up_proj.weight") }),
			[]string{ModelFile, "missing tensor model.layers.1.mlp.up_proj.weight"}, true},
		{"unknown tensor", one, tensors(func(f *tensorFile) {
			f.set("model.layers.0.self_attn.q_proj.bias", "F32", []int{16}, make([]byte, 64))
		}), []string{ModelFile, "unknown tensor model.layers.0.self_attn.q_proj.bias"}, true},
		{"wrong shape", one, tensors(func(f *tensorFile) { f.ts["model.layers.0.self_attn.k_proj.weight"].Shape = []int{16, 8} }),
			[]string{ModelFile, "model.layers.0.self_attn.k_proj.weight", "shape [16 8], want [8 16]"}, true},
		{"bad dtype", one, tensors(func(f *tensorFile) { f.set("model.norm.weight", "I32", []int{16}, make([]byte, 64)) }),
			[]string{ModelFile, "model.norm.weight", "dtype I32"}, true},
		{"index not JSON", sharded, func(t *testing.T, dir string) { writeBytes(t, dir, IndexFile, []byte("{")) },
			[]string{IndexFile, "not a safetensors index"}, true},
		{"index without weight_map", sharded, func(t *testing.T, dir string) { writeBytes(t, dir, IndexFile, []byte(`{"metadata":{}}`)) },
			[]string{IndexFile, "no weight_map"}, true},
		{"shard outside the folder", sharded, index(func(wm map[string]any) { wm["model.norm.weight"] = "../" + shard1 }),
			[]string{IndexFile, "model.norm.weight", `"../` + shard1 + `"`, "not a .safetensors file of this folder"}, true},
		{"shard missing", sharded, func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, shard1)) },
			[]string{IndexFile, "model.embed_tokens.weight", shard1, "no such file"}, true},
		{"tensor in another shard", sharded, index(func(wm map[string]any) { wm["model.layers.0.mlp.up_proj.weight"] = "model-00003-of-00006.safetensors" }),
			[]string{IndexFile, "model-00002-of-00006.safetensors holds tensor model.layers.0.mlp.up_proj.weight", `weight_map puts in "model-00003-of-00006.safetensors"`}, true},
		{"shard of no tensor", sharded, index(func(wm map[string]any) { wm["model.embed_tokens.weight"] = "model-00002-of-00006.safetensors" }),
			[]string{IndexFile, "weight_map puts tensor model.embed_tokens.weight in model-00002-of-00006.safetensors, which does not hold it"}, true},
		{"tensor not in its shard", sharded, index(func(wm map[string]any) { wm["model.layers.9.mlp.up_proj.weight"] = shard1 }),
			[]string{IndexFile, "weight_map puts tensor model.layers.9.mlp.up_proj.weight in " + shard1 + ", which does not hold it"}, true},
		{"shard not safetensors", sharded, func(t *testing.T, dir string) { writeBytes(t, dir, shard1, []byte{1, 2, 3}) },
			[]string{IndexFile, shard1, "truncated"}, true},
		{"missing tensor in shards", sharded, func(t *testing.T, dir string) {
			path := filepath.Join(dir, shard1)
			f := loadTensorFile(t, path)
			f.remove("model.embed_tokens.weight")
			f.write(t, path)
			editJSON(t, filepath.Join(dir, IndexFile), func(c map[string]any) { delete(c["weight_map"].(map[string]any), "model.embed_tokens.weight") })
		}, []string{IndexFile, "missing tensor model.embed_tokens.weight"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.dir(t)
			tt.mutate(t, dir)
			_, params, err := Import(dir)
			if err == nil {
				t.Fatal("Import succeeded")
			}
			if params != nil {
				t.Error("Import returned parameters with its error")
			}
			for _, s := range tt.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
			if strings.ContainsRune(err.Error(), '\n') {
				t.Errorf("error %q spans lines", err)
			}
			var fe *engine.FormatError
			if errors.As(err, &fe) != tt.format {
				t.Errorf("error %q: is *engine.FormatError = %v, want %v", err, !tt.format, tt.format)
			}
		})
	}
}

// TestLlamaReference: folders exported by gptui, a tied Llama in one file
// and an untied one with Llama 3's rotary scaling in shards, load in an
// independent PyTorch Llama written from the published formulas
// (../testdata/llama/llama_reference.py --hf, which parses safetensors
// itself) with gptui's logits, within 1e-4 of their largest magnitude. It
// is skipped where python3 with torch is missing, except in CI (CI set),
// whose .ci/run installs it.
func TestLlamaReference(t *testing.T) {
	py := torchtest.Python(t)
	var args []string
	var want [][]float32
	dir := t.TempDir()
	for i, cfg := range []engine.ModelConfig{llamaTied, llamaUntied} {
		m, err := engine.NewModel(cpu.New(), cfg, 0.02, 1)
		if err != nil {
			t.Fatal(err)
		}
		// Large enough that every tensor matters, the norms' weights
		// about 1.
		copy(m.Params, randomParams(cfg, 0.3, uint64(10+i)))
		for _, name := range []string{"ln1w", "ln2w", "lnfw"} {
			x := tensorOf(t, cfg, name)
			for k := range x.Size {
				m.Params[x.Offset+k] += 1
			}
		}
		T := cfg.MaxT - 3
		r := rand.New(rand.NewPCG(uint64(i), 7))
		in := make([]int32, T)
		var toks []string
		for k := range in {
			in[k] = int32(r.IntN(cfg.V))
			toks = append(toks, strconv.Itoa(int(in[k])))
		}
		logits, err := m.Logits(context.Background(), in, 1, T)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, logits)
		d := filepath.Join(dir, fmt.Sprint(i))
		maxShard := int64(MaxShardBytes)
		if !cfg.Tied() {
			maxShard = 8 << 10
		}
		if err := ExportShards(d, cfg, m.Params, maxShard); err != nil {
			t.Fatal(err)
		}
		args = append(args, d, strings.Join(toks, ","), filepath.Join(dir, fmt.Sprint(i, ".bin")))
	}
	script := filepath.Join("..", "testdata", "llama", "llama_reference.py")
	if out, err := exec.Command(py, append([]string{script, "--hf"}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("llama_reference.py: %v\n%s", err, out)
	}
	for i, w := range want {
		b := readFile(t, filepath.Join(dir, fmt.Sprint(i, ".bin")))
		if len(b) != 4*len(w) {
			t.Fatalf("folder %d: the reference wrote %d logits, want %d", i, len(b)/4, len(w))
		}
		var scale, worst float64
		for k, v := range w {
			ref := float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*k:])))
			scale = max(scale, math.Abs(ref))
			worst = max(worst, math.Abs(float64(v)-ref))
		}
		if !(worst <= 1e-4*scale) {
			t.Errorf("folder %d: logits differ from the reference's by up to %.3g, %.3g of their largest magnitude %.3g; want ≤ 1e-4", i, worst, worst/scale, scale)
		}
		t.Logf("folder %d: %d logits, largest difference %.3g (%.2g of the largest magnitude %.3g)", i, len(w), worst, worst/scale, scale)
	}
}

// TestImportCheckedBeforeAllocation: a Llama folder whose config.json
// and model.safetensors header describe a 134B-parameter model, its data
// a hole (a sparse file of 535 GB), and a GPT-2 one of 1.6B parameters
// (6.2 GB), reach ImportChecked's check with their shapes before anything
// of the model is allocated: a check that refuses ends the import, its
// error returned as it is, having allocated little more than the header.
// An oversized config.json is refused unread.
func TestImportCheckedBeforeAllocation(t *testing.T) {
	llama := engine.ModelConfig{Shape: arch.Shape{Family: arch.Llama, MaxT: 8192, V: 128256, Vp: 128256, L: 154, NH: 64, NKV: 8, C: 8192, F: 28672, Untied: true},
		NormEps: 1e-5, RoPE: kernels.RoPE{Theta: 500000}}
	gpt2 := engine.ModelConfig{Shape: arch.Shape{MaxT: 1024, V: 50257, Vp: 50304, L: 48, NH: 25, C: 1600, F: 6400}}
	for _, cfg := range []engine.ModelConfig{llama, gpt2} {
		dir := t.TempDir()
		var ms []mapping
		var conf []byte
		var err error
		if cfg.Family == arch.Llama {
			ms, _ = llamaMappings(cfg)
			conf, err = encodeLlamaConfig(cfg)
		} else {
			ms, _ = mappings(cfg)
			for i := range ms {
				ms[i].name = prefix + ms[i].name
			}
			conf, err = encodeConfig(cfg)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ConfigFile), conf, 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(filepath.Join(dir, ModelFile))
		if err != nil {
			t.Fatal(err)
		}
		ts := make([]safetensors.Tensor, len(ms))
		data := int64(0)
		for i, m := range ms {
			ts[i] = safetensors.Tensor{Name: m.name, Shape: m.shape}
			data += 4 * int64(m.size())
		}
		if _, err := safetensors.NewWriter(f, ts, nil); err != nil {
			t.Fatal(err)
		}
		at, _ := f.Seek(0, 1)
		if err := f.Truncate(at + data); err != nil {
			t.Skipf("a sparse file: %v", err)
		}
		f.Close()
		refused := errors.New("refused")
		var seen engine.ModelConfig
		used := allocbound.Measure(func() {
			_, _, err = ImportChecked(dir, func(c engine.ModelConfig) error { seen = c; return refused })
		})
		if err != refused || seen.Shape != cfg.Shape {
			t.Errorf("%d layers: error %v, check saw %+v; want the check's error, and %+v", cfg.L, err, seen.Shape, cfg.Shape)
		}
		if used > 64<<20 {
			t.Errorf("%d layers: a %d-byte model file's header cost %d bytes before the check", cfg.L, at+data, used)
		}
		t.Logf("%s of %.1fB parameters, %.1f GB of model file: %.1f MiB allocated before the check", cfg.Family, float64(cfg.Params())/1e9, float64(at+data)/1e9, float64(used)/(1<<20))
	}
	// A config.json of 1 GiB (sparse): refused before it is read.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, ConfigFile), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dir, ConfigFile), 1<<30); err != nil {
		t.Skipf("a sparse file: %v", err)
	}
	var err error
	used := allocbound.Measure(func() { _, _, err = Import(dir) })
	var fe *engine.FormatError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "more than the 16777216 a model config has room for") || used > 1<<20 {
		t.Errorf("a 1 GiB config.json: error %v after allocating %d bytes; want a FormatError, nothing read", err, used)
	}
}
