package gpucheck

import (
	"bytes"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/internal/standin"
	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/kernels/cuda"
	"github.com/gptui/gptui/kernels/cuda/emu"
	"github.com/gptui/gptui/planner"
	"github.com/gptui/gptui/presets"
)

// The GPU backend, whole, on this machine's CPU: cuda.New over the
// stand-in libraries of internal/standin — the driver running the very
// kernel sources, compiled by package emu's emulator into a library, and
// stand-ins of NVRTC and cuBLAS — so that every launch goes through the
// argument packing, the variants, the shared-memory limits, the streams,
// the staging and the cuBLAS calls of a GPU run, and is checked against the
// CPU backend by the checks 'gptui gpu check' runs on a GPU.

// useStandin points the process at the stand-ins, and its kernel cache
// at a folder of t's.
func useStandin(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("the stand-in GPU runs the emulator's kernels: not in -short")
	}
	dir := standin.Build(t)
	if _, err := emu.Compiler(); err != nil {
		t.Skip(err)
	}
	lib, err := emu.BuildLibrary(context.Background(), t.TempDir(), cuda.Source(), emu.Options{CacheDir: emu.DefaultCacheDir(), Opt: "-O2"})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(standin.LibDirEnv, dir)
	t.Setenv(standin.EmuLibEnv, lib)
	t.Setenv("GPTUI_CACHE_DIR", t.TempDir())
	// 256 MiB: too little for the peak-FLOPS measurement's GEMMs, which
	// would take hours on the CPU (no table knows the stand-in's peak).
	t.Setenv(standin.MemoryEnv, "268435456")
}

// onStandin returns a Backend on the stand-ins.
func onStandin(t *testing.T, prec cuda.Precision) *cuda.Backend {
	t.Helper()
	useStandin(t)
	var log bytes.Buffer
	g, err := cuda.New(cuda.Options{Precision: prec, Log: &log})
	if err != nil {
		t.Fatalf("cuda.New on the stand-ins: %v\n%s", err, log.String())
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	t.Logf("%s\n%s", g.Name(), log.String())
	return g
}

// TestCheckBackendOnStandin runs CheckBackend, every kernels.Backend method
// against the CPU backend, on the stand-in GPU, in fp32 and with bf16
// GEMMs.
func TestCheckBackendOnStandin(t *testing.T) {
	for _, prec := range []cuda.Precision{cuda.PrecisionFP32, cuda.PrecisionBF16} {
		t.Run(prec.String(), func(t *testing.T) {
			g := onStandin(t, prec)
			var out bytes.Buffer
			err := CheckBackend(g, &out)
			if err != nil || testing.Verbose() {
				t.Log(out.String())
			}
			if err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(out.String(), "PASS"); n < 30 {
				t.Errorf("%d checks passed, want every one of at least 30", n)
			}
		})
	}
}

// TestLossParityOnStandin trains a two-layer model for 3 steps on the CPU
// and on the stand-in GPU in fp32, from the same start: the losses agree
// to fp32's rounding, as they must on a GPU.
func TestLossParityOnStandin(t *testing.T) {
	useStandin(t)
	load := func() (*presets.Config, error) {
		return presets.Load("tiny", []string{"Engine.max_steps=3", "Engine.save_load.save_steps=0", "Engine.eval_freq=0",
			"Model.vocab_size=96", "Data.Train.dataset.max_seq_len=32", "Engine.log_dir=" + t.TempDir()})
	}
	cpuL, gpuL, err := LossParity(context.Background(), load, engine.Options{Builtin: walkTokens}, cuda.PrecisionFP32)
	if err != nil {
		t.Fatal(err)
	}
	for i := range cpuL {
		t.Logf("step %d: cpu %.7f gpu %.7f", i+1, cpuL[i], gpuL[i])
		if d := math.Abs(float64(cpuL[i] - gpuL[i])); d > 1e-5*math.Abs(float64(cpuL[i])) || math.IsNaN(float64(gpuL[i])) {
			t.Errorf("step %d: gpu loss %v, cpu %v", i+1, gpuL[i], cpuL[i])
		}
	}
}

// TestBF16OnStandin trains the two-layer model in bf16 on the CPU backend
// (the reference of the GPU's bf16 numerics) and on the stand-in GPU,
// whose activations are then bfloat16 in device memory: the losses agree
// within the rounding of summing in another order (cuBLAS's, the
// tensor-core flash attention's), and the GPU holds its activations in
// half the memory of an fp32 run. Its GEMMs into activations add their
// bias, fc's GELU and fcproj's input gradient's GELU backward in
// cuBLASLt's epilogues; where the stand-in cuBLASLt has no algorithm for
// them (NoAuxEpilogueEnv), or the backend is told not to ask
// (cuda.EpiloguesEnv=off), the backend's own kernels
// give the same losses, but for GELU's own rounding (the stand-in's GELU
// is float's tanhf, the backend's kernels' the CPU's). The backend's own
// device memory after each run (the weights' bfloat16 copy, and no GEMM's
// cast buffer) is the planner's account of it, to the byte.
func TestBF16OnStandin(t *testing.T) {
	useStandin(t)
	cb, err := cpu.Open(cpu.Options{BF16: true})
	if err != nil {
		t.Skipf("the CPU reference of bf16: %v", err)
	}
	cfg := func(dtype string) *presets.Config {
		c, err := presets.Load("tiny", []string{"Engine.max_steps=4", "Engine.save_load.save_steps=0", "Engine.eval_freq=0",
			"Model.vocab_size=96", "Model.hidden_size=128", "Data.Train.dataset.max_seq_len=32", "Engine.mix_precision.dtype=" + dtype, "Engine.log_dir=" + t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	opts := engine.Options{Builtin: walkTokens}
	train := func(be kernels.Backend, dtype string) []float32 {
		tr, err := engine.NewTrainer(cfg(dtype), be, opts)
		if err != nil {
			t.Fatal(err)
		}
		res, err := tr.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return res.Losses
	}
	// The device memory a trainer allocates, in each precision, and
	// which of cuBLASLt's epilogues the GEMMs into activations were
	// refused (none: nil); the backend's workspace after the run is the
	// planner's account of it (cudaWorkspace: the Other of its memory,
	// less the runtime's reserve), to the byte.
	eps := []cuda.Epilogue{cuda.EpilogueBias, cuda.EpilogueGeluAuxBias, cuda.EpilogueDGelu}
	used := func(prec cuda.Precision, dtype string) (int64, []float32, error) {
		g, err := cuda.New(cuda.Options{Precision: prec})
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		free0, _, _ := g.Device().MemInfo()
		c := cfg(dtype)
		tr, err := engine.NewTrainer(c, g, opts)
		if err != nil {
			t.Fatal(err)
		}
		free1, _, _ := g.Device().MemInfo()
		res, err := tr.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		dev, err := planner.LookupDevice("H100-80G")
		if err != nil {
			t.Fatal(err)
		}
		p := planner.Estimate(planner.ModelOf(c), planner.Cluster{Nodes: 1, DevicesPerNode: 1, Device: dev}, planner.StrategyOf(c))
		want, got := p.Mem.Other-dev.ReservedBytes, g.WorkspaceBytes()
		var refused []error
		for _, ep := range eps {
			if err := g.EpilogueRefused(ep); err != nil {
				refused = append(refused, err)
			}
		}
		switch {
		case refused != nil:
			// The planner's account is the epilogues': without them, the
			// float32 product of a GEMM comes on top.
			t.Logf("%s without %d epilogues: the backend's workspace is %d bytes, the planner's account (with them) %d", dtype, len(refused), got, want)
		case got != want:
			t.Errorf("%s: the backend's workspace is %d bytes, the planner's account %d", dtype, got, want)
		}
		return free0 - free1, res.Losses, errors.Join(refused...)
	}
	want := train(cb, "bf16")
	fp32Bytes, _, _ := used(cuda.PrecisionFP32, "fp32")
	bf16Bytes, got, noEpilogue := used(cuda.PrecisionBF16, "bf16")
	t.Logf("device memory of the trainer: fp32 %d bytes, bf16 %d bytes", fp32Bytes, bf16Bytes)
	if fp32Bytes-bf16Bytes < 1<<20 {
		t.Errorf("bf16 allocates %d bytes, fp32 %d: the activations (some 4 MiB in fp32) are not 16-bit", bf16Bytes, fp32Bytes)
	}
	if noEpilogue != nil {
		t.Errorf("the GEMMs into bfloat16 activations did not take cuBLASLt's epilogues: %v", noEpilogue)
	}
	// Where cuBLASLt has no algorithm for an epilogue, the backend does
	// its work itself (the float32 product, then BiasStore,
	// BiasGeluStore or GeluBackward), with the same numerics but GELU's
	// own: the losses are the epilogues' to GELU's rounding.
	// First every epilogue declined by the backend (EpiloguesEnv=off),
	// then the aux ones refused by the library.
	for _, env := range []struct{ name, value string }{{cuda.EpiloguesEnv, "off"}, {standin.NoAuxEpilogueEnv, "1"}} {
		t.Setenv(cuda.EpiloguesEnv, "")
		t.Setenv(env.name, env.value)
		_, fallback, noEpilogue := used(cuda.PrecisionBF16, "bf16")
		if noEpilogue == nil || env.name == cuda.EpiloguesEnv && !strings.Contains(noEpilogue.Error(), cuda.EpiloguesEnv+"=off") {
			t.Errorf("with %s=%s, the backend says the epilogues served, or not why: %v", env.name, env.value, noEpilogue)
		}
		t.Logf("with %s=%s (%v): losses %v", env.name, env.value, noEpilogue, fallback)
		for i := range got {
			if d := math.Abs(float64(fallback[i]-got[i])) / math.Abs(float64(got[i])); !(d <= 1e-4) {
				t.Errorf("with %s=%s, step %d: loss %v, with the epilogues %v (%.1e)", env.name, env.value, i+1, fallback[i], got[i], d)
			}
		}
	}
	for i := range want {
		d := math.Abs(float64(got[i]-want[i])) / math.Abs(float64(want[i]))
		t.Logf("step %d: cpu bf16 %.6f, gpu bf16 %.6f (%.1e)", i+1, want[i], got[i], d)
		if !(d <= 2e-3) {
			t.Errorf("step %d: gpu loss %v, cpu %v", i+1, got[i], want[i])
		}
	}
}

// walkTokens is a corpus for a 96-token vocabulary: a pseudo-random walk.
func walkTokens() ([]uint16, error) {
	r := rand.New(rand.NewPCG(1, 2))
	toks := make([]uint16, 4000)
	for i := 1; i < len(toks); i++ {
		toks[i] = uint16((int(toks[i-1]) + 1 + r.IntN(3)) % 96)
	}
	return toks, nil
}

// TestHeadChunksOnStandin runs GradParity — one pass's gradients on the
// stand-in GPU in bf16 against the CPU's in fp32, llm.c's tolerance — on
// a model whose head computes its logits in chunks of rows on both
// backends: 2,048 rows of a 2,048-wide vocabulary over a hidden size of
// 32, so a chunk is arch.MinHeadRows rows (arch.HeadRows), and the
// backend's kernels read the targets, losses and gradients at an offset
// into their buffers.
func TestHeadChunksOnStandin(t *testing.T) {
	useStandin(t)
	const B, T, C, NH, V = 32, 64, 32, 4, 2048
	// A block keeps at most 4·(16·C + NH·T) bytes a row (its input, its
	// layers' outputs, statistics, the attention's probabilities), a
	// chunk's row of logits at least 2·V.
	if n := arch.HeadRows(B*T, 4*B*T*(16*C+NH*T), 2*V); n != arch.MinHeadRows {
		t.Fatalf("a chunk of %d rows: the premise of two chunks fails", n)
	}
	cfg, err := presets.Load("tiny", []string{"Model.vocab_size=2048", "Model.hidden_size=32", "Model.num_layers=1",
		"Data.Train.dataset.max_seq_len=64", "Model.max_position_embeddings=64", "Global.micro_batch_size=32", "Global.local_batch_size=32", "Global.global_batch_size=32"})
	if err != nil {
		t.Fatal(err)
	}
	toks := make([]uint16, B*T+1)
	for i := range toks {
		toks[i] = uint16(i * 2654435761 % V)
	}
	var out bytes.Buffer
	err = GradParity(context.Background(), &out, cfg, toks)
	t.Logf("%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
}
