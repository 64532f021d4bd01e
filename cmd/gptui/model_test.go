package main

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/hf"
	"github.com/gptui/gptui/kernels/cpu"
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
	src := "../../engine/testdata/llmc/model.bin"
	if code, _, e := runCLI(t, "import", "--from", "llmc", "--out", filepath.Join(dir, "c1"), src); code != 0 {
		t.Fatalf("import llmc: %s", e)
	}
	if code, _, e := runCLI(t, "export", "--ckpt", filepath.Join(dir, "c1"), "--to", "llmc", filepath.Join(dir, "back.bin")); code != 0 {
		t.Fatalf("export llmc: %s", e)
	}
	sameFile(t, src, filepath.Join(dir, "back.bin"))

	shape := engine.ModelConfig{MaxT: 32, V: 300, Vp: 384, L: 2, NH: 4, C: 16, F: 64, HiddenDropout: 0.1, AttnDropout: 0.1}
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
	if code, _, e := runCLI(t, "import", "--from", "hf", "--out", filepath.Join(dir, "c2"), a); code != 0 {
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

// TestGenerateCLI: greedy generation from an imported checkpoint is
// deterministic and streams the prompt then the continuation.
func TestGenerateCLI(t *testing.T) {
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
