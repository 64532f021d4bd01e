package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gptui/gptui/engine/checkpoint"
)

// nodeNames are the names of newSSHCluster's nodes in the launcher's
// output.
var nodeNames = [2]string{"127.0.0.2", "127.0.0.3"}

// resumeJob returns a function that runs restartArgs' job on c's two
// nodes with the uninterrupted run's schedule (decay_steps fixed, so a
// resume with another max_steps keeps it), extra and then args, every
// rank's lines shown, and returns its output and error.
func (c *sshCluster) resumeJob(t *testing.T, extra ...string) func(args ...string) (string, error) {
	return func(args ...string) (string, error) {
		var stdout, stderr syncBuffer
		err := c.command(t, &stdout, &stderr, c.resumeArgs(t, slices.Concat(extra, args)...)...).Run()
		return stdout.String() + stderr.String(), err
	}
}

// resumeArgs are resumeJob's arguments.
func (c *sshCluster) resumeArgs(t *testing.T, args ...string) []string {
	return append(append([]string{"--show-ranks", "all"}, restartArgs(t, "output")...),
		append([]string{"-o", "Optimizer.lr.decay_steps=" + strconv.Itoa(restartSteps)}, args...)...)
}

// replicaJob is resumeJob with replicas 2.
func (c *sshCluster) replicaJob(t *testing.T, extra ...string) func(args ...string) (string, error) {
	return c.resumeJob(t, append([]string{"-o", "Engine.save_load.replicas=2"}, extra...)...)
}

// replicaArgs are replicaJob's arguments.
func (c *sshCluster) replicaArgs(t *testing.T, args ...string) []string {
	return c.resumeArgs(t, append([]string{"-o", "Engine.save_load.replicas=2"}, args...)...)
}

// keepOutputs copies each node's output directory aside and returns a
// function that puts the copies back in place of what is there then, and
// empties the log directories.
func (c *sshCluster) keepOutputs(t *testing.T) (restore func()) {
	t.Helper()
	kept := t.TempDir()
	for i, wd := range c.workdirs {
		if err := os.CopyFS(filepath.Join(kept, strconv.Itoa(i)), os.DirFS(filepath.Join(wd, "output"))); err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		t.Helper()
		for i, wd := range c.workdirs {
			out := filepath.Join(wd, "output")
			if err := os.RemoveAll(out); err != nil {
				t.Fatal(err)
			}
			if err := os.CopyFS(out, os.DirFS(filepath.Join(kept, strconv.Itoa(i)))); err != nil {
				t.Fatal(err)
			}
			os.RemoveAll(filepath.Join(wd, "log"))
		}
	}
}

// sameCheckpoint checks that step of the output directory of node a loads
// and has the manifest of node b's.
func (c *sshCluster) sameCheckpoint(t *testing.T, step string, a, b int) {
	t.Helper()
	dirA := filepath.Join(c.workdirs[a], "output", step)
	if _, err := checkpoint.Load(dirA); err != nil {
		t.Errorf("%s on %s does not load: %v", step, nodeNames[a], err)
	}
	ma, _ := os.ReadFile(filepath.Join(dirA, checkpoint.ManifestFile))
	mb, err := os.ReadFile(filepath.Join(c.workdirs[b], "output", step, checkpoint.ManifestFile))
	if err != nil || !bytes.Equal(ma, mb) {
		t.Errorf("%s on %s is not %s's (%v)", step, nodeNames[a], nodeNames[b], err)
	}
}

// TestResumeHealsDamagedCheckpoint: small dp4 on two sshd nodes with
// Engine.save_load.replicas: 2, so that both hold steps 5 and 10 whole
// after 10 steps (each node saves its ranks' files, and the other's are
// copied to it). With one node's step 10 damaged — 16 bytes flipped in the
// middle of rank 0's file (the size kept), that file deleted, or its
// manifest deleted — `run --resume` copies the other node's file (or, for
// the manifest, its step 10) over it, every rank resumes from step 10, and
// steps 10–19 have the losses of an uninterrupted run. (Before, the install kept the damaged directory
// and discarded the verified copy; that node's ranks fell back to step 5,
// and the ranks' agreement ended the job with exit 2.)
func TestResumeHealsDamagedCheckpoint(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	c := newSSHCluster(t, "cpu:2")
	want := uninterrupted(t)
	run := c.replicaJob(t)
	if out, err := run("-o", "Engine.max_steps=10"); err != nil {
		t.Fatalf("first run: exit %d\n%s", exitStatus(err), out)
	}
	restore := c.keepOutputs(t)
	const data = "rank_00000.safetensors"
	for _, tt := range []struct {
		name   string
		node   int // the node whose step 10 is damaged
		damage func(t *testing.T, dir string)
	}{
		{"16 bytes flipped", 0, func(t *testing.T, dir string) {
			f := filepath.Join(dir, data)
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 16 {
				b[len(b)/2+i] ^= 0xff
			}
			if err := os.WriteFile(f, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"tensor file deleted", 1, func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, data)); err != nil {
				t.Fatal(err)
			}
		}},
		{"manifest deleted", 0, func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, checkpoint.ManifestFile)); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			restore()
			tt.damage(t, filepath.Join(c.workdirs[tt.node], "output", "step_00000010"))
			out, err := run("--resume", "-o", "Engine.max_steps=20")
			if err != nil {
				t.Fatalf("resume: exit %d\n%s", exitStatus(err), out)
			}
			other := 1 - tt.node
			// A damaged or missing file is copied alone; a node without the
			// manifest gets the whole checkpoint.
			w := fmt.Sprintf("[%s] pushing: copying %s of checkpoint output/step_00000010 from %s\n", nodeNames[tt.node], data, nodeNames[other])
			if tt.name == "manifest deleted" {
				w = fmt.Sprintf("[%s] pushing: copying checkpoint output/step_00000010 from %s\n", nodeNames[tt.node], nodeNames[other])
			}
			if !strings.Contains(out, w) {
				t.Errorf("no %q in\n%s", w, out)
			}
			checkResumedEverywhere(t, out, want, 10, 20)
			c.sameCheckpoint(t, "step_00000010", tt.node, other)
			if left, _ := filepath.Glob(filepath.Join(c.workdirs[tt.node], "output", ".tmp-*")); len(left) > 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

// TestResumeAfterFailedSave: small dp4 on two sshd nodes with replicas: 2
// and keep_last: 1, both holding the whole of step 10. Every node saves
// its own ranks' files, so a full disk on one node (a file size limit on
// its sshd, which its workers inherit: a write past 64 KiB fails, as on a
// full disk; the logs stay below it) fails the save of step 15 itself:
// the job ends naming the step, and neither node publishes a step 15 or
// keeps its save's temporary files. Then:
//   - with the disk freed, `run --resume` resumes every rank from step 10
//     with the losses of an uninterrupted run;
//   - a rank killed once step 15 is saved, under --max-restarts 1, while
//     the parts are being copied to the other node: the restart resumes
//     from the step its line names (15 or later), completed on every node
//     from the parts, with the losses of an uninterrupted run.
func TestResumeAfterFailedSave(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	c := newSSHCluster(t, "cpu:2")
	want := uninterrupted(t)
	run := c.replicaJob(t, "-o", "Engine.save_load.keep_last=1")
	if out, err := run("-o", "Engine.max_steps=10"); err != nil {
		t.Fatalf("first run: exit %d\n%s", exitStatus(err), out)
	}
	at10 := c.keepOutputs(t)
	const limit = 64 << 10
	full := func(on bool) {
		c.servers[1].LimitFileSize(t, map[bool]int64{true: limit, false: -1}[on])
	}
	t.Cleanup(func() { full(false) })
	full(true)
	out, err := run("--resume", "-o", "Engine.max_steps=15")
	if err == nil || !strings.Contains(out, "step 15 not saved") {
		t.Fatalf("resume to step 15 with a full disk on the second node: exit %d, want a failed save of step 15\n%s", exitStatus(err), out)
	}
	for i, wd := range c.workdirs {
		if _, err := os.Stat(filepath.Join(wd, "output", "step_00000015")); err == nil {
			t.Errorf("%s published a step 15", nodeNames[i])
		}
		if left, _ := filepath.Glob(filepath.Join(wd, "output", ".tmp-step_*")); len(left) > 0 {
			t.Errorf("%s keeps the failed save's files: %v", nodeNames[i], left)
		}
	}
	full(false)
	out, err = run("--resume", "-o", "Engine.max_steps=20")
	if err != nil {
		t.Fatalf("resume with the disk freed: exit %d\n%s", exitStatus(err), out)
	}
	checkResumedEverywhere(t, out, want, 10, 20)

	t.Run("rank killed as the parts are copied, --max-restarts", func(t *testing.T) {
		// The kill must land before the job's last save: rank 3's pid is
		// taken early, so that only the test's own wake-up lies between
		// the saved line and the kill; on a machine loaded enough to let
		// the job finish even so, the test tries again.
		for attempt := 1; ; attempt++ {
			at10()
			var stdout, stderr syncBuffer
			running := stdout.await("/0] [train] epoch: 0 step: 13 ")
			job := c.start(t, &stdout, &stderr, c.replicaArgs(t, "-o", "Engine.save_load.keep_last=1", "--resume", "--max-restarts", "1")...)
			job.awaitLine(t, running, "step 13", 120*time.Second)
			pid := c.workerPID(t, 3)
			saved := stdout.await("/0] [checkpoint] saved step 15 to ")
			job.awaitLine(t, saved, "step 15 saved", 120*time.Second)
			syscall.Kill(pid, syscall.SIGKILL)
			err := job.wait(t, 240*time.Second, "the kill")
			out := stdout.String()
			if err != nil {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", exitStatus(err), out, stderr.String())
			}
			i := strings.Index(out, "[restart] 1/1: ")
			if i < 0 {
				t.Fatalf("no restart:\n%s", out)
			}
			var named int
			if _, err := fmt.Sscanf(out[i+len("[restart] 1/1: "):], "rank 3 on 127.0.0.3 was killed by SIGKILL; resuming from step %d\n", &named); err != nil || named < 15 {
				t.Fatalf("the restart line names no step from 15 on (%v):\n%s", err, out[i:])
			}
			if named >= restartSteps && attempt < 3 {
				t.Logf("attempt %d: the job had saved its last step when the kill landed; again", attempt)
				continue
			}
			checkResumedEverywhere(t, out[i:], want, named, restartSteps)
			return
		}
	})
}
