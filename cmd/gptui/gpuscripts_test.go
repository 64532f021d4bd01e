package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The device scripts, scripts/gpu-check.sh and scripts/llmc-bench.sh, run
// on a GPU machine that CI never has. Their dry mode runs their own logic
// here: the stages in order, each under its scaled limit, a row per stage
// in summary.tsv as it ends, the skips a failed gate causes, a run cut off
// by a signal; the commands that need a GPU are stand-ins, training runs
// on the CPU. Without dry mode and without a GPU they stop in one line.

// gpuScript is one run of a device script.
type gpuScript struct {
	cmd            *exec.Cmd
	out, tmp       string // $OUT; TMPDIR, which must be left empty
	stdout, stderr bytes.Buffer
}

// newGPUScript prepares scripts/NAME with args, the environment's
// GPU_CHECK_* settings replaced by env, BIN this package's gptui, and
// fresh OUT and TMPDIR folders.
func newGPUScript(t *testing.T, name string, env []string, args ...string) *gpuScript {
	t.Helper()
	s := &gpuScript{out: filepath.Join(t.TempDir(), "out"), tmp: t.TempDir()}
	s.cmd = exec.Command(filepath.Join(srcDir, "..", "..", "scripts", name), args...)
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(k, "GPU_CHECK_") && k != "OUT" && k != "BIN" && k != "TMPDIR" && k != "LLMC" && k != "LLMC_DATA" {
			s.cmd.Env = append(s.cmd.Env, kv)
		}
	}
	s.cmd.Env = append(s.cmd.Env, append(env, "OUT="+s.out, "TMPDIR="+s.tmp, "BIN="+builtGPTUI(t))...)
	s.cmd.Stdout, s.cmd.Stderr = &s.stdout, &s.stderr
	return s
}

// run runs the script to its end and returns its exit status.
func (s *gpuScript) run(t *testing.T) int {
	t.Helper()
	err := s.cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatal(err)
	}
	s.checkClean(t)
	return exitStatus(err)
}

// checkClean: the script left nothing in TMPDIR, and at most the 8 files
// the device machine returns in OUT.
func (s *gpuScript) checkClean(t *testing.T) {
	t.Helper()
	if left, _ := os.ReadDir(s.tmp); len(left) > 0 {
		t.Errorf("left behind in TMPDIR: %v", left)
	}
	if files, _ := os.ReadDir(s.out); len(files) > 8 {
		t.Errorf("%d files in OUT; the device machine returns 8", len(files))
	}
}

// stageRow is a row of summary.tsv.
type stageRow struct{ stage, status, secs, limit, figures string }

func (s *gpuScript) rows(t *testing.T) []stageRow {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.out, "summary.tsv"))
	if err != nil {
		t.Fatalf("no summary: %v\nstdout:\n%s\nstderr:\n%s", err, &s.stdout, &s.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if lines[0] != "stage\tstatus\tseconds\tlimit_s\tfigures" {
		t.Fatalf("summary.tsv header %q", lines[0])
	}
	var rows []stageRow
	for _, l := range lines[1:] {
		f := strings.Split(l, "\t")
		if len(f) != 5 {
			t.Fatalf("summary.tsv row %q: %d fields, want 5", l, len(f))
		}
		rows = append(rows, stageRow{f[0], f[1], f[2], f[3], f[4]})
	}
	return rows
}

// checkRows compares rows with want, stage by stage: the status, and
// that the figures hold each of the strings given.
func checkRows(t *testing.T, rows []stageRow, want []stageRow) {
	t.Helper()
	if len(rows) != len(want) {
		t.Errorf("%d rows, want %d: %v", len(rows), len(want), rows)
	}
	for i := range min(len(rows), len(want)) {
		r, w := rows[i], want[i]
		if r.stage != w.stage || r.status != w.status {
			t.Errorf("row %d: %s %s, want %s %s (%s)", i, r.stage, r.status, w.stage, w.status, r.figures)
		}
		for _, f := range strings.Split(w.figures, "|") {
			if !strings.Contains(r.figures, f) {
				t.Errorf("%s: figures %q do not hold %q", r.stage, r.figures, f)
			}
		}
	}
}

// gpuCheckLimits are gpu-check.sh's stage limits in dry mode: ×0.1, but
// at least 3 s, and 30 s for the stages that train on the CPU.
var gpuCheckLimits = map[string]string{"libs": "3.00", "selftest": "4.50", "kernels-fp32": "5.00", "kernels-bf16": "3.00",
	"tiny-fp32": "3.50", "124m-bf16": "4.50", "bench": "3.00", "train-124m": "30.00", "fp16-124m": "30.00", "train-llama": "30.00",
	"nccl-1rank": "3.00", "llmc": "8.00"}

// TestGPUCheckDry runs every stage of gpu-check.sh in dry mode, one of
// them hanging: each
// stage gets its own limit (summing, with the checks before the first, to
// the 540 s deadline), the hanging one is cut at its limit and the run
// goes on, and every row carries its stage's key figures.
func TestGPUCheckDry(t *testing.T) {
	long(t)
	t.Parallel()
	s := newGPUScript(t, "gpu-check.sh", []string{"GPU_CHECK_DRY_HANG=kernels-bf16"}, "--dry")
	if code := s.run(t); code != 1 {
		t.Errorf("exit status %d, want 1 (a stage timed out)\n%s%s", code, &s.stdout, &s.stderr)
	}
	rows := s.rows(t)
	checkRows(t, rows, []stageRow{
		{stage: "libs", status: "pass", figures: "gpu=DRY_H100_80GB_HBM3_sm_90|driver_cuda=13.0|nvrtc=13.0|nccl=2.27.7"},
		{stage: "selftest", status: "pass", figures: "passed=1 failed=0|self-test: 31 passed"},
		{stage: "kernels-fp32", status: "pass", figures: "kernels: 52 checks, 0 failed"},
		{stage: "kernels-bf16", status: "timeout", figures: "cut at the 3.00 s limit; last line: dry: kernels-bf16 hangs"},
		{stage: "tiny-fp32", status: "pass", figures: "fp32 loss, 10 steps (tol 1e-5 rel): worst 3.10e-07"},
		{stage: "124m-bf16", status: "pass", figures: "passed=2 failed=0|bf16 gradients"},
		{stage: "bench", status: "pass", figures: "bf16_tflops=702.5 fp16_tflops=710.1 fp32_ieee_tflops=48.3"},
		{stage: "train-124m", status: "pass", figures: "steps=20 step_s=|tokens_per_s=|mfu=|loss_fell=yes"},
		{stage: "fp16-124m", status: "pass", figures: "steps=20|skipped_steps=0 loss_scale=32768"},
		{stage: "train-llama", status: "pass", figures: "steps=20 step_s=|tokens_per_s=|loss_fell="},
		{stage: "nccl-1rank", status: "pass", figures: "passed=6 failed=0|NCCL fabric dp: every operation: ok|NCCL fabric record: 52 operations done, 0 in flight"},
		{stage: "llmc", status: "pass", figures: "step_ms=40.00 tokens_per_s=409600|llmc_mfu=42.0%|gptui_over_llmc="},
	})
	for _, r := range rows {
		if r.limit != gpuCheckLimits[r.stage] {
			t.Errorf("%s: limit %s s, want %s", r.stage, r.limit, gpuCheckLimits[r.stage])
		}
		if r.stage == "kernels-bf16" {
			if secs, _ := strconv.ParseFloat(r.secs, 64); secs < 3 || secs > 10 {
				t.Errorf("the hanging stage ran %s s; its limit is 3 s", r.secs)
			}
		}
	}
	md, _ := os.ReadFile(filepath.Join(s.out, "summary.md"))
	for _, want := range []string{"limits summing to 525 s (×0.1), deadline 540 s;", "| kernels-bf16 | timeout | ", "| llmc | pass | "} {
		if !strings.Contains(string(md), want) {
			t.Errorf("summary.md does not hold %q:\n%s", want, md)
		}
	}
	log, _ := os.ReadFile(filepath.Join(s.out, "stages.log"))
	for _, want := range []string{"==== kernels-bf16 (limit 3.00 s)", "dry: kernels-bf16 hangs", "==== kernels-bf16: timeout", "[done] steps: 20 ", "== NCCL fabric, one rank: every operation vs the CPU =="} {
		if !strings.Contains(string(log), want) {
			t.Errorf("stages.log does not hold %q", want)
		}
	}
}

// TestGPUCheckDryNoNVCC: on a machine with the libraries but without
// nvcc or make (GPU_CHECK_DRY_MISSING), the llmc stage is skipped saying
// why, its build never starts, the other stages are checked, and the run
// passes when they do.
func TestGPUCheckDryNoNVCC(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ missing, want string }{
		{"nvcc", "no nvcc here: llm.c's build needs nvcc (PATH or /usr/local/cuda*/bin) and make"},
		{"make nvcc", "no nvcc or make here: "},
	} {
		t.Run(tc.missing, func(t *testing.T) {
			t.Parallel()
			s := newGPUScript(t, "gpu-check.sh", []string{"GPU_CHECK_DRY_MISSING=" + tc.missing}, "--dry", "selftest", "llmc")
			if code := s.run(t); code != 0 {
				t.Errorf("exit status %d, want 0 (a skipped stage fails nothing)\n%s%s", code, &s.stdout, &s.stderr)
			}
			checkRows(t, s.rows(t), []stageRow{
				{stage: "libs", status: "pass"},
				{stage: "selftest", status: "pass"},
				{stage: "llmc", status: "skipped", figures: tc.want},
			})
			if _, err := os.Stat(filepath.Join(s.out, "llmc-build.log")); err == nil {
				t.Errorf("the llm.c build ran without %s", tc.missing)
			}
		})
	}
}

// TestGPUCheckDryStopped: a run stopped by SIGTERM in the middle of a
// stage still answers: the rows of the stages that ended, the stopped
// stage's row, and a skipped row for each stage not run; exit 143.
func TestGPUCheckDryStopped(t *testing.T) {
	t.Parallel()
	s := newGPUScript(t, "gpu-check.sh", []string{"GPU_CHECK_DRY_HANG=bench"}, "--dry", "libs", "selftest", "bench", "train-124m", "llmc")
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, _ := os.ReadFile(filepath.Join(s.out, "stages.log"))
		if bytes.Contains(b, []byte("dry: bench hangs")) {
			break
		}
		if time.Now().After(deadline) {
			s.cmd.Process.Kill()
			t.Fatalf("the bench stage did not start:\n%s\n%s", b, &s.stdout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	err := s.cmd.Wait()
	if code := exitStatus(err); code != 143 {
		t.Errorf("exit status %d, want 143", code)
	}
	s.checkClean(t)
	checkRows(t, s.rows(t), []stageRow{
		{stage: "libs", status: "pass"},
		{stage: "selftest", status: "pass"},
		{stage: "bench", status: "timeout", figures: "the whole run was stopped (SIGTERM) during this stage"},
		{stage: "train-124m", status: "skipped", figures: "the run was stopped (SIGTERM) before this stage"},
		{stage: "llmc", status: "skipped", figures: "the run was stopped (SIGTERM) before this stage"},
	})
}

// TestGPUCheckDryGates: a failed library discovery skips the GPU stages,
// the NCCL stage among them, saying why.
func TestGPUCheckDryGates(t *testing.T) {
	t.Parallel()
	s := newGPUScript(t, "gpu-check.sh", []string{"GPU_CHECK_DRY_FAIL=libs"}, "--dry", "selftest", "nccl-1rank")
	if code := s.run(t); code != 1 {
		t.Errorf("exit status %d, want 1", code)
	}
	checkRows(t, s.rows(t), []stageRow{
		{stage: "libs", status: "fail", figures: "exit 2: gptui: libs: failed on purpose"},
		{stage: "selftest", status: "skipped", figures: "libs fail: gptui: libs: failed on purpose"},
		{stage: "nccl-1rank", status: "skipped", figures: "libs fail: gptui: libs: failed on purpose"},
	})
}

// TestLLMCBenchDry: llmc-bench.sh alone, its build and its timed run, in
// its 4 minutes (dry: ×0.1).
func TestLLMCBenchDry(t *testing.T) {
	t.Parallel()
	s := newGPUScript(t, "llmc-bench.sh", nil, "--dry")
	if code := s.run(t); code != 0 {
		t.Errorf("exit status %d, want 0\n%s%s", code, &s.stdout, &s.stderr)
	}
	rows := s.rows(t)
	checkRows(t, rows, []stageRow{
		{stage: "llmc-build", status: "pass", figures: "nvcc=13.0 sm=90"},
		{stage: "llmc", status: "pass", figures: "steps=30 step_ms=40.00 tokens_per_s=409600 avg_step_ms=40.000000 llmc_mfu=42.0% first_loss=10.900000 final_loss=8.000000"},
	})
	if len(rows) == 2 && (rows[0].limit != "17.00" || rows[1].limit != "6.00") {
		t.Errorf("limits %s and %s s, want 17.00 and 6.00 (170 and 60 s, ×0.1)", rows[0].limit, rows[1].limit)
	}
}

// TestGPUScriptsWithoutGPU: without dry mode, on a machine without a GPU,
// each script stops at once with one line saying so; a stage that does
// not exist is one line too.
func TestGPUScriptsWithoutGPU(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		script string
		args   []string
		want   []string
	}{
		{"gpu-check.sh", nil, []string{"gpu-check: no GPU here: ", "libcuda.so not found", "--dry"}},
		{"gpu-check.sh", []string{"--dry", "selftest", "warp"}, []string{"gpu-check: no stage warp; the stages: libs selftest "}},
		{"llmc-bench.sh", nil, []string{"llmc-bench: no GPU here", "--dry"}},
	} {
		s := newGPUScript(t, tc.script, nil, tc.args...)
		if code := s.run(t); code != 2 {
			t.Errorf("%s %v: exit status %d, want 2", tc.script, tc.args, code)
		}
		out := s.stdout.String() + s.stderr.String()
		if strings.Count(out, "\n") != 1 {
			t.Errorf("%s %v: want one line, got:\n%s", tc.script, tc.args, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s %v: %q does not say %q", tc.script, tc.args, out, w)
			}
		}
	}
}
