package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// TestCPUBackendErrors: a GEMM library GPTUI_BLAS names that does not load
// is a one-line usage error (exit 2) naming the variable and why, before
// any step.
func TestCPUBackendErrors(t *testing.T) {
	logs := "Engine.log_dir=" + filepath.Join(t.TempDir(), "log")
	type backendCase struct {
		name, blas string
		want       []string
	}
	tests := []backendCase{
		{"missing file", "/nonexistent/libopenblas.so.0", []string{"GPTUI_BLAS=/nonexistent/libopenblas.so.0", "dlopen"}},
	}
	if runtime.GOOS == "linux" {
		tests = append(tests, backendCase{"not a BLAS", "libm.so.6", []string{"GPTUI_BLAS=libm.so.6", "does not export cblas_sgemm"}})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GPTUI_BLAS", tc.blas)
			code, stdout, stderr := runCLI(t, "train", "-c", "tiny", "-o", logs, "-o", "Engine.max_steps=1")
			checkUserError(t, code, stderr, tc.want)
			if stdout != "" {
				t.Errorf("stdout %q: the run must not start", stdout)
			}
		})
	}
}

// TestCPUBF16MissingFeature: Engine.mix_precision.dtype bf16 on the CPU
// where AVX512_BF16 is missing — hidden from the binary with GODEBUG on
// CPUs that have it — is a one-line usage error naming the key and the
// feature, exit 2.
func TestCPUBF16MissingFeature(t *testing.T) {
	cmd := exec.Command(builtGPTUI(t), "train", "-c", "tiny", "-o", "Engine.mix_precision.dtype=bf16",
		"-o", "Engine.max_steps=1", "-o", "Engine.log_dir="+filepath.Join(t.TempDir(), "log"))
	cmd.Env = append(os.Environ(), "GODEBUG=cpu.avx512bf16=off")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("gptui train: %v, want exit 2 (stderr %q)", err, stderr.String())
	}
	checkUserError(t, ee.ExitCode(), stderr.String(), []string{"Engine.mix_precision.dtype", "bf16", "AVX512_BF16", "use dtype fp32"})
	if stdout.Len() != 0 {
		t.Errorf("stdout %q: the run must not start", stdout.String())
	}
}
