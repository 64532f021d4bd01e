package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gptui/gptui/engine/checkpoint"
)

// restartSteps is the length of restartArgs' job. Its steps take tens of
// milliseconds, and the tests stop it after step 12 as the launcher's
// output shows it, which can be several steps late on a loaded machine:
// the job must still be running then.
const restartSteps = 40

// restartArgs is a job of small as dp4 (global batch 4 of 16 tokens) that
// saves a checkpoint every 5 steps into out and runs restartSteps steps.
func restartArgs(t *testing.T, out string) []string {
	return append(small(t), "-o", "Engine.max_steps="+strconv.Itoa(restartSteps), "-o", "Engine.eval_freq=0", "-o", "Engine.logging_freq=1",
		"-o", "Distributed.dp_degree=4", "-o", "Global.global_batch_size=4", "-o", "Global.local_batch_size=1", "-o", "Global.micro_batch_size=1",
		"-o", "Data.Train.dataset.max_seq_len=16", "-o", "Engine.save_load.save_steps=5", "-o", "Engine.save_load.output_dir="+out)
}

// uninterruptedRun is the losses of restartArgs' job run without a stop,
// shared by the tests.
var uninterruptedRun struct {
	once   sync.Once
	losses map[int]float64
	err    error
}

// rank0Losses returns the loss of each step that rank 0 logged in out (the
// last time it logged the step); a line prefix of "" takes gptui run's
// local lines.
func rank0Losses(t *testing.T, out string) map[int]float64 {
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

// uninterrupted trains restartArgs' job without a stop as one process in
// this test process (its global batch of 4 as one local batch, whose losses
// are dp4's within float32 reassociation, as engine's parity matrix shows),
// once, and returns its losses.
func uninterrupted(t *testing.T) map[int]float64 {
	t.Helper()
	u := &uninterruptedRun
	u.once.Do(func() {
		dir, err := os.MkdirTemp("", "gptui-uninterrupted-")
		if err != nil {
			u.err = err
			return
		}
		defer os.RemoveAll(dir)
		args := append(append([]string{"train"}, restartArgs(t, filepath.Join(dir, "out"))...),
			"-o", "Distributed.dp_degree=1", "-o", "Global.local_batch_size=4", "-o", "Engine.log_dir="+filepath.Join(dir, "log"))
		code, out, e := runCLI(t, args...)
		if code != 0 {
			u.err = fmt.Errorf("uninterrupted run: exit %d\n%s%s", code, out, e)
			return
		}
		u.losses = stepLosses(out)
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
	worst := 0.0
	for s := from; s < to; s++ {
		g, ok := got[s]
		w := want[s]
		d := math.Abs(g-w) / math.Abs(w)
		if !ok || !(d <= 1e-5) {
			t.Errorf("step %d: loss %v (logged %v) after the restart, %v uninterrupted", s, g, ok, w)
		}
		worst = max(worst, d)
	}
	t.Logf("steps %d to %d: losses within %.2g relative of the uninterrupted run", from, to-1, worst)
}

// TestRestartWorkerKilled: two sshd nodes, small as dp4 saving every 5
// steps; a worker of the second node is SIGKILLed after step 12 and, with
// --max-restarts 1, the job resumes on both nodes from the newest save
// (step 10, or a later one where the kill came steps late) and runs to the
// end with the losses of an uninterrupted run. The checkpoints go to a
// directory both nodes see (a shared filesystem).
func TestRestartWorkerKilled(t *testing.T) {
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	restartWorkerKilled(t, restartArgs(t, filepath.Join(t.TempDir(), "shared-out")))
}

// TestRestartWorkerKilledPerNodeCheckpoints is TestRestartWorkerKilled
// with each node's checkpoints in its own workdir (output_dir relative):
// the launcher copies rank 0's checkpoint to the other node before the
// resumed attempt starts.
func TestRestartWorkerKilledPerNodeCheckpoints(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	restartWorkerKilled(t, restartArgs(t, "output"))
}

func restartWorkerKilled(t *testing.T, args []string) {
	c := newSSHCluster(t, "cpu:2")
	want := uninterrupted(t)

	var stdout, stderr syncBuffer
	launched := time.Now()
	first := stdout.await("/3] [backend] ")
	job := c.start(t, &stdout, &stderr, append([]string{"--max-restarts", "1", "--show-ranks", "all"}, args...)...)
	// The first start, for comparison with the restart: from the launch to
	// rank 3 about to train.
	job.awaitLine(t, first, `"/3] [backend] "`, 120*time.Second)
	t.Logf("first start: rank 3 about to train %v after the launch", time.Since(launched))
	job.awaitLine(t, stdout.await("/0] [train] epoch: 0 step: 12 "), "step 12", 120*time.Second)
	pid := c.workerPID(t, 3)
	killed := time.Now()
	syscall.Kill(pid, syscall.SIGKILL)
	// The restart's stages, as the launcher prints them: the failure
	// noticed and the gang stopped, the new attempt's agents started, rank
	// 3 running from the checkpoint.
	var stages []time.Duration
	for _, s := range []string{"[restart] 1/1: ", "-r1: 4 ranks on 2 nodes", "/3] [checkpoint] resumed from "} {
		job.awaitLine(t, stdout.await(s), fmt.Sprintf("%q", s), 120*time.Second)
		stages = append(stages, time.Since(killed))
	}
	t.Logf("after the kill: restart line %v, agents started %v, rank 3 resumed %v", stages[0], stages[1], stages[2])
	resumed := stages[2]
	err := job.wait(t, 240*time.Second, "the kill")
	out := stdout.String()
	if err != nil {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", exitStatus(err), out, stderr.String())
	}
	t.Logf("rank 3 resumed %v after the kill; the job ended %v after it", resumed, time.Since(killed))
	// The restart took the workdirs' locks over from the first attempt,
	// which kept them for it.
	for _, node := range []string{"127.0.0.2", "127.0.0.3"} {
		if !regexp.MustCompile(`\[` + regexp.QuoteMeta(node) + `\] locked: workdir \S+: took over job \S+'s own lock`).MatchString(out) {
			t.Errorf("%s: the restart did not take the first attempt's lock over", node)
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "[restart] ") {
			t.Log(l)
		}
	}
	from := resumedStep(t, out)
	for r := range 4 {
		node := []string{"127.0.0.2", "127.0.0.3"}[r/2]
		if w := fmt.Sprintf("[%s/%d] [checkpoint] resumed from ", node, r); !strings.Contains(out, w) || !strings.Contains(out[strings.Index(out, w):], fmt.Sprintf(" at step %d\n", from)) {
			t.Errorf("rank %d on %s did not log that it resumed from step %d", r, node, from)
		}
	}
	if n := strings.Count(out, "[job] started"); n != 2 {
		t.Errorf("%d [job] started lines, want 2 (the start and the restart)", n)
	}
	compareLosses(t, rank0Losses(t, out), want, from, restartSteps)
}

// TestElasticNodeLost: as TestRestartWorkerKilled, but the second node's
// sshd, agent and workers are killed after step 12; with --min-nodes 1 the
// restart gives the node up after its tries and re-plans for the first
// node's two ranks (dp2, accumulating 2 micro-batches: the global batch
// kept), resumes from the newest save and ends with the losses of the
// uninterrupted dp4 run.
func TestElasticNodeLost(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	elasticNodeLost(t, restartArgs(t, filepath.Join(t.TempDir(), "shared-out")))
}

// TestElasticNodeLostPerNodeCheckpoints is TestElasticNodeLost with each
// node's checkpoints in its own workdir: each node keeps its ranks' part,
// and with replicas: 2 the other's too, so the node left holds the lost
// node's part and resumes from the whole checkpoint.
func TestElasticNodeLostPerNodeCheckpoints(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	elasticNodeLost(t, append(restartArgs(t, "output"), "-o", "Engine.save_load.replicas=2"))
}

// awaitReplica holds the job's four workers (SIGSTOP) until the first
// node's newest checkpoint loads whole — the second node's part of it
// replicated there (each node's ranks write their own files, and the
// launcher copies them as the job runs) — and lets the first node's go
// on: the second node's are for the test to lose with it.
func (c *sshCluster) awaitReplica(t *testing.T, timeout time.Duration, stdout *syncBuffer) {
	t.Helper()
	pids := make([]int, 4)
	for r := range pids {
		pids[r] = c.workerPID(t, r)
		syscall.Kill(pids[r], syscall.SIGSTOP)
	}
	defer func() {
		for _, pid := range pids[:2] {
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}()
	out := filepath.Join(c.workdirs[0], "output")
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		c, _, err := checkpoint.Latest(out)
		if err == nil && c.Manifest.Step >= 10 {
			return
		}
		if time.Now().After(deadline) {
			var lines []string
			for _, l := range strings.Split(stdout.String(), "\n") {
				if strings.Contains(l, "] replica: ") || strings.Contains(l, "[checkpoint] saved ") {
					lines = append(lines, l)
				}
			}
			t.Fatalf("%s holds no whole checkpoint from step 10 on after %v: %v\nthe job's saves and replicas:\n%s", out, timeout, err, strings.Join(lines, "\n"))
		}
	}
}

func elasticNodeLost(t *testing.T, args []string) {
	c := newSSHCluster(t, "cpu:2")
	want := uninterrupted(t)

	var stdout, stderr syncBuffer
	step12 := stdout.await("/0] [train] epoch: 0 step: 12 ")
	job := c.start(t, &stdout, &stderr, append([]string{"--max-restarts", "1", "--min-nodes", "1", "--show-ranks", "all"}, args...)...)
	job.awaitLine(t, step12, "step 12", 120*time.Second)
	if slices.Contains(args, "Engine.save_load.replicas=2") {
		c.awaitReplica(t, 60*time.Second, &stdout)
	}
	killed := time.Now()
	// The second node goes: its sshd first, so that the restart cannot
	// reach it, then its agent and workers.
	c.loseNode(t, 1)
	job.awaitLine(t, stdout.await("/1] [checkpoint] resumed from "), "resume of rank 1", 120*time.Second)
	resumed := time.Since(killed)
	err := job.wait(t, 240*time.Second, "the kill")
	out := stdout.String()
	if err != nil {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", exitStatus(err), out, stderr.String())
	}
	t.Logf("rank 1 resumed %v after the kill; the job ended %v after it", resumed, time.Since(killed))
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "[restart] ") || strings.HasPrefix(l, "[elastic] ") {
			t.Log(l)
		}
	}
	// The restart resumes from the last save before the kill, or from the
	// step the first node's ranks saved as they were stopped: the sshd's
	// end can reach the second node's agent before its workers are killed,
	// and a stop agreed by all four ranks saves the finished steps.
	from := resumedStep(t, out)
	for _, w := range []string{"[restart] 1/1: ",
		"[elastic] 127.0.0.3 unreachable (", "): 1 node left, re-planned dp4 mb1 → dp2 mb1, accumulate 2 (global batch 4 kept)\n",
		"[127.0.0.2/0] [batch] global: 4 local: 2 micro: 1 accumulate: 2 "} {
		if !strings.Contains(out, w) {
			t.Errorf("stdout lacks %q", w)
		}
	}
	after := out[strings.Index(out, "[elastic] "):]
	for r := range 2 {
		if w := fmt.Sprintf("[127.0.0.2/%d] [checkpoint] resumed from ", r); !strings.Contains(after, w) || !strings.Contains(after[strings.Index(after, w):], fmt.Sprintf(" at step %d\n", from)) {
			t.Errorf("rank %d did not log that it resumed from step %d", r, from)
		}
	}
	if strings.Contains(after, "[127.0.0.3/") {
		t.Errorf("the second node still has ranks after the re-plan:\n%s", after)
	}
	compareLosses(t, rank0Losses(t, out), want, from, restartSteps)
}

// resumedStep returns the step the restart line of out resumes from, which
// must be the newest step rank 0 logged saving before that line, and at
// least step 10 (the tests stop their jobs after step 12) — or the step
// of the launcher's correction that follows it, when the nodes left could
// not all hold that newest one ("[restart] resuming from step N, not M:
// no newer checkpoint can be held by every node": a save rank 0 made
// as the node went, before its part could reach the other node).
func resumedStep(t *testing.T, out string) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\[restart\] 1/1: .*; resuming from step (\d+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no [restart] line resuming from a step:\n%s", out)
	}
	step, _ := strconv.Atoi(m[1])
	if !strings.Contains(out, fmt.Sprintf("/0] [checkpoint] saved step %d to ", step)) {
		t.Errorf("the restart resumes from step %d, which rank 0 did not log saving", step)
	}
	if c := regexp.MustCompile(`(?m)^\[restart\] resuming from step (\d+), not (\d+): no newer checkpoint can be held by every node$`).FindStringSubmatch(out); c != nil {
		older, _ := strconv.Atoi(c[1])
		if c[2] != m[1] || older >= step || older < 10 {
			t.Errorf("the restart resumes from step %d, then %q", step, c[0])
		}
		return older
	}
	newest := 0
	for _, s := range regexp.MustCompile(`/0\] \[checkpoint\] saved step (\d+) to `).FindAllStringSubmatch(out[:strings.Index(out, m[0])], -1) {
		n, _ := strconv.Atoi(s[1])
		newest = max(newest, n)
	}
	if step < max(newest, 10) {
		t.Errorf("the restart resumes from step %d; rank 0 had logged saving step %d before it (and the stop came after step 12)", step, newest)
	}
	return step
}

// TestBadInputRestarts: --max-restarts, --min-nodes and --max-nodes out of
// range exit 2 with one line naming the flag, before any node is reached.
func TestBadInputRestarts(t *testing.T) {
	hosts := filepath.Join(t.TempDir(), "hosts.txt")
	if err := os.WriteFile(hosts, []byte("node1 devices=cpu:1\nnode2 devices=cpu:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		args []string
		want []string
	}{
		{"negative restarts", []string{"--hosts", hosts, "--max-restarts", "-1"}, []string{"--max-restarts -1", "0 (never restart) or more"}},
		{"min nodes above inventory", []string{"--hosts", hosts, "--min-nodes", "3"}, []string{"--min-nodes 3", "want 1 to 2", hosts}},
		{"min nodes zero", []string{"--hosts", hosts, "--min-nodes", "0"}, []string{"--min-nodes 0", "want 1 to 2"}},
		{"max nodes above inventory", []string{"--hosts", hosts, "--max-nodes", "5"}, []string{"--max-nodes 5", "want 1 to 2"}},
		{"max below min", []string{"--hosts", hosts, "--min-nodes", "2", "--max-nodes", "1"}, []string{"--max-nodes 1 is below --min-nodes 2"}},
		{"min nodes without hosts", []string{"--min-nodes", "1"}, []string{"--min-nodes", "need --hosts FILE"}},
		{"negative restarts without hosts", []string{"--max-restarts", "-2"}, []string{"--max-restarts -2", "0 (never restart) or more"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, append(append([]string{"run", "--no-tui"}, tt.args...), "-c", "tiny")...)
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			if code != 2 || len(lines) != 1 {
				t.Errorf("exit %d, stderr %q; want exit 2 and one line", code, stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(lines[0], w) {
					t.Errorf("error line %q lacks %q", lines[0], w)
				}
			}
		})
	}
}
