package main

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/engine/hf"
	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/presets"
)

func sameFile(t *testing.T, a, b string) {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(x, y) {
		t.Errorf("%s and %s differ (%d vs %d bytes)", a, b, len(x), len(y))
	}
}

// TestRoundTrips: llm.c → gptui → llm.c and hf → gptui → hf are
// byte-identical through the import and export commands.
func TestRoundTrips(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(srcDir, "../../engine/testdata/llmc/model.bin")
	if code, _, e := runCLI(t, "import", "--from", "llmc", "--out", filepath.Join(dir, "c1"), src); code != 0 {
		t.Fatalf("import llmc: %s", e)
	}
	if code, _, e := runCLI(t, "export", "--ckpt", filepath.Join(dir, "c1"), "--to", "llmc", filepath.Join(dir, "back.bin")); code != 0 {
		t.Fatalf("export llmc: %s", e)
	}
	sameFile(t, src, filepath.Join(dir, "back.bin"))

	shape := engine.ModelConfig{Shape: arch.Shape{MaxT: 32, V: 300, Vp: 384, L: 2, NH: 4, C: 16, F: 64}, HiddenDropout: 0.1, AttnDropout: 0.1}
	m, err := engine.NewModel(cpu.New(), shape, 0.02, 9)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range m.Params[:shape.V*shape.C] {
		m.Params[i] = float32(r.NormFloat64())
	}
	a := filepath.Join(dir, "hfA")
	if err := hf.Export(a, shape, m.Params); err != nil {
		t.Fatal(err)
	}
	// The README's order: the directory before --out.
	if code, _, e := runCLI(t, "import", "--from", "hf", a, "--out", filepath.Join(dir, "c2")); code != 0 {
		t.Fatalf("import hf: %s", e)
	}
	b := filepath.Join(dir, "hfB")
	if code, _, e := runCLI(t, "export", "--ckpt", filepath.Join(dir, "c2"), "--to", "hf", b); code != 0 {
		t.Fatalf("export hf: %s", e)
	}
	for _, f := range []string{hf.ModelFile, hf.ConfigFile} {
		sameFile(t, filepath.Join(a, f), filepath.Join(b, f))
	}
}

// TestLlamaFilesCLI: a Hugging Face LlamaForCausalLM folder (untied, 2 of
// 4 key/value heads, Llama 3's rotary scaling) imports through 'gptui
// import --from hf' and exports back through 'gptui export --to hf'
// byte-identical, from one model file or from shards; the imported
// checkpoint generates, and 'export --to llmc' refuses it in one line.
func TestLlamaFilesCLI(t *testing.T) {
	dir := t.TempDir()
	shape := engine.ModelConfig{Shape: arch.Shape{Family: arch.Llama, MaxT: 64, V: 50257, Vp: 50304, L: 2, NH: 4, C: 16, F: 40, NKV: 2, Untied: true},
		NormEps: 1e-5, RoPE: kernels.RoPE{Theta: 500000, Scaling: &kernels.RoPEScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 32}}}
	m, err := engine.NewModel(cpu.New(), shape, 0.02, 9)
	if err != nil {
		t.Fatal(err)
	}
	for _, pad := range []string{"wte", "lmhead"} { // the formats hold the real rows only
		for _, x := range m.Tensors {
			if x.Name == pad {
				clear(m.Params[x.Offset+shape.V*shape.C : x.Offset+x.Size])
			}
		}
	}
	one, sharded := filepath.Join(dir, "one"), filepath.Join(dir, "sharded")
	if err := hf.Export(one, shape, m.Params); err != nil {
		t.Fatal(err)
	}
	if err := hf.ExportShards(sharded, shape, m.Params, 1<<20); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{one, sharded} {
		ck, back := src+"-ckpt", src+"-back"
		if code, _, e := runCLI(t, "import", "--from", "hf", src, "--out", ck); code != 0 {
			t.Fatalf("import hf %s: %s", src, e)
		}
		if code, _, e := runCLI(t, "export", "--ckpt", ck, "--to", "hf", back); code != 0 {
			t.Fatalf("export hf: %s", e)
		}
		for _, f := range []string{hf.ModelFile, hf.ConfigFile} {
			sameFile(t, filepath.Join(one, f), filepath.Join(back, f))
		}
	}
	ck := one + "-ckpt"
	code, out, e := runCLI(t, "generate", "--ckpt", ck, "--prompt", "Hello", "--max-new-tokens", "4", "--temperature", "0")
	if code != 0 || !strings.HasPrefix(out, "Hello") {
		t.Errorf("generate from the imported Llama: exit %d\n%s\n%s", code, out, e)
	}
	code, _, e = runCLI(t, "export", "--ckpt", ck, "--to", "llmc", filepath.Join(dir, "model.bin"))
	checkUserError(t, code, e, []string{"llm.c", "Llama", "--to hf"})
}

// TestGenerateCLI: greedy generation from an imported checkpoint is
// deterministic and streams the prompt then the continuation.
func TestGenerateCLI(t *testing.T) {
	long(t)
	dir := t.TempDir()
	code, out, e := runCLI(t, "train", "-c", "tiny", "-o", "Engine.max_steps=2", "-o", "Engine.eval_freq=0",
		"-o", "Engine.log_dir="+filepath.Join(dir, "log"), "-o", "Engine.save_load.save_steps=2", "-o", "Engine.save_load.output_dir="+filepath.Join(dir, "out"))
	if code != 0 || !strings.Contains(out, "checkpoint: ") {
		t.Fatalf("train: %d %s %s", code, out, e)
	}
	gen := func() string {
		code, out, e := runCLI(t, "generate", "--ckpt", filepath.Join(dir, "out"), "--prompt", "Hello", "--max-new-tokens", "8", "--temperature", "0")
		if code != 0 {
			t.Fatalf("generate: %s", e)
		}
		return out
	}
	a, b := gen(), gen()
	if a != b || !strings.HasPrefix(a, "Hello") || len(a) <= len("Hello\n") {
		t.Errorf("greedy outputs %q and %q: want equal, starting with the prompt", a, b)
	}
	if code, _, e := runCLI(t, "generate", "--ckpt", filepath.Join(dir, "nope"), "--prompt", "x"); code != 2 || !strings.Contains(e, "nope") {
		t.Errorf("missing checkpoint: exit %d, %q", code, e)
	}
}

// tinyCheckpoint saves an untrained tiny model as a checkpoint and returns
// its directory.
func tinyCheckpoint(t *testing.T, dir string) string {
	t.Helper()
	cfg, err := presets.Load("tiny", nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := engine.NewModel(cpu.New(), engine.ShapeOf(cfg), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	ckpt, err := engine.SaveModel(m, cfg, dir)
	if err != nil {
		t.Fatal(err)
	}
	return ckpt
}

// editManifest rewrites a checkpoint's manifest.json with edit, sealed
// anew (checkpoint.Seal): a reader then finds what edit changed, not a
// broken seal.
func editManifest(t *testing.T, ckpt string, edit func(m map[string]any)) {
	t.Helper()
	f := filepath.Join(ckpt, "manifest.json")
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "manifest_sha256")
	edit(m)
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f, checkpoint.Seal(b), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointBadInput: a checkpoint missing a tensor, or whose config
// does not fit its tensors, is bad input for generate, export and train
// (exit 2, naming the manifest and the tensor); flags may follow the
// positional argument of export and import.
func TestCheckpointBadInput(t *testing.T) {
	dir := t.TempDir()
	missing := tinyCheckpoint(t, filepath.Join(dir, "missing"))
	editManifest(t, missing, func(m map[string]any) {
		ts := m["tensors"].([]any)
		m["tensors"] = ts[1:]
	})
	name := func(ckpt string) string { // the first tensor's name
		b, _ := os.ReadFile(filepath.Join(ckpt, "manifest.json"))
		var m struct{ Tensors []struct{ Name string } }
		json.Unmarshal(b, &m)
		return m.Tensors[0].Name
	}
	good := tinyCheckpoint(t, filepath.Join(dir, "good"))
	first := name(good)
	shape := tinyCheckpoint(t, filepath.Join(dir, "shape"))
	editManifest(t, shape, func(m map[string]any) {
		m["config"] = strings.Replace(m["config"].(string), "hidden_size: 64", "hidden_size: 32", 1)
	})
	log := "Engine.log_dir=" + filepath.Join(dir, "log")
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"generate, missing tensor", []string{"generate", "--ckpt", missing, "--prompt", "x"}, []string{filepath.Join(missing, "manifest.json"), `no tensor "` + first + `"`, "use another"}},
		{"export, missing tensor", []string{"export", "--ckpt", missing, "--to", "llmc", filepath.Join(dir, "m.bin")}, []string{"manifest.json", `no tensor "` + first + `"`}},
		{"train, missing tensor", []string{"train", "-c", "tiny", "-o", log, "-o", "Model.init_from=" + missing}, []string{"manifest.json", `no tensor "` + first + `"`}},
		{"generate, shape mismatch", []string{"generate", "--ckpt", shape, "--prompt", "x"}, []string{filepath.Join(shape, "manifest.json"), "has shape", "needs", "do not match"}},
		{"export, shape mismatch", []string{"export", "--ckpt", shape, "--to", "hf", filepath.Join(dir, "hf")}, []string{"manifest.json", "has shape", "do not match"}},
		{"train, no shards", []string{"train", "-c", "tiny", "-o", log, "-o", "Data.Train.dataset.input_dir=" + dir}, []string{dir, "no token shards", "gptui data prepare"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, tc.args...)
			checkUserError(t, code, stderr, tc.want)
		})
	}
	// Flags after the positional argument, as README writes import.
	bin := filepath.Join(dir, "m.bin")
	if code, _, e := runCLI(t, "export", bin, "--ckpt", good, "--to", "llmc"); code != 0 {
		t.Fatalf("export FILE --ckpt DIR --to llmc: exit %d: %s", code, e)
	}
	if code, out, e := runCLI(t, "import", "--from", "llmc", bin, "--out", filepath.Join(dir, "back")); code != 0 || !strings.Contains(out, "imported "+bin) {
		t.Fatalf("import --from llmc FILE --out DIR: exit %d: %s %s", code, out, e)
	}
	if code, _, e := runCLI(t, "import", "--from", "llmc", "--out", filepath.Join(dir, "x"), "--", "-weird.bin"); code != 2 || !strings.Contains(e, "-weird.bin") {
		t.Errorf("import after --: exit %d, %q: want 2 naming -weird.bin as a file", code, e)
	}
}

// TestImportIntoCheckpoints: an import into a folder that holds a run's
// checkpoints is refused (exit 2, naming them) and changes nothing; with
// --force it goes ahead and says what it superseded.
func TestImportIntoCheckpoints(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(srcDir, "../../engine/testdata/llmc/model.bin")
	out := filepath.Join(dir, "output")
	if code, _, e := runCLI(t, "import", "--from", "llmc", "--out", out, src); code != 0 {
		t.Fatalf("import into a new folder: exit %d: %s", code, e)
	}
	// The folder of a run at step 200.
	if err := os.Rename(filepath.Join(out, "step_00000000"), filepath.Join(out, "step_00000200")); err != nil {
		t.Fatal(err)
	}
	latest := filepath.Join(out, "latest")
	writeTestFile(t, latest, "step_00000200\n")

	code, _, stderr := runCLI(t, "import", "--from", "llmc", "--out", out, src)
	checkUserError(t, code, stderr, []string{"import: --out " + out + " holds checkpoint step_00000200, latest → step_00000200: the import (step 0) would become the latest there and a --resume would overwrite them; choose an empty folder, or pass --force"})
	if b, _ := os.ReadFile(latest); string(b) != "step_00000200\n" {
		t.Errorf("the refused import changed latest to %q", b)
	}
	if _, err := os.Stat(filepath.Join(out, "step_00000000")); !os.IsNotExist(err) {
		t.Errorf("the refused import wrote step_00000000 (%v)", err)
	}

	code, stdout, e := runCLI(t, "import", "--from", "llmc", "--out", out, src, "--force")
	if want := "--force: " + out + " held checkpoint step_00000200, latest → step_00000200; now latest → step_00000000\n"; code != 0 || !strings.HasSuffix(stdout, want) {
		t.Fatalf("import --force: exit %d, stdout %q, want it to end %q; stderr %s", code, stdout, want, e)
	}
	if b, _ := os.ReadFile(latest); string(b) != "step_00000000\n" {
		t.Errorf("after import --force latest is %q", b)
	}
	if _, err := os.Stat(filepath.Join(out, "step_00000200")); err != nil {
		t.Errorf("import --force removed the run's step_00000200: %v", err)
	}
}
