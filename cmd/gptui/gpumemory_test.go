package main

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/gptui/gptui/internal/standin"
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
