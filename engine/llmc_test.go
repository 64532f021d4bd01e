package engine

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

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
