package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gptui/gptui/launch"
)

// TestPeerDeath: SIGKILL one of 4 worker processes mid-training (started
// directly, with no launcher to stop the rest): every other rank exits
// non-zero within 30 s with an error naming the lost rank.
func TestPeerDeath(t *testing.T) {
	long(t)
	exe := builtGPTUI(t)
	port, err := launch.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	const world, victim = 4, 2
	// Every rank's arguments, the job's own output folder among them.
	args := append(append(append([]string{"train"}, small(t)...),
		"-o", "Distributed.dp_degree=4", "-o", "Global.local_batch_size=2", "-o", "Global.micro_batch_size=2",
		"-o", "Engine.max_steps=100000", "-o", "Engine.eval_freq=0", "-o", "Engine.logging_freq=1",
		"-o", "Engine.log_dir="+filepath.Join(dir, "log")), ownOutput(t)...)
	cmds := make([]*exec.Cmd, world)
	outs := make([]*bytes.Buffer, world)
	done := make([]chan error, world)
	for r := 0; r < world; r++ {
		c := exec.Command(exe, args...)
		c.Env = append(os.Environ(), "GPTUI_THREADS=1", "GPTUI_COMM_TIMEOUT=20s")
		c.Env = append(c.Env, launch.Env(r, r, world, "127.0.0.1", port, "peer-test-secret")...)
		outs[r] = new(bytes.Buffer)
		c.Stdout, c.Stderr = outs[r], outs[r]
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[r] = c
		done[r] = make(chan error, 1)
		go func(r int) { done[r] <- cmds[r].Wait() }(r)
	}
	defer func() {
		for _, c := range cmds {
			c.Process.Kill()
		}
	}()
	// Wait until training runs (a few steps logged by rank 0).
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(readLog(filepath.Join(dir, "log", "workerlog.0")), "step: 3 ") {
		if time.Now().After(deadline) {
			t.Fatalf("training did not start; rank 0 output: %s", outs[0].String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	killed := time.Now()
	if err := cmds[victim].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-done[victim]
	for r := 0; r < world; r++ {
		if r == victim {
			continue
		}
		select {
		case err := <-done[r]:
			took := time.Since(killed)
			if err == nil {
				t.Errorf("rank %d exited 0 after its peer died", r)
			}
			msg := outs[r].String()
			if !strings.Contains(msg, fmt.Sprintf("rank %d", victim)) {
				t.Errorf("rank %d's error does not name rank %d: %q", r, victim, lastLine(msg))
			}
			t.Logf("rank %d exited after %.1f s: %s", r, took.Seconds(), lastLine(msg))
		case <-time.After(30*time.Second - time.Since(killed)):
			t.Fatalf("rank %d still running 30 s after rank %d was killed", r, victim)
		}
	}
}

func readLog(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
