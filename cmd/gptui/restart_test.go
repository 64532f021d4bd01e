package main

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// restartArgs is a job of tiny as dp4 (global batch 4 of 16 tokens) that
// saves a checkpoint every 5 steps into out and runs 30 steps.
func restartArgs(out string) []string {
	return append(restartJob[:len(restartJob):len(restartJob)], "-o", "Engine.save_load.output_dir="+out)
}

var restartJob = []string{"-c", "tiny", "-o", "Engine.max_steps=30", "-o", "Engine.eval_freq=0", "-o", "Engine.logging_freq=1",
	"-o", "Distributed.dp_degree=4", "-o", "Global.global_batch_size=4", "-o", "Global.local_batch_size=1", "-o", "Global.micro_batch_size=1",
	"-o", "Data.Train.dataset.max_seq_len=16", "-o", "Engine.save_load.save_steps=5"}

// uninterruptedRun is rank 0's losses of restartJob run without a stop,
// shared by the tests.
var uninterruptedRun struct {
	once   sync.Once
	losses map[int]float64
	err    error
}

// stepLosses returns the loss of each step that rank 0 logged in out (the
// last time it logged the step); a line prefix of "" takes gptui run's
// local lines.
func stepLosses(t *testing.T, out string) map[int]float64 {
	t.Helper()
	losses := map[int]float64{}
	for _, l := range strings.Split(out, "\n") {
		i := strings.Index(l, "[train] epoch: ")
		if i < 0 || !(strings.HasPrefix(l, "[0] ") || strings.Contains(l, "/0] ")) {
			continue
		}
		f := strings.Fields(l[i:])
		var step int
		var loss float64
		for k := 0; k+1 < len(f); k++ {
			switch f[k] {
			case "step:":
				step, _ = strconv.Atoi(f[k+1])
			case "loss:":
				loss, _ = strconv.ParseFloat(f[k+1], 64)
			}
		}
		losses[step] = loss
	}
	return losses
}

// uninterrupted runs restartJob on this machine with --nproc 4, once, and
// returns rank 0's losses.
func uninterrupted(t *testing.T) map[int]float64 {
	t.Helper()
	exe := builtGPTUI(t)
	u := &uninterruptedRun
	u.once.Do(func() {
		dir, err := os.MkdirTemp("", "gptui-uninterrupted-")
		if err != nil {
			u.err = err
			return
		}
		defer os.RemoveAll(dir)
		cmd := exec.Command(exe, append(append([]string{"run", "--no-tui", "--nproc", "4"}, restartArgs(filepath.Join(dir, "out"))...),
			"-o", "Engine.log_dir="+filepath.Join(dir, "log"))...)
		cmd.Env = append(os.Environ(), "GPTUI_THREADS=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			u.err = fmt.Errorf("uninterrupted run: %v\n%s", err, out)
			return
		}
		u.losses = stepLosses(t, string(out))
	})
	if u.err != nil {
		t.Fatal(u.err)
	}
	return u.losses
}

// compareLosses checks that got has steps from..to-1 with the losses of
// want within 1e-5 relative.
func compareLosses(t *testing.T, got, want map[int]float64, from, to int) {
	t.Helper()
	for s := from; s < to; s++ {
		g, ok := got[s]
		w := want[s]
		if !ok || math.Abs(g-w) > 1e-5*math.Abs(w) {
			t.Errorf("step %d: loss %v (logged %v) after the restart, %v uninterrupted", s, g, ok, w)
		}
	}
}

// TestRestartWorkerKilled: two sshd nodes, tiny as dp4 saving every 5
// steps; a worker of the second node is SIGKILLed after step 12 and, with
// --max-restarts 1, the job resumes on both nodes from step 10 and runs to
// the end with the losses of an uninterrupted run. The checkpoints go to a
// directory both nodes see (a shared filesystem).
func TestRestartWorkerKilled(t *testing.T) {
	c := newSSHCluster(t, "cpu:2")
	args := restartArgs(filepath.Join(t.TempDir(), "shared-out"))
	want := uninterrupted(t)

	var stdout, stderr syncBuffer
	step12 := stdout.await("/0] [train] epoch: 0 step: 12 ")
	cmd := c.command(t, &stdout, &stderr, append([]string{"--max-restarts", "1", "--show-ranks", "all"}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		c.awaitGone(t, time.Now(), 10*time.Second)
	})
	select {
	case <-step12:
	case err := <-done:
		t.Fatalf("the job ended before step 12: exit %d\n%s\n%s", exitStatus(err), stdout.String(), stderr.String())
	case <-time.After(120 * time.Second):
		t.Fatalf("no step 12 after 120 s:\n%s\n%s", stdout.String(), stderr.String())
	}
	pid := c.workerPID(3)
	if pid == 0 {
		t.Fatalf("no worker of rank 3 among %v", c.jobProcesses())
	}
	killed := time.Now()
	syscall.Kill(pid, syscall.SIGKILL)
	running := stdout.await("/3] [checkpoint] resumed from ")
	var resumed time.Duration
	select {
	case <-running:
		resumed = time.Since(killed)
	case <-done:
		t.Fatalf("the job ended without resuming:\n%s\n%s", stdout.String(), stderr.String())
	case <-time.After(120 * time.Second):
		t.Fatalf("rank 3 has not resumed 120 s after the kill:\n%s\n%s", stdout.String(), stderr.String())
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(240 * time.Second):
		t.Fatalf("the job still runs 240 s after the kill:\n%s\n%s", stdout.String(), stderr.String())
	}
	out := stdout.String()
	if err != nil {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", exitStatus(err), out, stderr.String())
	}
	t.Logf("rank 3 resumed %v after the kill; the job ended %v after it", resumed, time.Since(killed))
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "[restart] ") {
			t.Log(l)
		}
	}
	if !strings.Contains(out, "[restart] 1/1: ") || !strings.Contains(out, "; resuming from step 10\n") {
		t.Errorf("no [restart] line resuming from step 10:\n%s", out)
	}
	for r := range 4 {
		node := []string{"127.0.0.2", "127.0.0.3"}[r/2]
		if w := fmt.Sprintf("[%s/%d] [checkpoint] resumed from ", node, r); !strings.Contains(out, w) || !strings.Contains(out[strings.Index(out, w):], " at step 10\n") {
			t.Errorf("rank %d on %s did not log that it resumed from step 10", r, node)
		}
	}
	if n := strings.Count(out, "[job] started"); n != 2 {
		t.Errorf("%d [job] started lines, want 2 (the start and the restart)", n)
	}
	compareLosses(t, stepLosses(t, out), want, 10, 30)
}
