package main

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/engine/data"
	"github.com/gptui/gptui/engine/hf"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/presets"
)

// hostile are input files whose headers declare sizes their bytes do not
// hold, for TestBadInput.
type hostile struct {
	hfDir     string // config.json says n_layer 1e9 over a 2-layer model.safetensors
	llmc      string // an llm.c header saying C = 262144 in a 64 KiB file
	llmcShort string // … saying L = 1, C = 4096 (412M parameters) in a 64 KiB file
	ckpt1e6   string // a 2-layer checkpoint whose manifest's config says num_layers 1e6
	ckpt1e4   string // … num_layers 10000 (within the cap, not in the files)
	trainData string // shards of in-vocabulary tokens
	evalData  string // a shard with token 50290 at token 7 (byte offset 1038)
}

// hostileFiles writes the files of hostile under dir.
func hostileFiles(t *testing.T, dir string) hostile {
	t.Helper()
	h := hostile{
		hfDir: filepath.Join(dir, "hf"), llmc: filepath.Join(dir, "wide.bin"), llmcShort: filepath.Join(dir, "short.bin"),
		trainData: filepath.Join(dir, "train"), evalData: filepath.Join(dir, "eval"),
	}
	small := engine.ModelConfig{Shape: arch.Shape{MaxT: 16, V: 100, Vp: 128, L: 2, NH: 2, C: 8, F: 32}}
	_, n := engine.Tensors(small)
	if err := hf.Export(h.hfDir, small, make([]float32, n)); err != nil {
		t.Fatal(err)
	}
	edit(t, filepath.Join(h.hfDir, hf.ConfigFile), `"n_layer": 2`, `"n_layer": 1000000000`)

	for _, f := range []struct {
		path string
		L, C int32
	}{{h.llmc, 12, 262144}, {h.llmcShort, 1, 4096}} {
		hdr := make([]byte, 64<<10)
		for i, v := range []int32{20240326, 3, 1024, 50257, f.L, 16, f.C, 50304} {
			binary.LittleEndian.PutUint32(hdr[4*i:], uint32(v))
		}
		if err := os.WriteFile(f.path, hdr, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	cfg, err := presets.Load("tiny", []string{"Model.vocab_size=100", "Model.hidden_size=16", "Model.max_position_embeddings=64"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := engine.NewModel(cpu.New(), engine.ShapeOf(cfg), 0.02, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		dir    *string
		layers string
	}{{&h.ckpt1e6, "1000000"}, {&h.ckpt1e4, "10000"}} {
		if *c.dir, err = engine.SaveModel(m, cfg, filepath.Join(dir, "ckpt"+c.layers)); err != nil {
			t.Fatal(err)
		}
		man := filepath.Join(*c.dir, checkpoint.ManifestFile)
		edit(t, man, `num_layers: 2\n`, `num_layers: `+c.layers+`\n`)
		reseal(t, man)
	}

	toks := make([]uint16, 5000)
	for i := range toks {
		toks[i] = uint16(i % 1000)
	}
	evalToks := append([]uint16(nil), toks[:2000]...)
	evalToks[7] = 50290
	for _, s := range []struct {
		dir  string
		toks []uint16
	}{{h.trainData, toks}, {h.evalData, evalToks}} {
		if err := os.MkdirAll(s.dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := data.WriteShard(filepath.Join(s.dir, "data_000000.bin"), s.toks); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// edit replaces the one occurrence of old in the file at path by new.
func edit(t *testing.T, path, old, new string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Count(b, []byte(old)) != 1 {
		t.Fatalf("%s: %q occurs %d times, want once", path, old, bytes.Count(b, []byte(old)))
	}
	if err := os.WriteFile(path, bytes.Replace(b, []byte(old), []byte(new), 1), 0o644); err != nil {
		t.Fatal(err)
	}
}

// reseal seals the manifest at path anew (checkpoint.Seal) after a test
// edited it, so that a reader checks what the edit put there rather than
// refusing the manifest for its seal.
func reseal(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, checkpoint.Seal(b), 0o644); err != nil {
		t.Fatal(err)
	}
}
