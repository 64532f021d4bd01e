package main

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/gptui/gptui/internal/standin"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/kernels/cuda"
	"github.com/gptui/gptui/kernels/cuda/emu"
)

// TestStandinGPUJob: a job of 4 ranks on Global.device=gpu, with no GPU:
// each worker runs kernels/cuda's Backend on a device of the stand-in
// libraries (internal/standin), whose driver runs the kernel sources
// compiled by the emulator, in bf16 (activations bfloat16 in device
// memory) with tensor and pipeline parallelism over the stand-in NCCL —
// the pipeline's sends and receives of bfloat16 activations as
// ncclBfloat16. The losses agree with the same layout's on the CPU in bf16
// over TCP to the rounding of summing in other orders (cuBLAS's, the
// GPU's kernels').
func TestStandinGPUJob(t *testing.T) {
	long(t)
	if _, err := emu.Compiler(); err != nil {
		t.Skip(err)
	}
	if _, err := cpu.Open(cpu.Options{BF16: true}); err != nil {
		t.Skipf("the CPU reference of bf16: %v", err)
	}
	libs := standin.Build(t)
	kernels, err := emu.BuildLibrary(context.Background(), t.TempDir(), cuda.Source(), emu.Options{CacheDir: emu.DefaultCacheDir(), Opt: "-O2"})
	if err != nil {
		t.Fatal(err)
	}
	exe := builtGPTUI(t)
	for _, l := range []struct {
		name string
		o    []string
	}{
		{"mp2 pp2", []string{"Distributed.mp_degree=2", "Distributed.pp_degree=2"}},
		{"cp2 mp2 sp", []string{"Distributed.cp_degree=2", "Distributed.mp_degree=2", "Distributed.sequence_parallel=true",
			"Model.hidden_dropout_prob=0", "Model.attention_probs_dropout_prob=0"}},
	} {
		t.Run(l.name, func(t *testing.T) {
			o := append([]string{"Engine.max_steps=3", "Engine.mix_precision.dtype=bf16", "Global.local_batch_size=8", "Global.micro_batch_size=4",
				"Data.Train.dataset.max_seq_len=32"}, l.o...)
			ref, wait := startStandinJob(t, exe, nil, o...)
			if code := wait(); code != 0 {
				t.Fatalf("on the CPU: exit %d\n%s", code, ref.output())
			}
			env := append(standin.Env(libs, standin.Tag(t)), standin.EmuLibEnv+"="+kernels, "GPTUI_CACHE_DIR="+t.TempDir(),
				standin.MemoryEnv+"=268435456") // too small for the peak-FLOPS measurement, hours on the CPU
			gpu, wait := startStandinJob(t, exe, env, append(o, "Global.device=gpu")...)
			if code := wait(); code != 0 {
				t.Fatalf("on the stand-in GPUs: exit %d\n%s", code, gpu.output())
			}
			for r := range 4 {
				if _, ok := gpu.first(fmt.Sprintf("[%d] [backend] cuda gptui stand-in (CPU) (sm_90", r)); !ok {
					t.Errorf("rank %d does not say it runs on the stand-in GPU:\n%s", r, gpu.output())
				}
			}
			// The last rank reports the loss in every layout here.
			want, got := rankMetrics(t, ref.logs, 3), rankMetrics(t, gpu.logs, 3)
			if len(want) != 3 || len(got) != 3 {
				t.Fatalf("%d steps on the GPUs, %d on the CPU", len(got), len(want))
			}
			for i := range want {
				d := math.Abs(got[i].Loss-want[i].Loss) / want[i].Loss
				t.Logf("step %d: loss %.6f on the GPUs, %.6f on the CPU (%.1e)", want[i].Step, got[i].Loss, want[i].Loss, d)
				if !(d <= 2e-3) {
					t.Errorf("step %d: loss %v on the GPUs, %v on the CPU", want[i].Step, got[i].Loss, want[i].Loss)
				}
			}
		})
	}
}
