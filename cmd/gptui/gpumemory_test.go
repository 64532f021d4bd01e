package main

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/gptui/gptui/internal/standin"
	"github.com/gptui/gptui/kernels/cuda"
	"github.com/gptui/gptui/planner"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/units"
)

// TestGPUTooSmall: 'gptui train' on a device (the stand-in libcuda's)
// whose free memory is less than the engine's accounting of the job is
// refused before anything is compiled or allocated: exit 2, one line
// naming what is needed, the device and its free memory, and the device
// saw no allocation. With a device large enough, the same run passes the
// check (it stops later, at NVRTC, which the stand-in does not have).
func TestGPUTooSmall(t *testing.T) {
	dir := standin.Build(t)
	run := func(memory int64) (int, string) {
		t.Helper()
		cmd := exec.Command(builtGPTUI(t), "train", "-c", "tiny", "-o", "Global.device=gpu", "-o", "Engine.max_steps=1")
		cmd.Dir = t.TempDir()
		cmd.Env = append(os.Environ(), standin.LibDirEnv+"="+dir, standin.MemoryEnv+"="+strconv.FormatInt(memory, 10), standin.AllocTraceEnv+"=1")
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return exitStatus(err), stdout.String() + stderr.String()
	}
	code, out := run(64 << 20)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 2 || len(lines) != 1 || !strings.Contains(out, "Global.device=gpu: each training process needs ") ||
		!strings.Contains(out, "by the engine's accounting), and GPU 0 (") || !strings.Contains(out, "has 64.0 MiB free of 64.0 MiB") {
		t.Errorf("a 64 MiB device: exit %d, want 2 and one line naming the need and the device's free memory:\n%s", code, out)
	}
	if strings.Contains(out, "[standin] cuMemAlloc") {
		t.Errorf("the refused run allocated on the device:\n%s", out)
	}
	t.Logf("%s", out)
	if code, out := run(16 << 30); code == 0 || strings.Contains(out, "free of") {
		t.Errorf("a 16 GiB device: exit %d, refused for its memory:\n%s", code, out)
	}
}

// TestGPUNeedIsTheGPUs: the memory a GPU run is checked against
// (gpuNeed) is the engine's on a GPU, whose attention keeps a log-sum-exp
// per row and head: for the tiny preset (fp32: no cast buffers) at 2048
// positions it is the CPU's account less the T×T probabilities the CPU
// keeps, plus the log-sums and the CUDA backend's workspaces, to the
// byte — a layout that fits a GPU is not refused for memory the GPU
// backend never allocates.
func TestGPUNeedIsTheGPUs(t *testing.T) {
	cfg, err := presets.Load("tiny", []string{"Global.device=gpu", "Data.Train.dataset.max_seq_len=2048", "Model.max_position_embeddings=2048",
		"Data.Eval.dataset.max_seq_len=2048", "Global.micro_batch_size=2", "Global.local_batch_size=2", "Global.global_batch_size=2"})
	if err != nil {
		t.Fatal(err)
	}
	need, _, err := gpuNeed(cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	cpu, err := engineMemory(planner.ModelOf(cfg), planner.StrategyOf(cfg), 1)
	if err != nil {
		t.Fatal(err)
	}
	m := cfg.Model
	probs := int64(4 * m.NumLayers * 2 * m.NumAttentionHeads * 2048 * 2048) // the CPU's (B,NH,T,T) a layer
	lse := int64(4 * m.NumLayers * 2 * m.NumAttentionHeads * 2048)          // the GPU's (B,NH,T)
	if want := cpu.Total - probs + lse + cuda.WorkspaceBytes + cuda.SumScratch; need != want {
		t.Errorf("a GPU process needs %d bytes, want the CPU's account %d less the probabilities %d, plus the log-sum-exps %d and the backend's workspaces %d: %d",
			need, cpu.Total, probs, lse, cuda.WorkspaceBytes+cuda.SumScratch, want)
	}
	t.Logf("GPU %s, CPU %s, probabilities %s", units.Bytes(need), units.Bytes(cpu.Total), units.Bytes(probs))
}
