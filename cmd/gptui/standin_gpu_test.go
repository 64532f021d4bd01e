package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strings"
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
// ncclBfloat16 — and with context parallelism, whose ring's gradients
// are summed in bfloat16 (Engine.mix_precision.reduce_dtype bf16: the
// buckets' ncclBfloat16 all-reduce at the addresses the backend's Half
// gives, the TCP ring's rounded sums on the CPU). The losses agree with the same layout's on the CPU in bf16
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
	libs, kernels := standinGPU(t)
	exe := builtGPTUI(t)
	for _, l := range []struct {
		name string
		o    []string
	}{
		{"mp2 pp2", []string{"Distributed.mp_degree=2", "Distributed.pp_degree=2"}},
		{"cp2 mp2 sp", []string{"Distributed.cp_degree=2", "Distributed.mp_degree=2", "Distributed.sequence_parallel=true",
			"Model.hidden_dropout_prob=0", "Model.attention_probs_dropout_prob=0", "Engine.mix_precision.reduce_dtype=bf16"}},
	} {
		t.Run(l.name, func(t *testing.T) {
			o := append([]string{"Engine.max_steps=3", "Engine.mix_precision.dtype=bf16", "Global.local_batch_size=8", "Global.micro_batch_size=4",
				"Data.Train.dataset.max_seq_len=32"}, l.o...)
			ref, wait := startStandinJob(t, exe, nil, o...)
			if code := wait(); code != 0 {
				t.Fatalf("on the CPU: exit %d\n%s", code, ref.output())
			}
			env := standinGPUEnv(t, libs, kernels)
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

// standinGPU builds the stand-in libraries and the emulator's library of
// the kernel sources, or skips t where there is no g++ or gcc.
func standinGPU(t *testing.T) (libs, kernels string) {
	t.Helper()
	if _, err := emu.Compiler(); err != nil {
		t.Skip(err)
	}
	libs = standin.Build(t)
	kernels, err := emu.BuildLibrary(context.Background(), t.TempDir(), cuda.Source(), emu.Options{CacheDir: emu.DefaultCacheDir(), Opt: "-O2"})
	if err != nil {
		t.Fatal(err)
	}
	return libs, kernels
}

// standinGPUEnv is the environment of a process on the stand-in GPUs: the
// libraries, the kernels, a kernel cache of t's, and 256 MiB a device —
// too little for the peak-FLOPS measurement's GEMMs, hours on the CPU.
func standinGPUEnv(t *testing.T, libs, kernels string) []string {
	return append(standin.Env(libs, standin.Tag(t)), standin.EmuLibEnv+"="+kernels, "GPTUI_CACHE_DIR="+t.TempDir(),
		standin.MemoryEnv+"=268435456")
}

// TestGPUCheckOnStandin rehearses 'gptui gpu check', the command the
// device script runs first on a lent GPU, on the stand-in GPU: the kernel
// checks against the CPU in fp32 and bf16, and the NCCL fabric's every
// operation on device memory, which the check reaches only through
// Upload and Download (device memory is not the host's on a GPU; a host
// write there would fault, and on the stand-in lands before the
// allocation's queued zeroing).
func TestGPUCheckOnStandin(t *testing.T) {
	long(t)
	libs, kernels := standinGPU(t)
	cmd := exec.Command(builtGPTUI(t), "gpu", "check", "--only", "kernels-fp32,kernels-bf16,nccl")
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), standinGPUEnv(t, libs, kernels)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gptui gpu check on the stand-in GPU: %v\n%s", err, out)
	}
	for _, want := range []string{"PASS  kernels fp32 vs CPU", "PASS  kernels bf16 vs CPU", "PASS  NCCL fabric dp: every operation", "PASS  NCCL fabric tied: every operation"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
}
