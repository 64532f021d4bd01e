package main

import (
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gptui/gptui/engine/checkpoint"
)

// TestResumeHostsSync: two sshd nodes with separate workdirs, small as dp4
// (two ranks per node) saving every 5 steps into the relative output dir:
// each node keeps its own ranks' files of each checkpoint, a part that
// does not load alone, and the finished job gathers the newest whole on
// rank 0's node. With the second node's step 10 gone and a checkpoint of
// another run planted there, `run --resume` is refused before anything
// starts, naming the nodes and steps (exit 2); as the job left them, it
// gives the second node the first's files, every rank resumes from step
// 10 and steps 10–19 have the losses of an uninterrupted run. (decay_steps stays the uninterrupted run's
// restartSteps, whose default follows max_steps.)
func TestResumeHostsSync(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	c := newSSHCluster(t, "cpu:2")
	want := uninterrupted(t)
	run := c.resumeJob(t)
	if out, err := run("-o", "Engine.max_steps=10"); err != nil {
		t.Fatalf("first run: exit %d\n%s", exitStatus(err), out)
	}
	out1 := filepath.Join(c.workdirs[1], "output")
	_, missing, err := checkpoint.Open(filepath.Join(out1, "step_00000010"))
	if err != nil || len(missing) != 2 || missing[0].Name != "rank_00000.safetensors" || missing[1].Name != "rank_00001.safetensors" {
		t.Fatalf("the second node's step 10: %v, missing %v; want its part, without the first node's two files", err, missing)
	}
	// The finished job gathered its newest checkpoint whole on rank 0's
	// node.
	if _, err := checkpoint.Load(filepath.Join(c.workdirs[0], "output", "step_00000010")); err != nil {
		t.Fatalf("the first node's step 10 is not whole after the job: %v", err)
	}
	restore := c.keepOutputs(t)

	// A checkpoint of another run (another seed) on the second node, which
	// lost its step 10: refused before any worker.
	foreign := t.TempDir()
	if code, _, e := runCLI(t, append(append([]string{"train"}, small(t)...), "-o", "Global.seed=7", "-o", "Engine.max_steps=5", "-o", "Engine.eval_freq=0",
		"-o", "Data.Train.dataset.max_seq_len=16", "-o", "Engine.save_load.save_steps=5",
		"-o", "Engine.save_load.output_dir="+filepath.Join(foreign, "out"), "-o", "Engine.log_dir="+filepath.Join(foreign, "log"))...); code != 0 {
		t.Fatalf("foreign run: %s", e)
	}
	for _, s := range []string{"step_00000005", "step_00000010"} {
		os.RemoveAll(filepath.Join(out1, s))
	}
	if b, err := exec.Command("cp", "-r", filepath.Join(foreign, "out", "step_00000005"), out1).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, b)
	}
	out, err := run("--resume", "-o", "Engine.max_steps=20")
	if exitStatus(err) != 2 {
		t.Fatalf("planted mismatch: exit %d, want 2\n%s", exitStatus(err), out)
	}
	msg := "resume: 127.0.0.2 would start from step 10, 127.0.0.3 would start from step 5 (another checkpoint: manifest "
	if !strings.Contains(out, msg) || !strings.Contains(out, ") in output: remove the stale checkpoint or pass -o Engine.save_load.ckpt_dir=DIR") {
		t.Errorf("planted mismatch: no %q in\n%s", msg, out)
	}
	if strings.Contains(out, "[job] started") || strings.Contains(out, "[train]") {
		t.Errorf("planted mismatch: the job started:\n%s", out)
	}

	// As the job left them: the second node gets the first's files.
	restore()
	out, err = run("--resume", "-o", "Engine.max_steps=20")
	if err != nil {
		t.Fatalf("resume: exit %d\n%s", exitStatus(err), out)
	}
	if w := "[127.0.0.3] pushing: copying rank_00000.safetensors, rank_00001.safetensors of checkpoint output/step_00000010 from 127.0.0.2"; !strings.Contains(out, w) {
		t.Errorf("no %q:\n%s", w, out)
	}
	c.sameCheckpoint(t, "step_00000010", 1, 0)
	checkResumedEverywhere(t, out, want, 10, 20)
}

// TestReplicasSurviveNodeLoss: with Engine.save_load.replicas: 2 on two
// sshd nodes, each node's part of every checkpoint (its ranks' files) is
// copied to the other during the run, so each holds the whole; with rank 0's node's output directory then deleted,
// `run --resume` takes step 10 from the replica and every rank resumes
// from it with the uninterrupted losses. Replicas above the node count are
// refused (exit 2).
func TestReplicasSurviveNodeLoss(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	c := newSSHCluster(t, "cpu:2")
	want := uninterrupted(t)
	run := c.replicaJob(t)
	out, err := run("-o", "Engine.save_load.replicas=3")
	if msg := "Engine.save_load.replicas: 3, but the job has 2 nodes: want 1 to 2"; exitStatus(err) != 2 || !strings.Contains(out, msg) {
		t.Errorf("replicas 3 on 2 nodes: exit %d, want 2 and %q\n%s", exitStatus(err), msg, out)
	}
	if out, err = run("-o", "Engine.max_steps=10"); err != nil {
		t.Fatalf("first run: exit %d\n%s", exitStatus(err), out)
	}
	// Each node saves its own ranks' files of step 10, and copies them to
	// the other.
	for _, w := range []string{
		"[127.0.0.3] replica: replica of 127.0.0.2's part of checkpoint output/step_00000010 (2 files) in ",
		"[127.0.0.2] replica: replica of 127.0.0.3's part of checkpoint output/step_00000010 (2 files) in ",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("no %q:\n%s", w, out)
		}
	}
	out0 := filepath.Join(c.workdirs[0], "output")
	out1 := filepath.Join(c.workdirs[1], "output")
	if _, err := checkpoint.Load(filepath.Join(out1, "step_00000010")); err != nil {
		t.Fatalf("the second node does not hold the whole of step 10: %v", err)
	}
	if err := os.RemoveAll(out0); err != nil {
		t.Fatal(err)
	}
	out, err = run("--resume", "-o", "Engine.max_steps=20")
	if err != nil {
		t.Fatalf("resume: exit %d\n%s", exitStatus(err), out)
	}
	if !strings.Contains(out, "[127.0.0.2] pushing: copying checkpoint output/step_00000010 from 127.0.0.3") {
		t.Errorf("step 10 not copied back from the replica:\n%s", out)
	}
	checkResumedEverywhere(t, out, want, 10, 20)
}

// TestReportTwoNodeRun: `gptui report` over the log directories of a
// finished two-node run (small dp4 with evals) writes a PNG of the asked
// size, with the four panels; a missing log directory is exit 2.
func TestReportTwoNodeRun(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	c := newSSHCluster(t, "cpu:2")
	var stdout, stderr syncBuffer
	cmd := c.command(t, &stdout, &stderr, append(small(t), "-o", "Engine.max_steps=12", "-o", "Engine.eval_freq=4", "-o", "Engine.eval_iters=1", "-o", "Engine.logging_freq=1",
		"-o", "Distributed.dp_degree=4", "-o", "Global.local_batch_size=2", "-o", "Global.micro_batch_size=2")...)
	if err := cmd.Run(); err != nil {
		t.Fatalf("run: exit %d\n%s", exitStatus(err), stderr.String())
	}
	out := filepath.Join(t.TempDir(), "report.png")
	logs := []string{"--log-dir", filepath.Join(c.workdirs[0], "log"), "--log-dir", filepath.Join(c.workdirs[1], "log")}
	code, so, se := runCLI(t, append([]string{"report", "-o", out, "--width", "1000", "--height", "700"}, logs...)...)
	if code != 0 || !strings.Contains(so, "1000×700 pixels, 4 ranks") {
		t.Fatalf("report: exit %d, %q %q", code, so, se)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("the report does not decode as PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1000 || b.Dy() != 700 {
		t.Errorf("the report is %d×%d, want 1000×700", b.Dx(), b.Dy())
	}
	// Four panels: each quadrant has drawn pixels (axes, lines, text).
	b := img.Bounds()
	for q := range 4 {
		x0, y0 := b.Min.X+(q%2)*b.Dx()/2, b.Min.Y+(q/2)*b.Dy()/2
		dark := 0
		for y := y0; y < y0+b.Dy()/2; y += 2 {
			for x := x0; x < x0+b.Dx()/2; x += 2 {
				if r, g, bl, _ := img.At(x, y).RGBA(); r+g+bl < 3*0xe000 {
					dark++
				}
			}
		}
		if dark < 1000 {
			t.Errorf("quadrant %d has %d drawn pixels: no panel there?", q, dark)
		}
	}
	if os.Getenv("GPTUI_KEEP_REPORT") != "" {
		b, _ := os.ReadFile(out)
		os.WriteFile(os.Getenv("GPTUI_KEEP_REPORT"), b, 0o644)
	}
	code, _, se = runCLI(t, "report", "--log-dir", filepath.Join(t.TempDir(), "none"))
	if code != 2 || !strings.Contains(se, "none") {
		t.Errorf("a missing log directory: exit %d, %q", code, se)
	}
}

// checkResumedEverywhere checks the output of a 2×2 job on the two sshd
// nodes: every rank logged that it resumed from step from, and rank 0's
// losses of steps from to to-1 are want's.
func checkResumedEverywhere(t *testing.T, out string, want map[int]float64, from, to int) {
	t.Helper()
	for r := range 4 {
		node := []string{"127.0.0.2", "127.0.0.3"}[r/2]
		w := fmt.Sprintf("[%s/%d] [checkpoint] resumed from ", node, r)
		if i := strings.Index(out, w); i < 0 || !strings.Contains(out[i:], fmt.Sprintf(" at step %d\n", from)) {
			t.Errorf("rank %d on %s did not log that it resumed from step %d", r, node, from)
		}
	}
	compareLosses(t, rank0Losses(t, out), want, from, to)
}

// TestReplicaResumeOnRemainingNode: with replicas: 2 on two sshd nodes,
// the first node is then lost whole (its sshd stopped, its workdir
// deleted); `run --resume --min-nodes 1` plans the job for the remaining
// node alone, re-planned for its two ranks (the global batch kept by
// accumulation), which resume from that node's copy of step 10 with the
// uninterrupted run's losses.
func TestReplicaResumeOnRemainingNode(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	c := newSSHCluster(t, "cpu:2")
	want := uninterrupted(t)
	run := c.replicaJob(t)
	out, err := run("-o", "Engine.max_steps=10")
	if err != nil {
		t.Fatalf("first run: exit %d\n%s", exitStatus(err), out)
	}
	c.loseNode(t, 0)
	if err := os.RemoveAll(c.workdirs[0]); err != nil {
		t.Fatal(err)
	}
	out, err = run("--resume", "--min-nodes", "1", "-o", "Engine.max_steps=20")
	if err != nil {
		t.Fatalf("resume on the remaining node: exit %d\n%s", exitStatus(err), out)
	}
	if w := "[elastic] 127.0.0.2 unreachable ("; !strings.Contains(out, w) || !strings.Contains(out, "1 node left, re-planned dp4 mb1 → dp2 mb1, accumulate 2 (global batch 4 kept)") {
		t.Errorf("no re-plan for the node left:\n%s", out)
	}
	for r := range 2 {
		w := fmt.Sprintf("[127.0.0.3/%d] [checkpoint] resumed from ", r)
		if i := strings.Index(out, w); i < 0 || !strings.Contains(out[i:], " at step 10\n") {
			t.Errorf("rank %d on 127.0.0.3 did not log that it resumed from step 10:\n%s", r, out)
		}
	}
	compareLosses(t, rank0Losses(t, out), want, 10, 20)
}
