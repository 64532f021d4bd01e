package main

import (
	"os/exec"
	"testing"
	"time"
)

// startedJob is a command a test has started (a launcher, or a single
// gptui train) whose output goes to two syncBuffers: the test awaits
// lines of it, and its end, each within a limit.
type startedJob struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan error // cmd.Wait's result
}

// startJob starts cmd, whose Stdout and Stderr are stdout and stderr.
// When the test ends the command is killed and then ended (if not nil)
// is called: to wait for the processes the command started to be gone.
func startJob(t *testing.T, cmd *exec.Cmd, stdout, stderr *syncBuffer, ended func()) *startedJob {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	j := &startedJob{cmd: cmd, stdout: stdout, stderr: stderr, done: make(chan error, 1)}
	go func() { j.done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		if ended != nil {
			ended()
		}
	})
	return j
}

// awaitLine waits up to limit for seen (a syncBuffer's await channel),
// and fails the test, naming what it waited for, if the job ends first or
// the limit passes.
func (j *startedJob) awaitLine(t *testing.T, seen <-chan struct{}, what string, limit time.Duration) {
	t.Helper()
	select {
	case <-seen:
	case err := <-j.done:
		t.Fatalf("the job ended before %s: exit %d\n%s\n%s", what, exitStatus(err), j.stdout.String(), j.stderr.String())
	case <-time.After(limit):
		t.Fatalf("no %s after %.0f s:\n%s\n%s", what, limit.Seconds(), j.stdout.String(), j.stderr.String())
	}
}

// wait waits up to limit for the job to end and returns cmd.Wait's error;
// it fails the test if the job still runs then, saying after what (the
// moment the wait began: "the kill").
func (j *startedJob) wait(t *testing.T, limit time.Duration, after string) error {
	t.Helper()
	select {
	case err := <-j.done:
		return err
	case <-time.After(limit):
		t.Fatalf("the job still runs %.0f s after %s:\n%s\n%s", limit.Seconds(), after, j.stdout.String(), j.stderr.String())
		return nil
	}
}
