package hf

import (
	"bytes"
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
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/half"
	"github.com/gptui/gptui/internal/torchtest"
	"github.com/gptui/gptui/kernels/cpu"
)

var testCfg = engine.ModelConfig{Shape: arch.Shape{MaxT: 16, V: 37, Vp: 128, L: 2, NH: 2, C: 8, F: 32}, HiddenDropout: 0.1, AttnDropout: 0.05}

// randomParams fills a buffer for cfg with N(0, std), padded wte rows
// included, so that a test notices where they leak.
func randomParams(cfg engine.ModelConfig, std float64, seed uint64) []float32 {
	_, n := engine.Tensors(cfg)
	r := rand.New(rand.NewPCG(seed, 99))
	p := make([]float32, n)
	for i := range p {
		p[i] = float32(r.NormFloat64() * std)
	}
	return p
}

// tensorOf returns the llm.c tensor named name.
func tensorOf(t *testing.T, cfg engine.ModelConfig, name string) engine.Tensor {
	t.Helper()
	ts, _ := engine.Tensors(cfg)
	for _, x := range ts {
		if x.Name == name {
			return x
		}
	}
	t.Fatalf("no tensor %s", name)
	return engine.Tensor{}
}

func TestRoundTrip(t *testing.T) {
	for _, cfg := range []engine.ModelConfig{
		testCfg,
		{Shape: arch.Shape{MaxT: 5, V: 130, Vp: 256, L: 1, NH: 3, C: 6, F: 10}}, // F ≠ 4C, two padded blocks
	} {
		t.Run(fmt.Sprintf("V%d_F%d", cfg.V, cfg.F), func(t *testing.T) {
			params := randomParams(cfg, 1, 1)
			dir := t.TempDir()
			if err := Export(dir, cfg, params); err != nil {
				t.Fatal(err)
			}
			got, gotParams, err := Import(dir)
			if err != nil {
				t.Fatal(err)
			}
			if want := imported(cfg); got != want {
				t.Errorf("config: got %+v, want %+v", got, want)
			}
			if len(gotParams) != len(params) {
				t.Fatalf("got %d parameters, want %d", len(gotParams), len(params))
			}
			wte := tensorOf(t, cfg, "wte")
			padStart, padEnd := wte.Offset+cfg.V*cfg.C, wte.Offset+wte.Size
			for i := range params {
				want := params[i]
				if i >= padStart && i < padEnd {
					want = 0
				}
				if math.Float32bits(gotParams[i]) != math.Float32bits(want) {
					t.Fatalf("parameter %d: got %g, want %g", i, gotParams[i], want)
				}
			}
		})
	}
}

func TestExportDeterministic(t *testing.T) {
	params := randomParams(testCfg, 1, 2)
	d1, d2, d3 := t.TempDir(), t.TempDir(), filepath.Join(t.TempDir(), "new", "sub")
	if err := Export(d1, testCfg, params); err != nil {
		t.Fatal(err)
	}
	cfg, back, err := Import(d1)
	if err != nil {
		t.Fatal(err)
	}
	if err := Export(d2, cfg, back); err != nil {
		t.Fatal(err)
	}
	if err := Export(d3, testCfg, params); err != nil {
		t.Fatal(err)
	}
	if err := Export(d3, testCfg, params); err != nil { // over the first
		t.Fatal(err)
	}
	for _, name := range []string{ModelFile, ConfigFile} {
		a := readFile(t, filepath.Join(d1, name))
		for _, d := range []string{d2, d3} {
			if b := readFile(t, filepath.Join(d, name)); !bytes.Equal(a, b) {
				t.Errorf("%s differs between exports (%d vs %d bytes)", name, len(a), len(b))
			}
		}
	}
	entries, err := os.ReadDir(d3)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{ConfigFile, ModelFile}; !slices.Equal(names, want) {
		t.Errorf("directory holds %v, want %v (no temporary files)", names, want)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rawTensor is a tensor as the tests parse it, independently of the
// package's reader.
type rawTensor struct {
	Dtype   string  `json:"dtype"`
	Shape   []int   `json:"shape"`
	Offsets []int64 `json:"data_offsets"`
	data    []byte
}

// parseFile splits a safetensors file into its header and tensors.
func parseFile(t *testing.T, path string) (map[string]json.RawMessage, map[string]*rawTensor, []byte) {
	t.Helper()
	b := readFile(t, path)
	n := binary.LittleEndian.Uint64(b)
	if n%8 != 0 {
		t.Errorf("header length %d is not a multiple of 8", n)
	}
	hdr := b[8 : 8+n]
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hdr, &raw); err != nil {
		t.Fatalf("header: %v", err)
	}
	ts := map[string]*rawTensor{}
	for name, msg := range raw {
		if name == "__metadata__" {
			continue
		}
		var x rawTensor
		if err := json.Unmarshal(msg, &x); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		x.data = b[8+n+uint64(x.Offsets[0]) : 8+n+uint64(x.Offsets[1])]
		ts[name] = &x
	}
	return raw, ts, b[8+n:]
}

func TestExportHeader(t *testing.T) {
	dir := t.TempDir()
	cfg := testCfg
	if err := Export(dir, cfg, randomParams(cfg, 1, 3)); err != nil {
		t.Fatal(err)
	}
	raw, ts, data := parseFile(t, filepath.Join(dir, ModelFile))
	V, T, C, F := cfg.V, cfg.MaxT, cfg.C, cfg.F
	want := map[string][]int{
		"transformer.wte.weight":  {V, C},
		"transformer.wpe.weight":  {T, C},
		"transformer.ln_f.weight": {C},
		"transformer.ln_f.bias":   {C},
	}
	for l := range cfg.L {
		for suffix, shape := range map[string][]int{
			"ln_1.weight": {C}, "ln_1.bias": {C},
			"attn.c_attn.weight": {C, 3 * C}, "attn.c_attn.bias": {3 * C},
			"attn.c_proj.weight": {C, C}, "attn.c_proj.bias": {C},
			"ln_2.weight": {C}, "ln_2.bias": {C},
			"mlp.c_fc.weight": {C, F}, "mlp.c_fc.bias": {F},
			"mlp.c_proj.weight": {F, C}, "mlp.c_proj.bias": {C},
		} {
			want[fmt.Sprintf("transformer.h.%d.%s", l, suffix)] = shape
		}
	}
	if len(ts) != len(want) {
		t.Errorf("%d tensors, want %d", len(ts), len(want))
	}
	var spans [][2]int64
	for name, shape := range want {
		x, ok := ts[name]
		if !ok {
			t.Errorf("missing %s", name)
			continue
		}
		if x.Dtype != "F32" || !slices.Equal(x.Shape, shape) {
			t.Errorf("%s: %s %v, want F32 %v", name, x.Dtype, x.Shape, shape)
		}
		spans = append(spans, [2]int64{x.Offsets[0], x.Offsets[1]})
	}
	for name := range ts {
		if _, ok := want[name]; !ok {
			t.Errorf("unexpected tensor %s", name)
		}
	}
	// The tensors tile the data section without gaps or overlaps.
	slices.SortFunc(spans, func(a, b [2]int64) int { return int(a[0] - b[0]) })
	var end int64
	for _, s := range spans {
		if s[0] != end {
			t.Errorf("tensor at %d, previous ends at %d", s[0], end)
		}
		end = s[1]
	}
	if end != int64(len(data)) {
		t.Errorf("tensors end at %d, data section is %d bytes", end, len(data))
	}
	var meta map[string]string
	if err := json.Unmarshal(raw["__metadata__"], &meta); err != nil || meta["format"] != "pt" {
		t.Errorf("__metadata__ = %s, want {\"format\":\"pt\"}", raw["__metadata__"])
	}
}

// TestExportMapping checks element by element that each Hugging Face
// tensor holds the llm.c tensor it should, transposed for Conv1D weights:
// HF[i][o] = ours[o][i]. A round trip cannot see this (a consistent error
// would survive it), nor can the shapes for the square c_proj.
func TestExportMapping(t *testing.T) {
	cfg := testCfg
	params := randomParams(cfg, 1, 4)
	dir := t.TempDir()
	if err := Export(dir, cfg, params); err != nil {
		t.Fatal(err)
	}
	_, ts, _ := parseFile(t, filepath.Join(dir, ModelFile))
	at := func(name string, i int) float32 {
		return math.Float32frombits(binary.LittleEndian.Uint32(ts[name].data[4*i:]))
	}
	type check struct {
		hf      string
		ours    string
		layered bool
		conv    bool // HF [in, out] against ours (out, in)
	}
	checks := []check{
		{"wte.weight", "wte", false, false},
		{"wpe.weight", "wpe", false, false},
		{"ln_f.weight", "lnfw", false, false},
		{"ln_f.bias", "lnfb", false, false},
		{"ln_1.weight", "ln1w", true, false},
		{"ln_1.bias", "ln1b", true, false},
		{"attn.c_attn.weight", "qkvw", true, true},
		{"attn.c_attn.bias", "qkvb", true, false},
		{"attn.c_proj.weight", "attprojw", true, true},
		{"attn.c_proj.bias", "attprojb", true, false},
		{"ln_2.weight", "ln2w", true, false},
		{"ln_2.bias", "ln2b", true, false},
		{"mlp.c_fc.weight", "fcw", true, true},
		{"mlp.c_fc.bias", "fcb", true, false},
		{"mlp.c_proj.weight", "fcprojw", true, true},
		{"mlp.c_proj.bias", "fcprojb", true, false},
	}
	for _, c := range checks {
		ours := tensorOf(t, cfg, c.ours)
		layers, shape := 1, ours.Shape
		if c.layered {
			layers, shape = cfg.L, ours.Shape[1:]
		}
		for l := range layers {
			name := "transformer." + c.hf
			if c.layered {
				name = fmt.Sprintf("transformer.h.%d.%s", l, c.hf)
			}
			base := ours.Offset + l*(ours.Size/layers)
			switch {
			case c.conv:
				out, in := shape[0], shape[1]
				for o := range out {
					for i := range in {
						if got, want := at(name, i*out+o), params[base+o*in+i]; got != want {
							t.Fatalf("%s[%d][%d] = %g, want %s[%d][%d][%d] = %g", name, i, o, got, c.ours, l, o, i, want)
						}
					}
				}
			default:
				n := len(ts[name].data) / 4
				for k := range n {
					if got, want := at(name, k), params[base+k]; got != want {
						t.Fatalf("%s[%d] = %g, want %s = %g", name, k, got, c.ours, want)
					}
				}
			}
		}
	}
}

func TestConfigJSON(t *testing.T) {
	tests := []struct {
		cfg  engine.ModelConfig
		want string
	}{
		{testCfg, `{
  "architectures": [
    "GPT2LMHeadModel"
  ],
  "model_type": "gpt2",
  "vocab_size": 37,
  "n_positions": 16,
  "n_ctx": 16,
  "n_embd": 8,
  "n_layer": 2,
  "n_head": 2,
  "n_inner": null,
  "activation_function": "gelu_new",
  "layer_norm_epsilon": 1e-05,
  "resid_pdrop": 0.1,
  "embd_pdrop": 0.1,
  "attn_pdrop": 0.05,
  "initializer_range": 0.02,
  "bos_token_id": 50256,
  "eos_token_id": 50256,
  "tie_word_embeddings": true,
  "torch_dtype": "float32"
}
`},
		{engine.ModelConfig{Shape: arch.Shape{MaxT: 4, V: 50257, Vp: 50304, L: 1, NH: 2, C: 4, F: 24}}, `"vocab_size": 50257,
  "n_positions": 4,
  "n_ctx": 4,
  "n_embd": 4,
  "n_layer": 1,
  "n_head": 2,
  "n_inner": 24,`},
	}
	for _, tt := range tests {
		dir := t.TempDir()
		_, n := engine.Tensors(tt.cfg)
		if err := Export(dir, tt.cfg, make([]float32, n)); err != nil {
			t.Fatal(err)
		}
		got := string(readFile(t, filepath.Join(dir, ConfigFile)))
		if !strings.Contains(got, tt.want) {
			t.Errorf("config.json for %+v:\n%s\nwant it to contain:\n%s", tt.cfg, got, tt.want)
		}
		cfg, _, err := readConfig(filepath.Join(dir, ConfigFile), nil)
		if want := imported(tt.cfg); err != nil || cfg != want {
			t.Errorf("read back %+v, %v; want %+v", cfg, err, want)
		}
	}
}

// tensorFile is a safetensors file to write in a test: names in order.
type tensorFile struct {
	names []string
	ts    map[string]*rawTensor
}

func loadTensorFile(t *testing.T, path string) *tensorFile {
	t.Helper()
	_, ts, _ := parseFile(t, path)
	f := &tensorFile{ts: ts}
	for name := range ts {
		f.names = append(f.names, name)
	}
	slices.Sort(f.names)
	return f
}

func (f *tensorFile) set(name, dtype string, shape []int, data []byte) {
	if _, ok := f.ts[name]; !ok {
		f.names = append(f.names, name)
	}
	f.ts[name] = &rawTensor{Dtype: dtype, Shape: shape, data: data}
}

func (f *tensorFile) remove(name string) {
	delete(f.ts, name)
	f.names = slices.DeleteFunc(f.names, func(s string) bool { return s == name })
}

func (f *tensorFile) rename(from, to string) {
	f.ts[to] = f.ts[from]
	delete(f.ts, from)
	f.names[slices.Index(f.names, from)] = to
}

// write writes the tensors in order, by hand: the package's writer writes
// F32 alone, and refuses what some edits do.
func (f *tensorFile) write(t *testing.T, path string) {
	t.Helper()
	var hdr bytes.Buffer
	hdr.WriteString(`{"__metadata__":{"format":"pt"}`)
	var data []byte
	for _, name := range f.names {
		x := f.ts[name]
		shape, _ := json.Marshal(x.Shape)
		fmt.Fprintf(&hdr, `,%q:{"dtype":%q,"shape":%s,"data_offsets":[%d,%d]}`, name, x.Dtype, shape, len(data), len(data)+len(x.data))
		data = append(data, x.data...)
	}
	hdr.WriteByte('}')
	b := binary.LittleEndian.AppendUint64(nil, uint64(hdr.Len()))
	writeBytes(t, filepath.Dir(path), filepath.Base(path), append(append(b, hdr.Bytes()...), data...))
}

// mapTensors converts every F32 tensor with conv, which returns the new
// dtype and bytes.
func (f *tensorFile) mapTensors(conv func(data []byte) (string, []byte)) {
	for _, x := range f.ts {
		if x.Dtype == "F32" {
			x.Dtype, x.data = conv(x.data)
		}
	}
}

// exported writes a model with parameters k/8 (exact in F16 and BF16) and
// returns its directory and parameters.
func exported(t *testing.T) (string, []float32) {
	t.Helper()
	_, n := engine.Tensors(testCfg)
	params := make([]float32, n)
	r := rand.New(rand.NewPCG(5, 5))
	for i := range params {
		params[i] = float32(r.IntN(129)-64) / 8
	}
	wte := tensorOf(t, testCfg, "wte")
	clear(params[wte.Offset+testCfg.V*testCfg.C : wte.Offset+wte.Size])
	dir := t.TempDir()
	if err := Export(dir, testCfg, params); err != nil {
		t.Fatal(err)
	}
	return dir, params
}

// f16Bits maps a float32 that is exact in half precision to its bits,
// through half.F16ToF32 (checked on its own by package half).
func f16Bits() map[uint32]uint16 {
	m := make(map[uint32]uint16, 1<<16)
	for h := range 1 << 16 {
		if v := half.F16ToF32(uint16(h)); !math.IsNaN(float64(v)) {
			m[math.Float32bits(v)] = uint16(h)
		}
	}
	return m
}

func TestImportVariants(t *testing.T) {
	half := f16Bits()
	tests := []struct {
		name   string
		mutate func(f *tensorFile)
	}{
		{"as exported", func(f *tensorFile) {}},
		{"no transformer. prefix", func(f *tensorFile) {
			for _, name := range slices.Clone(f.names) {
				f.rename(name, strings.TrimPrefix(name, "transformer."))
			}
		}},
		{"attention mask buffers", func(f *tensorFile) {
			for l := range testCfg.L {
				f.set(fmt.Sprintf("transformer.h.%d.attn.bias", l), "F32", []int{1, 1, 16, 16}, make([]byte, 4*256))
				f.set(fmt.Sprintf("h.%d.attn.masked_bias", l), "F32", []int{}, make([]byte, 4))
			}
		}},
		{"tied lm_head", func(f *tensorFile) {
			wte := f.ts["transformer.wte.weight"]
			f.set("lm_head.weight", "F32", wte.Shape, wte.data)
		}},
		{"BF16", func(f *tensorFile) {
			f.mapTensors(func(b []byte) (string, []byte) {
				out := make([]byte, len(b)/2)
				for i := range len(b) / 4 {
					copy(out[2*i:], b[4*i+2:4*i+4]) // the high half of each float32
				}
				return "BF16", out
			})
		}},
		{"F16", func(f *tensorFile) {
			f.mapTensors(func(b []byte) (string, []byte) {
				out := make([]byte, len(b)/2)
				for i := range len(b) / 4 {
					h, ok := half[binary.LittleEndian.Uint32(b[4*i:])]
					if !ok {
						panic("value not exact in F16")
					}
					binary.LittleEndian.PutUint16(out[2*i:], h)
				}
				return "F16", out
			})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, params := exported(t)
			path := filepath.Join(dir, ModelFile)
			f := loadTensorFile(t, path)
			tt.mutate(f)
			f.write(t, path)
			cfg, got, err := Import(dir)
			if err != nil {
				t.Fatal(err)
			}
			if want := imported(testCfg); cfg != want {
				t.Errorf("config %+v, want %+v", cfg, want)
			}
			if !slices.Equal(got, params) {
				t.Error("parameters differ from the exported ones")
			}
		})
	}
}

func TestImportErrors(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(t *testing.T, dir string)
		want   []string // substrings of the error
		format bool     // an *engine.FormatError
	}{
		{"missing model file", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, ModelFile)) },
			[]string{ModelFile, "no such file"}, false},
		{"missing config", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, ConfigFile)) },
			[]string{ConfigFile, "no such file"}, false},
		{"shorter than the header length", func(t *testing.T, dir string) { writeBytes(t, dir, ModelFile, []byte{1, 2, 3}) },
			[]string{ModelFile, "truncated"}, true},
		{"truncated header", func(t *testing.T, dir string) {
			b := readFile(t, filepath.Join(dir, ModelFile))
			n := binary.LittleEndian.Uint64(b)
			writeBytes(t, dir, ModelFile, b[:8+n/2])
		}, []string{ModelFile, "truncated header"}, true},
		{"truncated data", func(t *testing.T, dir string) {
			b := readFile(t, filepath.Join(dir, ModelFile))
			writeBytes(t, dir, ModelFile, b[:len(b)-4])
		}, []string{ModelFile, "transformer.ln_f.bias", "data_offsets"}, true},
		{"header not JSON", func(t *testing.T, dir string) {
			writeBytes(t, dir, ModelFile, append(binary.LittleEndian.AppendUint64(nil, 8), "[1,2,3] "...))
		}, []string{ModelFile, "not a JSON object"}, true},
		{"wrong shape", editTensors(func(f *tensorFile) {
			x := f.ts["transformer.h.1.mlp.c_fc.weight"]
			x.Shape = []int{32, 8} // ours, untransposed
		}), []string{ModelFile, "transformer.h.1.mlp.c_fc.weight", "shape [32 8], want [8 32]"}, true},
		{"bytes do not match shape", editTensors(func(f *tensorFile) {
			x := f.ts["transformer.wpe.weight"]
			x.data = x.data[:len(x.data)-4]
		}), []string{ModelFile, "transformer.wpe.weight", "data bytes"}, true},
		{"unknown tensor", editTensors(func(f *tensorFile) {
			f.set("transformer.h.2.ln_1.weight", "F32", []int{8}, make([]byte, 32))
		}), []string{ModelFile, "unknown tensor transformer.h.2.ln_1.weight"}, true},
		{"missing tensor", editTensors(func(f *tensorFile) {
			f.remove("transformer.h.0.attn.c_proj.bias")
			f.remove("transformer.wpe.weight")
		}), []string{ModelFile, "missing tensor transformer.wpe.weight (and 1 more)"}, true},
		{"duplicate with and without prefix", editTensors(func(f *tensorFile) {
			x := f.ts["transformer.ln_f.bias"]
			f.set("ln_f.bias", x.Dtype, x.Shape, x.data)
		}), []string{ModelFile, "ln_f.bias appears twice"}, true},
		{"bad dtype", editTensors(func(f *tensorFile) {
			f.set("transformer.h.0.ln_2.bias", "I32", []int{8}, make([]byte, 32))
		}), []string{ModelFile, "transformer.h.0.ln_2.bias", "dtype I32"}, true},
		{"unknown dtype", editTensors(func(f *tensorFile) {
			f.ts["transformer.h.0.ln_2.bias"].Dtype = "Q4"
		}), []string{ModelFile, "transformer.h.0.ln_2.bias", `unknown dtype "Q4"`}, true},
		{"untied lm_head", editTensors(func(f *tensorFile) {
			wte := f.ts["transformer.wte.weight"]
			data := slices.Clone(wte.data)
			data[100] ^= 1
			f.set("lm_head.weight", "F32", wte.Shape, data)
		}), []string{ModelFile, "lm_head.weight differs from wte (element 25"}, true},
		{"config not tied, no lm_head", editConfig(`"tie_word_embeddings": true`, `"tie_word_embeddings": false`),
			[]string{ModelFile, "no lm_head.weight"}, true},
		{"config missing n_embd", editConfig(`"n_embd": 8,`, ``),
			[]string{ConfigFile, "missing n_embd"}, true},
		{"config other activation", editConfig(`"gelu_new"`, `"relu"`),
			[]string{ConfigFile, `activation_function "relu"`}, true},
		{"config other epsilon", editConfig(`1e-05`, `1e-06`),
			[]string{ConfigFile, "layer_norm_epsilon 1e-06"}, true},
		{"config other model", editConfig(`"model_type": "gpt2"`, `"model_type": "bert"`),
			[]string{ConfigFile, `model_type "bert"`, "gpt2 and llama"}, true},
		{"config says llama", editConfig(`"model_type": "gpt2"`, `"model_type": "llama"`),
			[]string{ConfigFile, "missing hidden_size"}, true},
		{"config shape disagrees", editConfig(`"n_positions": 16`, `"n_positions": 32`),
			[]string{ModelFile, "transformer.wpe.weight", "shape [16 8], want [32 8]"}, true},
		{"config impossible shape", editConfig(`"n_head": 2`, `"n_head": 3`),
			[]string{ConfigFile, "not divisible by 3 heads"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, _ := exported(t)
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
			var fe *engine.FormatError
			if errors.As(err, &fe) != tt.format {
				t.Errorf("error %q: is *engine.FormatError = %v, want %v", err, !tt.format, tt.format)
			}
		})
	}
}

func writeBytes(t *testing.T, dir, name string, b []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func editTensors(edit func(f *tensorFile)) func(t *testing.T, dir string) {
	return func(t *testing.T, dir string) {
		path := filepath.Join(dir, ModelFile)
		f := loadTensorFile(t, path)
		edit(f)
		f.write(t, path)
	}
}

func editConfig(old, new string) func(t *testing.T, dir string) {
	return func(t *testing.T, dir string) {
		b := string(readFile(t, filepath.Join(dir, ConfigFile)))
		if !strings.Contains(b, old) {
			t.Fatalf("config.json has no %q", old)
		}
		writeBytes(t, dir, ConfigFile, []byte(strings.Replace(b, old, new, 1)))
	}
}

func TestExportErrors(t *testing.T) {
	_, n := engine.Tensors(testCfg)
	bad := testCfg
	bad.NH = 3
	file := filepath.Join(t.TempDir(), "file")
	writeBytes(t, filepath.Dir(file), "file", nil)
	tests := []struct {
		name   string
		dir    string
		cfg    engine.ModelConfig
		params int
		want   string
	}{
		{"short buffer", t.TempDir(), testCfg, n - 1, "parameters"},
		{"impossible shape", t.TempDir(), bad, n, "not divisible"},
		{"directory is a file", file, testCfg, n, "file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Export(tt.dir, tt.cfg, make([]float32, tt.params))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Export: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestReference evaluates an exported random model with an independent
// PyTorch implementation of transformers' GPT-2 (testdata/gpt2_reference.py)
// and compares its loss with the engine's. It is skipped where python3 with
// torch is missing, except in CI (CI set), whose .ci/run installs it.
func TestReference(t *testing.T) {
	py := torchtest.Python(t)
	cfg := testCfg
	m, err := engine.NewModel(cpu.New(), cfg, 0.02, 1)
	if err != nil {
		t.Fatal(err)
	}
	copy(m.Params, randomParams(cfg, 0.5, 6)) // large enough that every tensor matters
	for _, name := range []string{"ln1w", "ln2w", "lnfw"} {
		ln := tensorOf(t, cfg, name)
		for i := range ln.Size {
			m.Params[ln.Offset+i] += 1
		}
	}
	B, T := 2, 11
	r := rand.New(rand.NewPCG(7, 7))
	in, tg := make([]int32, B*T), make([]int32, B*T)
	var ins, tgs []string
	for i := range in {
		in[i], tg[i] = int32(r.IntN(cfg.V)), int32(r.IntN(cfg.V))
		ins, tgs = append(ins, strconv.Itoa(int(in[i]))), append(tgs, strconv.Itoa(int(tg[i])))
	}
	loss, err := m.Loss(context.Background(), in, tg, B, T)
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	if err := Export(dir, cfg, m.Params); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(py, "testdata/gpt2_reference.py", dir, strconv.Itoa(B), strconv.Itoa(T),
		strings.Join(ins, ","), strings.Join(tgs, ",")).CombinedOutput()
	if err != nil {
		t.Fatalf("gpt2_reference.py: %v\n%s", err, out)
	}
	var ref map[string]float64
	if err := json.Unmarshal(out, &ref); err != nil {
		t.Fatalf("gpt2_reference.py printed %q: %v", out, err)
	}
	for key, v := range ref {
		if d := math.Abs(float64(loss) - v); d > 1e-4*math.Max(1, v) {
			t.Errorf("%s %.7f, engine %.7f", key, v, loss)
		}
	}
	t.Logf("engine loss %.7f, reference %v", loss, ref)
}
