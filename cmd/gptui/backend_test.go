package main

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
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

// TestGPUJobNeedsNCCL: the workers of a multi-process GPU job on a
// machine where libnccl does not load (this one) join the job, then stop
// with a one-line usage error (exit 2) saying that the job needs NCCL,
// where it was looked for and what to do, before any step.
func TestGPUJobNeedsNCCL(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	bin := builtGPTUI(t)
	logs := "Engine.log_dir=" + filepath.Join(t.TempDir(), "log")
	type result struct {
		code           int
		stdout, stderr string
	}
	results := make(chan result, 2)
	for r := range 2 {
		go func() {
			cmd := exec.Command(bin, "train", "-c", "tiny", "-o", "Global.device=gpu", "-o", "Distributed.dp_degree=2", "-o", logs,
				"-o", "Global.local_batch_size=4", "-o", "Global.micro_batch_size=4", "-o", "Engine.max_steps=1")
			cmd.Env = append(os.Environ(), "RANK="+strconv.Itoa(r), "LOCAL_RANK="+strconv.Itoa(r), "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
				"MASTER_PORT="+strconv.Itoa(port), "GPTUI_JOB_SECRET=test", "GPTUI_CUDA_LIBDIR="+t.TempDir())
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			results <- result{exitStatus(err), stdout.String(), stderr.String()}
		}()
	}
	for range 2 {
		res := <-results
		checkUserError(t, res.code, res.stderr, []string{"Global.device=gpu: a job of 2 processes needs NCCL", "libnccl.so not found", "install NCCL", "use Global.device=cpu"})
		if strings.Contains(res.stdout, "[model]") {
			t.Errorf("stdout %q: the run must not start", res.stdout)
		}
	}
}
