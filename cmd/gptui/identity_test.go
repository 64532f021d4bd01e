package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/engine/data"
	"github.com/gptui/gptui/engine/hf"
	"github.com/gptui/gptui/internal/torchtest"
	"github.com/gptui/gptui/kernels"
)

// rotaryLlama is a Llama of Llama 3's rotary settings — rope_theta
// 500000, Llama 3.1's frequency scaling, rms_norm_eps 1e-5 — none of them
// the defaults of a config that leaves them unset, with special token ids
// of its own. Of the two rotary frequencies of its head size 4, the
// scaling keeps one and divides the other.
var rotaryLlama = engine.ModelConfig{
	Shape:   arch.Shape{Family: arch.Llama, MaxT: 64, V: 200, Vp: arch.PadVocab(200), L: 2, NH: 4, C: 16, F: 40, NKV: 2, Untied: true},
	NormEps: 1e-5, RoPE: kernels.RoPE{Theta: 500000, Scaling: &kernels.RoPEScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 32}},
	TokenIDs: engine.TokenIDs{BOS: "0", EOS: "[1,2]"},
}

// identityRun is an imported rotaryLlama, and a config that trains from
// it (Model.init_from) leaving its rotary settings unset.
type identityRun struct {
	dir, ckpt, config string
	tokens            []uint16 // the training shard's
	B, T, steps       int
}

// newIdentityRun imports rotaryLlama's Hugging Face folder (weights of
// N(0, 0.3), norms 1, so that attention is far from uniform and the rotary
// frequencies weigh on the loss) and writes the config: the training
// tokens in order (shuffle off), steps steps whose last has lr 0 (the
// cosine decay ends at min_lr 0 at decay_steps = steps-1), so that the
// checkpoint after the last step holds the weights its loss was
// computed with.
func newIdentityRun(t *testing.T) *identityRun {
	t.Helper()
	r := &identityRun{dir: t.TempDir(), B: 2, T: 16, steps: 4}
	ts, n := engine.Tensors(rotaryLlama)
	params := make([]float32, n)
	rng := rand.New(rand.NewPCG(35, 1))
	for _, x := range ts {
		for i := range x.Size {
			v := float32(1)
			if !strings.HasPrefix(x.Name, "ln") {
				v = float32(rng.NormFloat64() * 0.3)
			}
			params[x.Offset+i] = v
		}
	}
	src := filepath.Join(r.dir, "hf")
	if err := hf.Export(src, rotaryLlama, params); err != nil {
		t.Fatal(err)
	}
	r.ckpt = filepath.Join(r.dir, "imported")
	code, out, e := runCLI(t, "import", "--from", "hf", src, "--out", r.ckpt)
	if code != 0 {
		t.Fatalf("import: exit %d\n%s", code, e)
	}
	if strings.Contains(out, "[import]") {
		t.Errorf("the import of a complete config.json notes defaults:\n%s", out)
	}
	r.tokens = make([]uint16, r.steps*r.B*r.T+1)
	for i := range r.tokens {
		r.tokens[i] = uint16(rng.IntN(rotaryLlama.V))
	}
	shards := filepath.Join(r.dir, "shards")
	if err := os.Mkdir(shards, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := data.WriteShard(filepath.Join(shards, "data_000000.bin"), r.tokens); err != nil {
		t.Fatal(err)
	}
	s := rotaryLlama.Shape
	r.config = filepath.Join(r.dir, "train.yaml")
	conf := fmt.Sprintf(`Global:
  seed: 1
  global_batch_size: %[1]d
  micro_batch_size: %[1]d
Engine:
  max_steps: %[2]d
  logging_freq: 1
  eval_freq: 0
  log_dir: %[3]s
  save_load:
    save_steps: %[2]d
    output_dir: %[4]s
Model:
  family: llama
  vocab_size: %[5]d
  hidden_size: %[6]d
  num_layers: %[7]d
  num_attention_heads: %[8]d
  num_key_value_heads: %[9]d
  ffn_hidden_size: %[10]d
  max_position_embeddings: %[11]d
  tie_word_embeddings: false
  init_from: %[12]s
Data:
  Train:
    dataset:
      input_dir: %[13]s
      split: [1, 0, 0]
      max_seq_len: %[14]d
      shuffle: false
Optimizer:
  lr:
    decay_steps: %[15]d
    warmup_rate: 0
    max_lr: 0.01
    min_lr: 0
`, r.B, r.steps, filepath.Join(r.dir, "log"), filepath.Join(r.dir, "out"), s.V, s.C, s.L, s.NH, s.NKV, s.F, s.MaxT, r.ckpt, shards, r.T, r.steps-1)
	if err := os.WriteFile(r.config, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return r
}

// lastLoss is the loss of the last step, steps-1, in the metrics file of
// log_dir logDir.
func lastLoss(t *testing.T, logDir string, steps int) float64 {
	t.Helper()
	f, err := os.Open(filepath.Join(logDir, "metrics.0.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	last := struct {
		Step int     `json:"step"`
		Loss float64 `json:"loss"`
	}{Step: -1}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if err := json.Unmarshal(sc.Bytes(), &last); err != nil {
			t.Fatal(err)
		}
	}
	if last.Step != steps-1 {
		t.Fatalf("the metrics end at step %d, want %d", last.Step, steps-1)
	}
	return last.Loss
}

// referenceLosses are the mean cross-entropies, in float64, of the
// logits the independent PyTorch Llama (engine/testdata/llama/
// llama_reference.py --hf) computes from each Hugging Face folder of dirs
// on the last step's batch: one run of the script for all.
func (r *identityRun) referenceLosses(t *testing.T, py string, dirs ...string) []float64 {
	t.Helper()
	at := (r.steps - 1) * r.B * r.T
	args := []string{filepath.Join(srcDir, "../../engine/testdata/llama/llama_reference.py"), "--hf"}
	for _, dir := range dirs {
		for b := range r.B {
			var row []string
			for _, v := range r.tokens[at+b*r.T : at+(b+1)*r.T] {
				row = append(row, strconv.Itoa(int(v)))
			}
			args = append(args, dir, strings.Join(row, ","), filepath.Join(dir, fmt.Sprint("logits", b)))
		}
	}
	if out, err := exec.Command(py, args...).CombinedOutput(); err != nil {
		t.Fatalf("llama_reference.py: %v\n%s", err, out)
	}
	V := rotaryLlama.V
	losses := make([]float64, len(dirs))
	for i, dir := range dirs {
		var sum float64
		for b := range r.B {
			raw := readFile(t, filepath.Join(dir, fmt.Sprint("logits", b)))
			if len(raw) != 4*r.T*V {
				t.Fatalf("the reference wrote %d logits, want %d", len(raw)/4, r.T*V)
			}
			for p := range r.T {
				row := make([]float64, V)
				top := math.Inf(-1)
				for k := range row {
					row[k] = float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[4*(p*V+k):])))
					top = max(top, row[k])
				}
				var z float64
				for _, v := range row {
					z += math.Exp(v - top)
				}
				sum += top + math.Log(z) - row[r.tokens[at+b*r.T+p+1]]
			}
		}
		losses[i] = sum / float64(r.B*r.T)
	}
	return losses
}

// TestImportedLlamaTrainsAndExports: a Llama imported with rope_theta
// 500000, Llama 3.1's rope scaling and rms_norm_eps 1e-5, trained from
// (Model.init_from) under a config that leaves those unset, computes
// with the checkpoint's values and says so; its checkpoint's manifest and
// its Hugging Face export write them (and the import's special token
// ids); and the export, run by the independent PyTorch Llama on the last
// step's batch, gives gptui's last loss within 1e-6 — where the same
// weights under the config's defaults (rope_theta 10000, no scaling,
// 1e-6) give another. The torch part is skipped where python3 with torch
// is missing (except in CI).
func TestImportedLlamaTrainsAndExports(t *testing.T) {
	long(t)
	r := newIdentityRun(t)
	code, out, e := runCLI(t, "train", "-c", r.config)
	if code != 0 {
		t.Fatalf("train: exit %d\n%s\n%s", code, out, e)
	}
	for _, w := range []string{"[checkpoint] the model computes with checkpoint " + r.ckpt, "Model.rope_theta 500000.0 (the config leaves it unset, at 10000.0)",
		"Model.rope_scaling.rope_type llama3", "Model.rms_norm_eps 1e-05"} {
		if !strings.Contains(out, w) {
			t.Errorf("the log does not say %q:\n%s", w, out)
		}
	}
	loss := lastLoss(t, filepath.Join(r.dir, "log"), r.steps)
	ck, err := checkpoint.Load(filepath.Join(r.dir, "out", checkpoint.DirName(r.steps)))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"rope_theta: 500000.0\n", "rope_type: llama3\n", "factor: 8.0\n", "original_max_position_embeddings: 32\n", "rms_norm_eps: 1e-05\n"} {
		if !strings.Contains(ck.Manifest.Config, w) {
			t.Errorf("the checkpoint's config lacks %q:\n%s", w, ck.Manifest.Config)
		}
	}
	exp := filepath.Join(r.dir, "export")
	if code, _, e := runCLI(t, "export", "--ckpt", filepath.Join(r.dir, "out"), "--to", "hf", exp); code != 0 {
		t.Fatalf("export: exit %d\n%s", code, e)
	}
	var conf map[string]any
	if err := json.Unmarshal(readFile(t, filepath.Join(exp, hf.ConfigFile)), &conf); err != nil {
		t.Fatal(err)
	}
	rs, _ := conf["rope_scaling"].(map[string]any)
	if conf["rope_theta"] != 500000.0 || conf["rms_norm_eps"] != 1e-5 || rs["rope_type"] != "llama3" || rs["factor"] != 8.0 ||
		rs["original_max_position_embeddings"] != 32.0 || conf["bos_token_id"] != 0.0 || fmt.Sprint(conf["eos_token_id"]) != "[1 2]" {
		t.Errorf("the export's config.json: rope_theta %v, rms_norm_eps %v, rope_scaling %v, bos %v, eos %v; want 500000, 1e-05, llama3's (factor 8, 32 positions), 0, [1 2]",
			conf["rope_theta"], conf["rms_norm_eps"], rs, conf["bos_token_id"], conf["eos_token_id"])
	}

	py := torchtest.Python(t)
	// The same weights under the config's defaults, as the export wrote
	// them before the checkpoint kept its settings, compute another loss.
	dflt := filepath.Join(r.dir, "defaults")
	if err := os.CopyFS(dflt, os.DirFS(exp)); err != nil {
		t.Fatal(err)
	}
	conf["rope_theta"], conf["rope_scaling"], conf["rms_norm_eps"] = 10000, nil, 1e-6
	b, _ := json.Marshal(conf)
	if err := os.WriteFile(filepath.Join(dflt, hf.ConfigFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	refs := r.referenceLosses(t, py, exp, dflt)
	ref, other := refs[0], refs[1]
	diff := math.Abs(ref - loss)
	t.Logf("last step's loss: gptui %.9g, the PyTorch reference on the export %.9g (difference %.3g)", loss, ref, diff)
	if !(diff <= 1e-6) {
		t.Errorf("the export's loss in the reference is %.9g, gptui's last step %.9g: difference %.3g, want ≤ 1e-6", ref, loss, diff)
	}
	t.Logf("under the config's defaults the reference computes %.9g (difference %.3g)", other, math.Abs(other-loss))
	if !(math.Abs(other-loss) > 100*max(diff, 1e-7)) {
		t.Errorf("under the defaults the reference computes %.9g, as close to gptui's %.9g as the export's %.9g: the test cannot tell them apart", other, loss, ref)
	}
}

// TestCheckpointSettingsRefused: a config that sets a rotary setting or
// the norm epsilon otherwise than the checkpoint it loads is refused in
// one line naming the key and both values (exit 2), as a resume from it
// is; a missing init_from is "no such file", and a shape that differs
// from init_from's names Model.init_from.
func TestCheckpointSettingsRefused(t *testing.T) {
	r := newIdentityRun(t)
	logs := "Engine.log_dir=" + filepath.Join(r.dir, "log2")
	tests := []struct {
		name string
		o    []string
		want []string
	}{
		{"rope_theta", []string{"Model.rope_theta=10000"},
			[]string{"Model.rope_theta: the config sets 10000.0", r.ckpt + "/step_00000000 (Model.init_from) computes with 500000.0", "-o Model.rope_theta=500000.0"}},
		{"rms_norm_eps and rope_type", []string{"Model.rms_norm_eps=1e-6", "Model.rope_scaling.rope_type=default"},
			[]string{"Model.rms_norm_eps: the config sets 1e-06", "computes with 1e-05", "Model.rope_scaling.rope_type: the config sets default", "computes with llama3",
				"leave them unset"}},
		{"scaling factor", []string{"Model.rope_scaling.factor=32"}, []string{"Model.rope_scaling.factor: the config sets 32.0", "computes with 8.0"}},
		{"resumed from", []string{"Model.init_from=", "Engine.save_load.ckpt_dir=" + r.ckpt, "Model.rope_theta=10000"},
			[]string{"Model.rope_theta: the config sets 10000.0", r.ckpt + "/step_00000000 (Engine.save_load.ckpt_dir) computes with 500000.0"}},
		{"no such init_from", []string{"Model.init_from=" + filepath.Join(r.dir, "nonexistent")},
			[]string{"Model.init_from " + filepath.Join(r.dir, "nonexistent") + ": no such file or directory"}},
		{"shape", []string{"Model.ffn_hidden_size=48"},
			[]string{"model shape differs from checkpoint " + r.ckpt, "Model.ffn_hidden_size=48 (checkpoint 40)", "drop Model.init_from"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"train", "-c", r.config, "-o", logs}
			for _, o := range tt.o {
				args = append(args, "-o", o)
			}
			code, _, e := runCLI(t, args...)
			checkUserError(t, code, e, tt.want)
			if strings.Contains(e, "holds a GPT-2") {
				t.Errorf("the error speaks of llm.c's files: %s", e)
			}
		})
	}
}

// readFile returns the content of path.
func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestImportNamesDefaults: 'gptui import --from hf' of a config.json
// without max_position_embeddings, bos_token_id and eos_token_id imports
// with transformers' LlamaConfig defaults (2048, 1, 2), a line of its
// output naming each, and an export of the import writes them.
func TestImportNamesDefaults(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "hf")
	_, n := engine.Tensors(rotaryLlama)
	if err := hf.Export(src, rotaryLlama, make([]float32, n)); err != nil {
		t.Fatal(err)
	}
	var conf map[string]any
	if err := json.Unmarshal(readFile(t, filepath.Join(src, hf.ConfigFile)), &conf); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"max_position_embeddings", "bos_token_id", "eos_token_id"} {
		delete(conf, k)
	}
	b, _ := json.Marshal(conf)
	if err := os.WriteFile(filepath.Join(src, hf.ConfigFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	ck := filepath.Join(dir, "ck")
	code, out, e := runCLI(t, "import", "--from", "hf", src, "--out", ck)
	if code != 0 {
		t.Fatalf("import: exit %d\n%s", code, e)
	}
	at := "[import] " + filepath.Join(src, hf.ConfigFile) + ": "
	for _, w := range []string{"max_position_embeddings absent: transformers' LlamaConfig default, 2048", "bos_token_id absent: transformers' LlamaConfig default, 1",
		"eos_token_id absent: transformers' LlamaConfig default, 2"} {
		if !strings.Contains(out, at+w+"\n") {
			t.Errorf("the import's output does not say %q:\n%s", at+w, out)
		}
	}
	back := filepath.Join(dir, "back")
	if code, _, e := runCLI(t, "export", "--ckpt", ck, "--to", "hf", back); code != 0 {
		t.Fatalf("export: exit %d\n%s", code, e)
	}
	conf = nil
	if err := json.Unmarshal(readFile(t, filepath.Join(back, hf.ConfigFile)), &conf); err != nil {
		t.Fatal(err)
	}
	if conf["max_position_embeddings"] != 2048.0 || conf["bos_token_id"] != 1.0 || conf["eos_token_id"] != 2.0 {
		t.Errorf("the export writes max_position_embeddings %v, bos_token_id %v, eos_token_id %v; want 2048, 1, 2",
			conf["max_position_embeddings"], conf["bos_token_id"], conf["eos_token_id"])
	}
}
