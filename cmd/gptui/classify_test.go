package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The tests of how the launcher classifies a worker's end run 'gptui run
// --hosts' on an inventory of this machine alone (a localhost line: no
// SSH, the agent and the workers are local processes in the line's
// workdir), which takes --max-restarts as an inventory of sshd nodes does.

// localJob is a job on this machine as the one node of an inventory.
type localJob struct {
	hosts   string // the inventory
	workdir string // the node's workdir: the agent's and the workers' directory
}

// newLocalJob writes an inventory of this machine with cpus CPU workers.
func newLocalJob(t *testing.T, cpus int) *localJob {
	t.Helper()
	dir := t.TempDir()
	j := &localJob{hosts: filepath.Join(dir, "hosts.txt"), workdir: filepath.Join(dir, "node")}
	line := fmt.Sprintf("localhost devices=cpu:%d workdir=%s\n", cpus, j.workdir)
	if err := os.WriteFile(j.hosts, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	return j
}

// command returns 'gptui run --no-tui --hosts INVENTORY ARGS'.
func (j *localJob) command(t *testing.T, stdout, stderr *syncBuffer, args ...string) *exec.Cmd {
	cmd := exec.Command(builtGPTUI(t), append([]string{"run", "--no-tui", "--hosts", j.hosts}, args...)...)
	cmd.Env = append(os.Environ(), "GPTUI_THREADS=1")
	cmd.Stdout, cmd.Stderr = stdout, stderr
	return cmd
}

// start starts 'gptui run --no-tui --hosts INVENTORY ARGS'; when the test
// ends it is killed, and the job's processes must be gone within 10 s.
func (j *localJob) start(t *testing.T, stdout, stderr *syncBuffer, args ...string) *startedJob {
	t.Helper()
	return startJob(t, j.command(t, stdout, stderr, args...), stdout, stderr, func() { j.awaitGone(t, 10*time.Second) })
}

// processes returns the pids of the job's agent and workers: the
// processes that run in its workdir.
func (j *localJob) processes() []int {
	return liveProcesses(func(proc string) bool {
		cwd, _ := os.Readlink(filepath.Join(proc, "cwd"))
		return cwd == j.workdir
	})
}

// workerPID returns the pid of the job's worker of rank; it fails the
// test if there is none.
func (j *localJob) workerPID(t *testing.T, rank int) int {
	t.Helper()
	return rankWorker(t, j.processes(), rank)
}

// awaitGone waits up to limit for the job's processes to end, killing
// and reporting those left.
func (j *localJob) awaitGone(t *testing.T, limit time.Duration) {
	t.Helper()
	awaitNone(t, "processes of the job", j.processes, time.Now(), limit)
}

// TestRestartAfterSIGQUIT: SIGQUIT makes the Go runtime dump its
// goroutines and exit with status 2, the status of bad input, but the
// worker wrote no exit record saying so: under --max-restarts 1 the job is
// restarted from its newest checkpoint and ends with the losses of an
// uninterrupted run.
func TestRestartAfterSIGQUIT(t *testing.T) {
	// -short's restart is TestRestartWorkerKilled's; agent's
	// TestExitRecords tells a status 2 without a record from bad input.
	long(t)
	j := newLocalJob(t, 4)
	want := uninterrupted(t)
	var stdout, stderr syncBuffer
	step12 := stdout.await("/0] [train] epoch: 0 step: 12 ")
	job := j.start(t, &stdout, &stderr, append([]string{"--max-restarts", "1", "--show-ranks", "all"}, restartArgs(t, filepath.Join(t.TempDir(), "out"))...)...)
	job.awaitLine(t, step12, "step 12", 120*time.Second)
	syscall.Kill(j.workerPID(t, 2), syscall.SIGQUIT)
	err := job.wait(t, 240*time.Second, "the SIGQUIT")
	out := stdout.String()
	if err != nil {
		t.Fatalf("exit %d, want 0 (restarted)\nstdout:\n%s\nstderr:\n%s", exitStatus(err), out, stderr.String())
	}
	if !strings.Contains(out, "[restart] 1/1: rank 2 on localhost exited with code 2; resuming from step ") {
		t.Errorf("no restart after rank 2's exit 2:\n%s", out)
	}
	if n := strings.Count(out, "[job] started"); n != 2 {
		t.Errorf("%d [job] started lines, want 2 (the start and the restart)", n)
	}
	compareLosses(t, rank0Losses(t, out), want, resumedStep(t, out), restartSteps)
}

// TestBadInputNotRestarted: a worker that stops on bad input (its data
// directory missing, which a local node's workers find themselves) says
// so in its exit record: under --max-restarts 1 the job is not restarted
// and exits 2, naming the directory.
func TestBadInputNotRestarted(t *testing.T) {
	j := newLocalJob(t, 2)
	missing := filepath.Join(t.TempDir(), "no-shards")
	var stdout, stderr syncBuffer
	cmd := j.command(t, &stdout, &stderr, "--max-restarts", "1", "-c", "tiny", "-o", "Engine.max_steps=3",
		"-o", "Distributed.dp_degree=2", "-o", "Data.Train.dataset.input_dir="+missing)
	code := exitStatus(cmd.Run())
	j.awaitGone(t, 10*time.Second)
	out := stdout.String()
	if code != 2 {
		t.Errorf("exit %d, want 2\nstdout:\n%s\nstderr:\n%s", code, out, stderr.String())
	}
	if strings.Contains(out, "[restart]") || strings.Count(out, "[job] started") != 1 {
		t.Errorf("the job was restarted after bad input:\n%s", out)
	}
	if lines := strings.Split(strings.TrimSpace(stderr.String()), "\n"); !strings.Contains(stderr.String(), missing) || !strings.HasPrefix(lines[0], "gptui run: rank ") {
		t.Errorf("stderr does not name the rank and %s:\n%s", missing, stderr.String())
	}
}

// TestFinishedJobLogDiskFull: rank 1's metrics file on a full disk
// (/dev/full) fails its writes; training goes on, and after the last step
// the worker exits 1 saying, in its exit record, that it finished. The job
// is reported finished with the log error (exit 1, the checkpoint of the
// last step saved) and is not rerun, though --max-restarts 1 allows it.
func TestFinishedJobLogDiskFull(t *testing.T) {
	j := newLocalJob(t, 2)
	dir := t.TempDir()
	logs, ckpts := filepath.Join(dir, "log"), filepath.Join(dir, "out")
	os.MkdirAll(logs, 0o755)
	full := filepath.Join(logs, "metrics.1.jsonl")
	if err := os.Symlink("/dev/full", full); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr syncBuffer
	cmd := j.command(t, &stdout, &stderr, append([]string{"--max-restarts", "1"}, append(small(t), "-o", "Engine.max_steps=3", "-o", "Engine.eval_freq=0",
		"-o", "Distributed.dp_degree=2", "-o", "Global.local_batch_size=4", "-o", "Global.micro_batch_size=4",
		"-o", "Engine.log_dir="+logs, "-o", "Engine.save_load.save_steps=3", "-o", "Engine.save_load.output_dir="+ckpts)...)...)
	start := time.Now()
	code := exitStatus(cmd.Run())
	j.awaitGone(t, 10*time.Second)
	out, errs := stdout.String(), stderr.String()
	t.Logf("the job ended after %v", time.Since(start))
	if code != 1 {
		t.Errorf("exit %d, want 1 (finished, the log failure reported)\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	report := "the job finished, but rank 1 on localhost: log file " + full + ": no space left on device"
	if !strings.Contains(out, "[job] done: "+report) {
		t.Errorf("stdout lacks %q:\n%s", "[job] done: "+report, out)
	}
	if lines := strings.Split(strings.TrimSpace(errs), "\n"); !strings.HasPrefix(lines[len(lines)-1], "gptui: "+report) {
		t.Errorf("the last line of stderr is not %q:\n%s", report, errs)
	}
	if strings.Contains(out, "[restart]") || strings.Count(out, "[job] started") != 1 {
		t.Errorf("the finished job was rerun:\n%s", out)
	}
	if !strings.Contains(out, "[summary] steps 3 ") {
		t.Errorf("no summary of the finished job:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(ckpts, "step_00000003")); err != nil {
		t.Errorf("the last step's checkpoint: %v", err)
	}
}

// TestAddressSpaceLimit: under `ulimit -v 4000000` (KiB: 3.8 GiB, of which
// the Go runtime and the C library map some 1.7 GiB at start) a model
// that needs 4.1 GiB, more than the limit though less than this
// machine's memory, is refused in one line naming the need and the limit,
// exit 2, before the runtime could die allocating it; the small model
// trains under the same limit.
func TestAddressSpaceLimit(t *testing.T) {
	dir := t.TempDir()
	limited := func(args ...string) (int, string, string) {
		var stdout, stderr syncBuffer
		cmd := exec.Command("/bin/sh", append([]string{"-c", `ulimit -v 4000000 && exec "$0" "$@"`, builtGPTUI(t), "train"}, args...)...)
		cmd.Env = append(os.Environ(), "GPTUI_THREADS=1")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		return exitStatus(cmd.Run()), stdout.String(), stderr.String()
	}
	code, out, errs := limited("-c", "tiny", "-o", "Model.hidden_size=1536", "-o", "Model.num_layers=6", "-o", "Engine.log_dir="+filepath.Join(dir, "log"))
	lines := strings.Split(strings.TrimSpace(errs), "\n")
	if code != 2 || len(lines) != 1 || out != "" {
		t.Fatalf("exit %d, %d lines on stderr; want exit 2 and one line\nstdout:\n%s\nstderr:\n%s", code, len(lines), out, errs)
	}
	for _, w := range []string{"each training process needs 4.1 GiB", "that its address-space limit leaves (ulimit -v 4000000 KiB = 3.8 GiB", "Model.num_layers"} {
		if !strings.Contains(lines[0], w) {
			t.Errorf("the error %q lacks %q", lines[0], w)
		}
	}
	t.Log(lines[0])
	code, out, errs = limited(append(small(t), "-o", "Engine.max_steps=2", "-o", "Engine.eval_freq=0", "-o", "Engine.log_dir="+filepath.Join(dir, "log"),
		"-o", "Engine.save_load.save_steps=2", "-o", "Engine.save_load.output_dir="+filepath.Join(dir, "out"))...)
	if code != 0 || !strings.Contains(out, "[done] steps: 2") {
		t.Errorf("the small model under the limit: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
}
