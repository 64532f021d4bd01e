package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/internal/allocbound"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/presets"
)

// expected.json, made by testdata/llmc/make_fixture.py: an independent
// PyTorch implementation of llm.c's train_gpt2.c trained model.bin on
// data/tokens.bin.
type llmcExpected struct {
	B, T              int
	Losses            []float64            `json:"losses"`
	FinalParamSamples map[string][]float64 `json:"final_param_samples"`
}

// TestLLMCCompatibility trains an llm.c model file on an llm.c data shard as
// llm.c's train_gpt2.c does (B=4, T=64, AdamW lr 1e-4 constant, betas
// 0.9/0.999, eps 1e-8, no decay, no clipping, no dropout, sequential data)
// and compares the 10 step losses and samples of the final weights.
func TestLLMCCompatibility(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(srcDir, "testdata/llmc/expected.json"))
	if err != nil {
		t.Fatal(err)
	}
	var want llmcExpected
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	cfg, err := presets.Load("tiny", []string{"Engine.save_load.output_dir=" + t.TempDir(),
		"Model.init_from=" + filepath.Join(srcDir, "testdata/llmc/model.bin"),
		"Model.hidden_dropout_prob=0", "Model.attention_probs_dropout_prob=0",
		"Data.Train.dataset.input_dir=" + filepath.Join(srcDir, "testdata/llmc/data"),
		"Data.Train.dataset.split=[1,0,0]", "Data.Train.dataset.shuffle=false",
		"Data.Train.dataset.max_seq_len=64",
		"Global.global_batch_size=4", "Global.local_batch_size=4", "Global.micro_batch_size=4",
		"Engine.max_steps=10", "Engine.eval_freq=0", "Engine.logging_freq=1",
		"Engine.log_dir=" + t.TempDir(),
		"Optimizer.lr.max_lr=1e-4", "Optimizer.lr.min_lr=1e-4", "Optimizer.lr.warmup_rate=0",
		"Optimizer.beta1=0.9", "Optimizer.beta2=0.999", "Optimizer.epsilon=1e-8",
		"Optimizer.weight_decay=0", "Optimizer.grad_clip.clip_norm=0",
	})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTrainer(cfg, cpu.New(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := tr.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Losses) != len(want.Losses) {
		t.Fatalf("%d losses, want %d", len(res.Losses), len(want.Losses))
	}
	for i, l := range res.Losses {
		if d := math.Abs(float64(l) - want.Losses[i]); d > 1e-3 {
			t.Errorf("step %d: loss %.6f, reference %.6f (|Δ| %.2g > 1e-3)", i, l, want.Losses[i], d)
		} else {
			t.Logf("step %d: loss %.6f reference %.6f |Δ| %.1e", i, l, want.Losses[i], d)
		}
	}
	// Weights: samples like "qkvw[0][0:8]" (layer or row index, then a slice
	// of the flattened rest) or "lnfw[0:8]".
	re := regexp.MustCompile(`^(\w+)(?:\[(\d+)\])?\[(\d+):(\d+)\]$`)
	for key, vals := range want.FinalParamSamples {
		mm := re.FindStringSubmatch(key)
		if mm == nil {
			t.Fatalf("sample key %q not understood", key)
		}
		var ts *Tensor
		for i := range tr.Model.Tensors {
			if tr.Model.Tensors[i].Name == mm[1] {
				ts = &tr.Model.Tensors[i]
			}
		}
		if ts == nil {
			t.Fatalf("no tensor %q", mm[1])
		}
		base := ts.Offset
		if mm[2] != "" {
			k, _ := strconv.Atoi(mm[2])
			base += k * (ts.Size / ts.Shape[0])
		}
		a, _ := strconv.Atoi(mm[3])
		for j, v := range vals {
			got := tr.Model.Params[base+a+j]
			if d := math.Abs(float64(got) - v); d > 1e-5 {
				t.Errorf("%s element %d: %.8f, reference %.8f", key, j, got, v)
			}
		}
	}
}

// TestLLMCShapeBeforeAllocation: the header of an llm.c file of a GPT-3
// 175B, its parameters a hole (a sparse file of 698 GB), gives its shape
// (LLMCShape), and LoadLLMCChecked hands that shape to its check before
// anything of the model is allocated: a check that refuses it ends the
// load, its error returned as it is, having allocated next to nothing.
func TestLLMCShapeBeforeAllocation(t *testing.T) {
	gpt3 := arch.Shape{MaxT: 2048, V: 50257, Vp: 50304, L: 96, NH: 96, C: 12288, F: 4 * 12288}
	path := filepath.Join(t.TempDir(), "gpt3.bin")
	hdr := make([]byte, 4*llmcHeaderInts)
	for i, v := range []int32{llmcModelMagic, llmcModelVersion, 2048, 50257, 96, 96, 12288, 50304} {
		binary.LittleEndian.PutUint32(hdr[4*i:], uint32(v))
	}
	if err := os.WriteFile(path, hdr, 0o644); err != nil {
		t.Fatal(err)
	}
	_, n := Tensors(ModelConfig{Shape: gpt3})
	if err := os.Truncate(path, int64(len(hdr))+4*int64(n)); err != nil {
		t.Skipf("a sparse file: %v", err)
	}
	var shape ModelConfig
	var err error
	used := allocbound.Measure(func() { shape, err = LLMCShape(path) })
	if err != nil || shape.Shape != gpt3 {
		t.Fatalf("LLMCShape: %+v, %v; want %+v", shape.Shape, err, gpt3)
	}
	refused := errors.New("refused")
	var seen ModelConfig
	used += allocbound.Measure(func() {
		_, err = LoadLLMCChecked(nil, path, ModelConfig{}, 0, func(c ModelConfig) error { seen = c; return refused })
	})
	if err != refused || seen.Shape != gpt3 {
		t.Errorf("LoadLLMCChecked: error %v, check saw %+v; want the check's error, and the header's shape", err, seen.Shape)
	}
	if used > 1<<20 {
		t.Errorf("reading the header of a %d-parameter model allocated %d bytes", n, used)
	}
}

// TestSaveLLMCStreams: SaveLLMC writes the header and the parameters
// through a window, not a copy of the model: the file is the header's
// 1 KiB and the values little-endian, and writing 14 MB allocates little
// more than the window.
func TestSaveLLMCStreams(t *testing.T) {
	cfg := ModelConfig{Shape: arch.Shape{MaxT: 64, V: 1000, Vp: 1024, L: 4, NH: 4, C: 256, F: 1024}}
	m, err := NewModel(nil, cfg, 0.02, 1)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "model.bin")
	used := allocbound.Measure(func() { err = m.SaveLLMC(path) })
	if err != nil {
		t.Fatal(err)
	}
	if used > llmcWindow+256<<10 {
		t.Errorf("SaveLLMC of %d bytes of parameters allocated %d bytes", 4*len(m.Params), used)
	}
	want := make([]byte, 4*llmcHeaderInts, 4*llmcHeaderInts+4*len(m.Params))
	for i, v := range []int32{llmcModelMagic, llmcModelVersion, 64, 1000, 4, 4, 256, 1024} {
		binary.LittleEndian.PutUint32(want[4*i:], uint32(v))
	}
	for _, v := range m.Params {
		want = binary.LittleEndian.AppendUint32(want, math.Float32bits(v))
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the file (%d bytes) differs from the header and values (%d bytes)", len(got), len(want))
	}
}
