package engine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gptui/gptui"
	"github.com/gptui/gptui/engine/data"
	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/presets"
)

func builtin() ([]uint16, error) { return data.BuiltinCorpus(gptui.Docs) }

// fixedPeak is a CPU backend whose peak is not measured: the measurement
// takes a second or more, which a process killed within a second cannot
// spare and which dozens of trainers in one test need not pay.
type fixedPeak struct{ kernels.Backend }

func (fixedPeak) PeakFLOPS() float64 { return 1e9 }

// Activations are the wrapped backend's: bf16 ones under bf16.
func (b fixedPeak) Activations(n int) []float32 { return kernels.Activations(b.Backend, n) }

// MarkActivations and UnmarkActivations are the wrapped CPU backend's, for
// kernels/deferred over a fixedPeak (kernels/cpu's MarkActivations).
func (b fixedPeak) MarkActivations(x []float32) bool {
	m, ok := b.Backend.(interface{ MarkActivations([]float32) bool })
	return ok && m.MarkActivations(x)
}

func (b fixedPeak) UnmarkActivations(x []float32) {
	if m, ok := b.Backend.(interface{ UnmarkActivations([]float32) }); ok {
		m.UnmarkActivations(x)
	}
}

// smallTokens is a corpus for a 96-token vocabulary: a fixed pseudo-random
// walk, so that there is something to learn and no tokenizer to run.
func smallTokens() ([]uint16, error) {
	r := rand.New(rand.NewPCG(1, 2))
	toks := make([]uint16, 20000)
	for i := 1; i < len(toks); i++ {
		toks[i] = uint16((int(toks[i-1]) + 1 + r.IntN(3)) % 96)
	}
	return toks, nil
}

// smallVocab gives tiny a 512-token vocabulary (the documentation's tokens
// modulo 512, corpusFor) in the tests whose subject is not the model:
// resume, logs, agreement, loss scaling, accumulation. GPT-2's 50257-token
// embedding and classifier are 96% of tiny's parameters and most of its
// step.
const smallVocab = "Model.vocab_size=512"

// corpusFor is the built-in corpus for a config: the small corpus for a
// vocabulary of 96 tokens (the parity tests' smallest shape), the
// documentation's GPT-2 tokens modulo a vocabulary smaller than GPT-2's,
// else those tokens.
func corpusFor(cfg *presets.Config) func() ([]uint16, error) {
	switch v := cfg.Model.VocabSize; {
	case v <= 96:
		return smallTokens
	case v < data.VocabSize:
		return func() ([]uint16, error) {
			toks, err := builtin()
			toks = slices.Clone(toks)
			for i := range toks {
				toks[i] %= uint16(v)
			}
			return toks, err
		}
	}
	return builtin
}

// trainPreset trains preset with the overrides in one process, on the
// built-in corpus (corpusFor), and returns the trainer and its result.
func trainPreset(t *testing.T, preset string, overrides ...string) (*Trainer, *Result) {
	t.Helper()
	return trainPresetOn(t, fixedPeak{cpu.New()}, preset, overrides...)
}

// trainPresetOn is trainPreset on the backend be.
// Its checkpoints go to a folder of the test's own unless overrides name
// one: a run from step 0 into another run's checkpoints is refused.
func trainPresetOn(t *testing.T, be kernels.Backend, preset string, overrides ...string) (*Trainer, *Result) {
	t.Helper()
	cfg, err := presets.Load(preset, append([]string{"Engine.save_load.output_dir=" + t.TempDir()}, overrides...))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTrainer(cfg, be, Options{Builtin: corpusFor(cfg)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := tr.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return tr, res
}

// tinyOverrides are the tiny fp32 run's that TestTrainTinyLossFalls and
// TestCPUBF16Tiny share (tinyFP32 runs it once for both): 40 steps, an
// evaluation of 2 batches every 20.
var tinyOverrides = []string{"Engine.max_steps=40", "Engine.eval_freq=20", "Engine.eval_iters=2"}

// tinyRun is that run: its result, what it printed, its log directory.
var tinyRun struct {
	once sync.Once
	res  *Result
	out  bytes.Buffer
	dir  string
	err  error
}

// tinyFP32 trains tiny with tinyOverrides in fp32 on the CPU, once for the
// test binary, in a directory of its working directory (testwd removes
// it), and returns the run.
func tinyFP32(t *testing.T) (res *Result, out []byte, logDir string) {
	t.Helper()
	r := &tinyRun
	r.once.Do(func() {
		if r.dir, r.err = os.MkdirTemp(".", "tiny-fp32-"); r.err != nil {
			return
		}
		if r.dir, r.err = filepath.Abs(r.dir); r.err != nil {
			return
		}
		var cfg *presets.Config
		if cfg, r.err = presets.Load("tiny", append(slices.Clone(tinyOverrides), "Engine.log_dir="+r.dir, "Engine.save_load.output_dir="+filepath.Join(r.dir, "output"))); r.err != nil {
			return
		}
		var tr *Trainer
		if tr, r.err = NewTrainer(cfg, cpu.New(), Options{Stdout: &r.out, Builtin: builtin}); r.err != nil {
			return
		}
		r.res, r.err = tr.Run(context.Background())
	})
	if r.err != nil {
		t.Fatalf("tiny in fp32: %v", r.err)
	}
	return r.res, r.out.Bytes(), r.dir
}

// TestTrainTinyLossFalls trains the tiny preset on the built-in corpus and
// checks that the loss falls, the log lines and the metrics file.
func TestTrainTinyLossFalls(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: cmd/gptui's TestQuickstartCheckpoint trains tiny and checks that its loss falls")
	}
	res, stdout, dir := tinyFP32(t)
	// The corpus is the project's documentation, so the exact curve moves
	// as the docs change; 40 steps take the loss from about 10.8 to 8.8.
	first, last := res.Losses[0], res.Losses[len(res.Losses)-1]
	if !(last < first-1.5) {
		t.Errorf("loss went from %.3f to %.3f; want a fall of more than 1.5", first, last)
	}
	if len(res.EvalLosses) != 2 || !(res.EvalLosses[1] < res.EvalLosses[0]) {
		t.Errorf("eval losses %v: want two, falling", res.EvalLosses)
	}
	log := string(stdout)
	for _, want := range []string{"[train] epoch: 0 step: 0 lr: ", " avg_reader_cost: ", " ips: ", " tokens/s mfu: ", "[eval] epoch: ", " ppl: ", "[memory] rank 0: params "} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q", want)
		}
	}
	wl, err := os.ReadFile(filepath.Join(dir, "workerlog.0"))
	if err != nil || !bytes.Equal(wl, stdout) {
		t.Errorf("workerlog.0 differs from stdout (err %v)", err)
	}
	f, err := os.Open(filepath.Join(dir, "metrics.0.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var train, eval int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("metrics line %q: %v", sc.Text(), err)
		}
		if _, ok := m["eval_loss"]; ok {
			eval++
			continue
		}
		train++
		for _, k := range []string{"step", "epoch", "loss", "lr", "tokens_per_s", "step_time_s", "mfu", "mem_bytes"} {
			if _, ok := m[k]; !ok {
				t.Errorf("metrics line lacks %q: %s", k, sc.Text())
			}
		}
		// The peak is the GEMM kernel's own rate: no step reaches it.
		if mfu, _ := m["mfu"].(float64); !(mfu > 0 && mfu < 1) {
			t.Errorf("mfu %v, want it in (0, 1): %s", m["mfu"], sc.Text())
		}
	}
	if train != 5 || eval != 2 { // steps 0, 10, 20, 30, 39; evals after 20 and 40
		t.Errorf("metrics: %d train and %d eval lines, want 5 and 2", train, eval)
	}
}

// TestAccumulationMatchesOneBatch: local batch 8 as one micro-batch of 8 or
// four of 2 gives the same losses (to float32 reassociation).
func TestAccumulationMatchesOneBatch(t *testing.T) {
	run := func(micro string) []float32 {
		_, res := trainPreset(t, "tiny", smallVocab, "Engine.max_steps=3", "Engine.eval_freq=0", "Engine.log_dir="+t.TempDir(),
			"Global.micro_batch_size="+micro, "Model.hidden_dropout_prob=0.1", "Model.attention_probs_dropout_prob=0.1")
		return res.Losses
	}
	a, b := run("8"), run("2")
	for i := range a {
		if d := a[i] - b[i]; d > 1e-4 || d < -1e-4 {
			t.Errorf("step %d: loss %.6f with micro 8, %.6f with 4×2", i, a[i], b[i])
		}
	}
}
