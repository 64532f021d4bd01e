package main

import (
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/engine/checkpoint"
)

// The interrupt tests stop a parallel job with a signal, check the exit
// status and the checkpoint of the last finished step, and resume from it
// in one process: its losses must equal those of one process that was
// never interrupted. The job runs mp2 × sharding2, so a checkpoint missing
// any rank's part (a tensor-parallel half of the weights, a shard of the
// moments) resumes to different losses.

// interruptArgs are the training options of every run of these tests.
func interruptArgs(t *testing.T, out string) []string {
	return append(small(t), "-o", "Engine.eval_freq=0", "-o", "Engine.logging_freq=1",
		"-o", "Data.Train.dataset.max_seq_len=16", "-o", "Global.global_batch_size=4",
		"-o", "Optimizer.lr.decay_steps=50", "-o", "Engine.save_load.output_dir="+out)
}

// parallelArgs make a 4-rank job of interruptArgs that runs until stopped.
var parallelArgs = []string{"-o", "Distributed.mp_degree=2", "-o", "Distributed.sharding.sharding_degree=2",
	"-o", "Global.local_batch_size=2", "-o", "Global.micro_batch_size=2",
	"-o", "Engine.max_steps=100000", "-o", "Engine.save_load.save_steps=100000"}

var trainLine = regexp.MustCompile(`\[train\] epoch: \d+ step: (\d+) .* loss: ([0-9.]+) `)

// stepLosses maps step to loss over the [train] lines of out.
func stepLosses(out string) map[int]float64 {
	m := map[int]float64{}
	for _, l := range strings.Split(out, "\n") {
		if s := trainLine.FindStringSubmatch(l); s != nil {
			step, _ := strconv.Atoi(s[1])
			m[step], _ = strconv.ParseFloat(s[2], 64)
		}
	}
	return m
}

// interruptedCheckpoint returns the step of the newest checkpoint in out
// (which must be the only one) and its directory.
func interruptedCheckpoint(t *testing.T, out string) (int, string) {
	t.Helper()
	c, warn, err := checkpoint.Latest(out)
	if err != nil || len(warn) > 0 {
		t.Fatalf("no checkpoint after the interrupt: %v %v", err, warn)
	}
	entries, _ := os.ReadDir(out)
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
		}
	}
	if len(dirs) != 1 {
		t.Errorf("output holds %v; want the interrupt's checkpoint alone", dirs)
	}
	return c.Manifest.Step, c.Dir
}

// checkResume resumes one process from ckpt (the state after step steps)
// for two steps, and compares every loss of the interrupted job (job) and
// of the resumed run with one process trained from the start.
func checkResume(t *testing.T, dir string, step int, ckpt string, job map[int]float64) {
	t.Helper()
	one := append(interruptArgs(t, filepath.Join(dir, "ref-out")), "-o", "Global.local_batch_size=4", "-o", "Global.micro_batch_size=2",
		"-o", "Engine.max_steps="+strconv.Itoa(step+2))
	ref := referenceLosses(t, max(step+2, len(job)))
	code, out, e := runCLI(t, append([]string{"train", "-o", "Engine.log_dir=" + filepath.Join(dir, "resume-log"), "-o", "Engine.save_load.ckpt_dir=" + ckpt}, one...)...)
	if code != 0 {
		t.Fatalf("resumed run: exit %d: %s", code, e)
	}
	resumed := stepLosses(out)
	if len(resumed) != 2 {
		t.Fatalf("resumed run logged steps %v; want %d and %d:\n%s", resumed, step, step+1, out)
	}
	compare := func(what string, got map[int]float64) {
		for s, l := range got {
			if r, ok := ref[s]; !ok || math.Abs(l-r) > 1e-5*math.Abs(r) {
				t.Errorf("%s: step %d loss %.6f, uninterrupted %.6f", what, s, l, r)
			}
		}
	}
	compare("the interrupted job", job)
	compare("resumed", resumed)
	t.Logf("checkpoint at step %d; resumed losses %v, uninterrupted %v", step, resumed, map[int]float64{step: ref[step], step + 1: ref[step+1]})
}

// reference holds the losses of one uninterrupted process of
// interruptArgs, shared by the tests (the learning rate's schedule is fixed
// by decay_steps, so a step's loss does not depend on max_steps).
var reference struct {
	sync.Mutex
	losses map[int]float64
}

// referenceLosses returns the losses of steps 0 to at least steps-1 of one
// process that was never interrupted, training it the first time (and
// again only for more steps).
func referenceLosses(t *testing.T, steps int) map[int]float64 {
	t.Helper()
	reference.Lock()
	defer reference.Unlock()
	if len(reference.losses) >= steps {
		return reference.losses
	}
	dir := t.TempDir()
	args := append(interruptArgs(t, filepath.Join(dir, "out")), "-o", "Global.local_batch_size=4", "-o", "Global.micro_batch_size=2",
		"-o", "Engine.max_steps="+strconv.Itoa(max(steps, 12)))
	code, out, e := runCLI(t, append([]string{"train", "-o", "Engine.log_dir=" + filepath.Join(dir, "log")}, args...)...)
	if code != 0 {
		t.Fatalf("reference run: exit %d: %s", code, e)
	}
	reference.losses = stepLosses(out)
	return reference.losses
}

// stopSignals are the signals that stop a job with a save, and the exit
// status of each.
var stopSignals = []struct {
	sig  syscall.Signal
	code int
}{{syscall.SIGINT, 130}, {syscall.SIGTERM, 143}, {syscall.SIGHUP, 129}}

// TestRunInterruptSaves: SIGINT, SIGTERM or SIGHUP to 'gptui run --nproc 4' makes the 4
// workers agree on a step, save it and exit; the launcher exits 130, 143
// or 129, and a resume from the checkpoint is exact.
func TestRunInterruptSaves(t *testing.T) {
	long(t)
	for _, tc := range stopSignals {
		t.Run(tc.sig.String(), func(t *testing.T) { runInterruptSaves(t, tc.sig, tc.code) })
	}
}

func runInterruptSaves(t *testing.T, sig syscall.Signal, want int) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	var stdout, stderr syncBuffer
	training := stdout.await("[0] [train] epoch: 0 step: 1 ")
	args := append([]string{"run", "--no-tui", "--nproc", "4", "-o", "Engine.log_dir=" + filepath.Join(dir, "log")}, append(interruptArgs(t, out), parallelArgs...)...)
	cmd := exec.Command(builtGPTUI(t), args...)
	cmd.Env = append(os.Environ(), "GPTUI_THREADS=1")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	run := startJob(t, cmd, &stdout, &stderr, nil)
	run.awaitLine(t, training, "training", 120*time.Second)
	sent := time.Now()
	cmd.Process.Signal(sig)
	err := run.wait(t, 60*time.Second, sig.String())
	t.Logf("launcher exited %v after %v", time.Since(sent), sig)
	if code := exitStatus(err); code != want || !strings.Contains(stderr.String(), "interrupted") {
		t.Fatalf("exit %d, want %d; stderr:\n%s", code, want, stderr.String())
	}
	step, ckpt := interruptedCheckpoint(t, out)
	if !strings.Contains(stdout.String(), "[0] [checkpoint] saved step "+strconv.Itoa(step)+" ") {
		t.Errorf("rank 0 does not report saving step %d:\n%s", step, stdout.String())
	}
	job := stepLosses(stdout.String())
	if len(job) != step {
		t.Errorf("the job logged %d steps but saved step %d", len(job), step)
	}
	checkResume(t, dir, step, ckpt, job)
}

// TestRunHostsInterruptSaves: SIGINT, SIGTERM or SIGHUP to 'gptui run
// --hosts' (two sshd nodes × 2 workers) reaches every worker through its
// agent; they agree on a step, rank 0 saves it on its node and every
// process exits; the launcher exits 130, 143 or 129, and a resume from the
// checkpoint is exact.
func TestRunHostsInterruptSaves(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	c := newSSHCluster(t, "cpu:2")
	for _, tc := range stopSignals {
		t.Run(tc.sig.String(), func(t *testing.T) { runHostsInterruptSaves(t, c, tc.sig, tc.code) })
	}
}

func runHostsInterruptSaves(t *testing.T, c *sshCluster, sig syscall.Signal, want int) {
	dir := t.TempDir()
	var stdout, stderr syncBuffer
	training := stdout.await("/0] [train] epoch: 0 step: 1 ")
	// Each signal's job saves into its own directory of the workdirs.
	out := fmt.Sprintf("out-%d", int(sig))
	run := c.start(t, &stdout, &stderr, append(interruptArgs(t, out), parallelArgs...)...)
	run.awaitLine(t, training, "training", 120*time.Second)
	sent := time.Now()
	run.cmd.Process.Signal(sig)
	err := run.wait(t, 60*time.Second, sig.String())
	took := time.Since(sent)
	gone := c.awaitGone(t, sent, 60*time.Second)
	t.Logf("launcher exited %v after %v; every process gone after %v", took, sig, gone)
	if exitStatus(err) != want || !strings.Contains(stderr.String(), "interrupted") {
		t.Fatalf("exit %d, stderr %q; want %d, interrupted", exitStatus(err), stderr.String(), want)
	}
	if !strings.Contains(stdout.String(), "[job] stopped") {
		t.Errorf("no job stopped line in:\n%s", stdout.String())
	}
	// Rank 0 runs on the first node: the checkpoint is in its workdir.
	step, ckpt := interruptedCheckpoint(t, filepath.Join(c.workdirs[0], out))
	job := stepLosses(stdout.String())
	if len(job) != step {
		t.Errorf("the job logged %d steps but saved step %d", len(job), step)
	}
	checkResume(t, dir, step, ckpt, job)
}

// TestTrainHangupSaves: SIGHUP (a closed terminal) to a single 'gptui
// train' with asynchronous saves saves the finished steps, waits for the
// write and exits 129; a resume from the checkpoint is exact.
func TestTrainHangupSaves(t *testing.T) {
	long(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	var stdout, stderr syncBuffer
	training := stdout.await("[train] epoch: 0 step: 1 ")
	args := append([]string{"train", "-o", "Engine.log_dir=" + filepath.Join(dir, "log"), "-o", "Engine.save_load.async=true",
		"-o", "Global.local_batch_size=4", "-o", "Global.micro_batch_size=2", "-o", "Engine.max_steps=100000", "-o", "Engine.save_load.save_steps=100000"},
		interruptArgs(t, out)...)
	cmd := exec.Command(builtGPTUI(t), args...)
	cmd.Env = append(os.Environ(), "GPTUI_THREADS=1")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	run := startJob(t, cmd, &stdout, &stderr, nil)
	run.awaitLine(t, training, "training", 120*time.Second)
	cmd.Process.Signal(syscall.SIGHUP)
	err := run.wait(t, 60*time.Second, "SIGHUP")
	if code := exitStatus(err); code != 129 || !strings.Contains(stderr.String(), "interrupted") {
		t.Fatalf("exit %d, want 129; stderr:\n%s", code, stderr.String())
	}
	step, ckpt := interruptedCheckpoint(t, out)
	if !strings.Contains(stdout.String(), "[checkpoint] saved step "+strconv.Itoa(step)+" ") || !strings.Contains(stdout.String(), "in background)") {
		t.Errorf("no background save of step %d reported:\n%s", step, stdout.String())
	}
	checkResume(t, dir, step, ckpt, stepLosses(stdout.String()))
}

// TestInterruptWhileJoining: a worker still joining its job — rank 0
// waiting for a rank that never comes, rank 1 for a master that accepts
// its connection and never answers — ends at the first SIGTERM, exit 143,
// as it has no finished step to save; it used to wait out the join's
// timeout, and under a launcher its stop's 120 s grace.
func TestInterruptWhileJoining(t *testing.T) {
	t.Parallel() // one process, of its own
	for _, tc := range []struct {
		name string
		rank int
	}{{"rank 0 without its peer", 0}, {"rank 1 without an answer", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			port, joined := 0, make(chan net.Conn, 1)
			if tc.rank == 0 {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				port = ln.Addr().(*net.TCPAddr).Port
				ln.Close() // rank 0 listens there
			} else {
				ln, err := net.Listen("tcp", "127.0.0.1:0") // the master that never answers
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { ln.Close() })
				port = ln.Addr().(*net.TCPAddr).Port
				go func() {
					if c, err := ln.Accept(); err == nil {
						joined <- c
					}
				}()
			}
			var stdout, stderr syncBuffer
			cmd := exec.Command(builtGPTUI(t), "train", "-c", "tiny", "-o", "Distributed.dp_degree=2", "-o", "Engine.max_steps=2",
				"-o", "Engine.save_load.output_dir="+filepath.Join(t.TempDir(), "out"), "-o", "Engine.log_dir="+filepath.Join(t.TempDir(), "log"))
			cmd.Env = append(os.Environ(), "GPTUI_THREADS=1", "WORLD_SIZE=2", fmt.Sprintf("RANK=%d", tc.rank), fmt.Sprintf("LOCAL_RANK=%d", tc.rank),
				"MASTER_ADDR=127.0.0.1", fmt.Sprintf("MASTER_PORT=%d", port), comm.SecretEnv+"=0123456789abcdef0123456789abcdef",
				"GPTUI_COMM_INIT_TIMEOUT=300s")
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			run := startJob(t, cmd, &stdout, &stderr, nil)
			// Joining: rank 0 listens, rank 1 has connected.
			for deadline := time.Now().Add(60 * time.Second); tc.rank == 0; time.Sleep(20 * time.Millisecond) {
				if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
					c.Close()
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("rank 0 does not listen on its port after 60 s:\n%s", stderr.String())
				}
			}
			if tc.rank == 1 {
				select {
				case c := <-joined:
					defer c.Close()
				case <-time.After(60 * time.Second):
					t.Fatalf("rank 1 has not connected to its master after 60 s:\n%s", stderr.String())
				}
			}
			sent := time.Now()
			cmd.Process.Signal(syscall.SIGTERM)
			err := run.wait(t, 10*time.Second, "SIGTERM")
			t.Logf("exit %d %v after SIGTERM", exitStatus(err), time.Since(sent).Round(time.Millisecond))
			if code := exitStatus(err); code != 143 || !strings.Contains(stderr.String(), "interrupted") {
				t.Errorf("exit %d, want 143; stderr:\n%s", code, stderr.String())
			}
		})
	}
}
