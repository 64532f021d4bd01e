package engine

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/internal/paritymatrix"
	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/kernels/deferred"
	"github.com/gptui/gptui/presets"
)

// The tests of this file run the engine on the sealed test double
// (deferred.NewSealed, deferredBackend): a GPU's device memory, which the
// host reads and writes only through Upload and Download. A host access to
// a buffer of the backend anywhere else — a loss read in place after a
// Sync, weights filled or saved by a host loop, a key/value cache written
// by copy — faults, and the test binary dies with the stack of the line
// that touched it. Each test also checks that the sealed run computes the
// CPU backend's results to the bit.

// sealed returns a sealed backend, skipping the test where the system
// cannot seal memory (not Linux).
func sealed(t *testing.T) kernels.Backend {
	t.Helper()
	be := deferredBackend()
	if !be.(*deferred.Backend).Sealed() {
		t.Skip("sealed memory needs Linux")
	}
	return be
}

// download returns x, a buffer of be, in host memory.
func download(t *testing.T, be kernels.Backend, x []float32) []float32 {
	t.Helper()
	h := make([]float32, len(x))
	if err := kernels.Download(be, h, x); err != nil {
		t.Fatal(err)
	}
	return h
}

// TestSealedTrainResume: training with dropout, shuffled data, gradient
// accumulation, evaluation and logging, a checkpoint (written in the
// foreground, then in the background) and a resume from it, on sealed
// memory, gives the CPU backend's losses, weights and moments, bit for bit.
func TestSealedTrainResume(t *testing.T) {
	o := []string{smallVocab, "Engine.eval_freq=2", "Engine.eval_iters=1", "Engine.logging_freq=1", "Engine.log_dir=" + t.TempDir(),
		"Model.hidden_dropout_prob=0.1", "Model.attention_probs_dropout_prob=0.1", "Data.Train.dataset.shuffle=true",
		"Optimizer.lr.decay_steps=20", "Global.micro_batch_size=4"}
	ref, rres := trainPresetOn(t, fixedPeak{cpu.New()}, "tiny", append(slices.Clone(o), "Engine.max_steps=4")...)
	for _, async := range []string{"false", "true"} {
		t.Run("async="+async, func(t *testing.T) {
			out := t.TempDir()
			save := []string{"Engine.save_load.output_dir=" + out, "Engine.save_load.async=" + async}
			_, r1 := trainPresetOn(t, sealed(t), "tiny", append(append(slices.Clone(o), save...), "Engine.max_steps=2", "Engine.save_load.save_steps=2")...)
			tr, r2 := trainPresetOn(t, sealed(t), "tiny", append(append(slices.Clone(o), save...), "Engine.max_steps=4", "Engine.save_load.ckpt_dir=auto")...)
			if got := append(slices.Clone(r1.Losses), r2.Losses...); !slices.Equal(got, rres.Losses) {
				t.Errorf("losses: sealed %v, cpu %v", got, rres.Losses)
			}
			if got := append(slices.Clone(r1.EvalLosses), r2.EvalLosses...); !slices.Equal(got, rres.EvalLosses) {
				t.Errorf("evaluation losses: sealed %v, cpu %v", got, rres.EvalLosses)
			}
			for _, x := range []struct {
				name      string
				got, want []float32
			}{{"weights", tr.Model.Params, ref.Model.Params}, {"AdamW m", tr.Opt.M, ref.Opt.M}, {"AdamW v", tr.Opt.V, ref.Opt.V}} {
				if !slices.Equal(download(t, tr.be, x.got), x.want) {
					t.Errorf("final %s differ from the CPU's", x.name)
				}
			}
		})
	}
}

// TestSealedParity: two layouts — tensor and pipeline parallel, and a
// Llama's stage-3 shards beside tensor parallelism — on sealed memory,
// every rank's communicators moving the buffers as the device, give the
// CPU backend's losses and weights on every rank, bit for bit. (The
// parity matrix's deferred runs are sealed too; these are its fast core.)
func TestSealedParity(t *testing.T) {
	sealed(t)
	layouts := map[string]bool{"mp2 pp2": true, "llama sharding2 stage3 mp2 kv1 untied": true}
	for _, l := range paritymatrix.Layouts() {
		if !layouts[l.Name] {
			continue
		}
		delete(layouts, l.Name)
		t.Run(l.Name, func(t *testing.T) {
			o := append(append(append(parityOverrides(t), parityEval...), "Engine.max_steps=3"), l.O...)
			want := runRanksWith(t, l.World, o, rankOptions{backend: cpuBackend})
			got := runRanksWith(t, l.World, o, rankOptions{backend: deferredBackend})
			for k := range got.res {
				if !slices.Equal(got.res[k].Losses, want.res[k].Losses) || !slices.Equal(got.res[k].EvalLosses, want.res[k].EvalLosses) {
					t.Errorf("rank %d: losses %v, eval %v; cpu %v, eval %v", k, got.res[k].Losses, got.res[k].EvalLosses, want.res[k].Losses, want.res[k].EvalLosses)
				}
				if !slices.Equal(got.params[k], want.params[k]) {
					t.Errorf("rank %d: weights differ from the CPU's", k)
				}
			}
		})
	}
	if len(layouts) > 0 {
		t.Errorf("no layouts %v in the parity matrix", layouts)
	}
}

// TestSealedGenerate: decoding with the key/value cache on sealed memory
// — the tokens uploaded, the cache appended and the logits downloaded, on
// the device — draws the CPU backend's tokens, greedily and sampled, for
// GPT-2 and a grouped-query Llama.
func TestSealedGenerate(t *testing.T) {
	gpt2 := arch.Shape{MaxT: 40, V: 97, Vp: 128, L: 2, NH: 4, C: 32, F: 128}
	llama := arch.Shape{MaxT: 40, V: 97, Vp: 128, L: 2, NH: 4, C: 32, F: 48, Family: arch.Llama, NKV: 2, Untied: true}
	for _, tc := range []struct {
		name  string
		shape ModelConfig
	}{
		{"gpt2", ModelConfig{Shape: gpt2}},
		{"llama nkv2 untied", ModelConfig{Shape: llama, NormEps: 1e-5, RoPE: kernels.RoPE{Theta: 10000}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref, err := NewModel(cpu.New(), tc.shape, 0.02, 3)
			if err != nil {
				t.Fatal(err)
			}
			randomize(ref, rand.New(rand.NewPCG(6, 6)))
			be := sealed(t)
			m, err := NewModel(be, tc.shape, 0.02, 3)
			if err != nil {
				t.Fatal(err)
			}
			kernels.Upload(be, m.Params, ref.Params)
			prompts := [][]int{{5, 17, 3}, {42}, {1, 2, 3, 4, 5, 6, 7, 8}}
			for _, opt := range []SampleOptions{{MaxNewTokens: 20}, {MaxNewTokens: 20, Temperature: 0.8, TopK: 20, TopP: 0.9, Seed: 4}} {
				want, err := ref.Generate(context.Background(), prompts, opt, nil)
				if err != nil {
					t.Fatal(err)
				}
				got, err := m.Generate(context.Background(), prompts, opt, nil)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.EqualFunc(got, want, slices.Equal) {
					t.Errorf("%+v: sealed %v, cpu %v", opt, got, want)
				}
			}
		})
	}
}

// TestSealedSaveLoad: a model's checkpoint and llm.c file written from
// sealed memory are the CPU's, and a checkpoint loads into sealed memory.
func TestSealedSaveLoad(t *testing.T) {
	cfg, err := presets.Load("tiny", []string{smallVocab})
	if err != nil {
		t.Fatal(err)
	}
	shape := ShapeOf(cfg)
	ref, err := NewModel(cpu.New(), shape, 0.02, 9)
	if err != nil {
		t.Fatal(err)
	}
	be := sealed(t)
	m, err := NewModel(be, shape, 0.02, 9)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(download(t, be, m.Params), ref.Params) {
		t.Fatal("the initial weights differ from the CPU's")
	}
	dir := t.TempDir()
	files := [2]string{filepath.Join(dir, "cpu.bin"), filepath.Join(dir, "sealed.bin")}
	for i, x := range []*Model{ref, m} {
		if err := x.SaveLLMC(files[i]); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := os.ReadFile(files[0])
	b, _ := os.ReadFile(files[1])
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Errorf("llm.c files: sealed %d bytes, cpu %d, or different", len(b), len(a))
	}
	ckpt, err := SaveModel(m, cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, to := range []kernels.Backend{cpu.New(), sealed(t)} {
		l, _, err := LoadModelChecked(to, ckpt, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := download(t, to, l.Params); !slices.Equal(got, ref.Params) {
			t.Errorf("%s: the loaded weights differ from those saved", to.Name())
		}
	}
}
