package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gptui/gptui/agent"
	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/fence"
)

// refusedLine matches the one-line refusal of a workdir another job holds,
// naming that job's id, start time, pid and command.
func refusedLine(dir, job string) *regexp.Regexp {
	return regexp.MustCompile(`^gptui: run: (node [0-9.]+: )?workdir ` + regexp.QuoteMeta(dir) + ` is in use by job ` + regexp.QuoteMeta(job) +
		`, started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+, pid \d+ on \S+: gptui run --no-tui .+; wait for that job to end or stop it, or give this job a workdir of its own \(workdir= in the inventory; for --nproc, another directory\)$`)
}

// readLockFile returns the holder in dir's lock file, or nil.
func readLockFile(t *testing.T, dir string) *agent.Holder {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, agent.LockFile))
	if os.IsNotExist(err) {
		return nil
	}
	h, err := agent.ParseHolder(agent.LockFile, b)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// checkMetricsFiles checks that every metrics file of logDir is JSON
// lines only, its steps rising, and returns the records of rank 0's.
func checkMetricsFiles(t *testing.T, logDir string) int {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(logDir, "metrics.*.jsonl"))
	if len(files) == 0 {
		t.Fatalf("no metrics files in %s", logDir)
	}
	records := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		last := -1
		for i, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
			var m struct{ Step *int }
			if err := json.Unmarshal([]byte(line), &m); err != nil || m.Step == nil || *m.Step <= last {
				t.Errorf("%s line %d is not a record of a later step: %q (%v)", f, i+1, line, err)
				break
			}
			last = *m.Step
			if strings.HasSuffix(f, "metrics.0.jsonl") {
				records++
			}
		}
	}
	return records
}

// TestRunLocalOneJobPerWorkdir: a second 'gptui run --nproc' in the
// directory of a running one is refused at once (exit 2, one line naming
// the first job) and writes nothing there; the first goes on, and its lock
// is gone when it ends.
func TestRunLocalOneJobPerWorkdir(t *testing.T) {
	dir := t.TempDir()
	args := append(append([]string{"run", "--no-tui", "--nproc", "1"}, small(t)...), "-o", "Engine.max_steps=1000000", "-o", "Engine.eval_freq=0", "-o", "Engine.logging_freq=1")
	var aOut, aErr syncBuffer
	training := aOut.await("[0] [train] epoch")
	cmd := exec.Command(builtGPTUI(t), args...)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, append(os.Environ(), "GPTUI_THREADS=1"), &aOut, &aErr
	a := startJob(t, cmd, &aOut, &aErr, nil)
	a.awaitLine(t, training, "training of job A", 60*time.Second)
	holder := readLockFile(t, dir)
	if holder == nil {
		t.Fatal("job A holds no lock")
	}
	jobs, _ := os.ReadDir(filepath.Join(dir, "jobs"))

	b := exec.Command(builtGPTUI(t), args...)
	b.Dir, b.Env = dir, append(os.Environ(), "GPTUI_THREADS=1")
	var bOut, bErr strings.Builder
	b.Stdout, b.Stderr = &bOut, &bErr
	start := time.Now()
	err := b.Run()
	took := time.Since(start)
	if exitStatus(err) != 2 || !refusedLine(dir, holder.Job).MatchString(strings.TrimSuffix(bErr.String(), "\n")) || strings.Count(bErr.String(), "\n") != 1 {
		t.Fatalf("job B: exit %d after %v, stderr %q, want 2 and one line naming job A (%s)\nstdout %q", exitStatus(err), took, bErr.String(), holder.Job, bOut.String())
	}
	t.Logf("job B refused in %v: %s", took.Round(time.Millisecond), strings.TrimSpace(bErr.String()))
	if took > 2*time.Second {
		t.Errorf("job B took %v to be refused, want under 2 s", took)
	}
	if after, _ := os.ReadDir(filepath.Join(dir, "jobs")); len(after) != len(jobs) {
		t.Errorf("job B wrote a job directory: jobs/ holds %d entries, %d before", len(after), len(jobs))
	}

	cmd.Process.Signal(syscall.SIGINT)
	if err := <-a.done; exitStatus(err) != 130 {
		t.Fatalf("job A after SIGINT: exit %d\n%s", exitStatus(err), aErr.String())
	}
	if h := readLockFile(t, dir); h != nil {
		t.Errorf("job A's lock is left after its end: %+v", h)
	}
	checkMetricsFiles(t, filepath.Join(dir, "log"))
}

// TestRunDryRunWritesNothing: a dry run with a localhost line creates no
// workdir (the default ~/.gptui), writes no config and takes no lock; two
// lines for this machine in one workdir are refused, naming the keys.
func TestRunDryRunWritesNothing(t *testing.T) {
	home := t.TempDir()
	hosts := filepath.Join(home, "hosts.txt")
	writeTestFile(t, hosts, "localhost devices=cpu:1\n")
	cmd := exec.Command(builtGPTUI(t), append([]string{"run", "--no-tui", "--hosts", hosts, "--dry-run"}, small(t)...)...)
	cmd.Env = append(os.Environ(), "HOME="+home)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"server_id": "127.0.0.1"`) {
		t.Fatalf("dry run: exit %d\n%s", exitStatus(err), out)
	}
	if _, err := os.Stat(filepath.Join(home, ".gptui")); !os.IsNotExist(err) {
		entries, _ := filepath.Glob(filepath.Join(home, ".gptui", "*", "*"))
		t.Errorf("the dry run wrote ~/.gptui: %v", entries)
	}

	writeTestFile(t, hosts, "127.0.0.2 devices=cpu:1\n127.0.0.3 devices=cpu:1\n")
	code, _, stderr := runCLI(t, append(append([]string{"run", "--no-tui", "--hosts", hosts, "--dry-run"}, small(t)...), "-o", "Distributed.dp_degree=2", "-o", "Global.local_batch_size=4", "-o", "Global.micro_batch_size=4")...)
	checkUserError(t, code, stderr, []string{hosts + ":2: 127.0.0.3 runs on this machine without SSH in the workdir ~/.gptui, as 127.0.0.2 on line 1 does: give each node its own workdir=, or ssh=true to reach it over SSH"})
}

// TestRunHostsOneJobPerWorkdir: job A trains on two sshd nodes with
// workdirs of their own, taking over the stale locks found there (of a
// process gone, of another boot); job B on the same inventory is refused in
// under 2 s with one line naming A (id, start time, command), exit 2,
// before it writes anything; A finishes unharmed: its checkpoints hold its
// seed, its metrics files are whole JSON lines, and its locks are gone.
func TestRunHostsOneJobPerWorkdir(t *testing.T) {
	c := newSSHCluster(t, "cpu:1")
	// Stale locks: a process that is gone, and another boot.
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	for i, h := range []agent.Holder{
		{Job: "20200101-000000-0000aa", Owner: "20200101-000000-0000aa", Command: "gptui run old", Host: host, PID: gone.Process.Pid},
		{Job: "20200101-000000-0000bb", Owner: "20200101-000000-0000bb", Command: "gptui run old", Host: host, PID: os.Getpid(), BootID: "0b5e1e7e-0000-4000-8000-000000000000"},
	} {
		if err := os.MkdirAll(c.workdirs[i], 0o755); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(h)
		writeTestFile(t, filepath.Join(c.workdirs[i], agent.LockFile), string(b)+"\n")
	}

	job := func(seed string, steps string) []string {
		return append(small(t), "-o", "Global.seed="+seed, "-o", "Engine.max_steps="+steps, "-o", "Engine.eval_freq=0", "-o", "Engine.logging_freq=1",
			"-o", "Engine.save_load.save_steps=5", "-o", "Distributed.dp_degree=2", "-o", "Global.local_batch_size=4", "-o", "Global.micro_batch_size=4")
	}
	var aOut, aErr syncBuffer
	training := aOut.await("] [train] epoch")
	a := startJob(t, c.command(t, &aOut, &aErr, job("1234", "40")...), &aOut, &aErr, nil)
	a.awaitLine(t, training, "training of job A", 60*time.Second)
	for node, why := range map[string]string{"127.0.0.2": "(its process ", "127.0.0.3": "(its machine has restarted since)"} {
		if !regexp.MustCompile(`\[` + regexp.QuoteMeta(node) + `\] locked: workdir \S+: took over the stale lock of job 20200101-000000-0000.., started .*` + regexp.QuoteMeta(why)).MatchString(aOut.String()) {
			t.Errorf("job A's output does not say it took over %s's stale lock %s:\n%s", node, why, aOut.String())
		}
	}
	holder := readLockFile(t, c.workdirs[0])
	if holder == nil || !strings.Contains(aOut.String(), "[job] started: job "+holder.Job+":") {
		t.Fatalf("job A's lock %+v does not name its job:\n%s", holder, aOut.String())
	}
	jobsBefore := make([]int, 2)
	for i, wd := range c.workdirs {
		entries, _ := os.ReadDir(filepath.Join(wd, "jobs"))
		jobsBefore[i] = len(entries)
	}

	var bOut, bErr syncBuffer
	b := c.command(t, &bOut, &bErr, job("99", "40")...)
	start := time.Now()
	err := b.Run()
	took := time.Since(start)
	errLine := strings.TrimSuffix(bErr.String(), "\n")
	if exitStatus(err) != 2 || strings.Contains(errLine, "\n") || !refusedLine(c.workdirs[0], holder.Job).MatchString(errLine) && !refusedLine(c.workdirs[1], holder.Job).MatchString(errLine) {
		t.Fatalf("job B: exit %d after %v, stderr %q; want 2 and one line naming job A (%s)\nstdout:\n%s", exitStatus(err), took, bErr.String(), holder.Job, bOut.String())
	}
	if !strings.Contains(errLine, ": gptui run --no-tui --hosts "+c.hosts+" ") || !strings.Contains(errLine, "Global.seed=1234") {
		t.Errorf("the refusal does not give job A's command: %s", errLine)
	}
	t.Logf("job B refused in %v: %s", took.Round(time.Millisecond), errLine)
	if took > 2*time.Second {
		t.Errorf("job B took %v to be refused, want under 2 s", took)
	}
	if strings.Contains(bOut.String(), "pushing:") {
		t.Errorf("job B pushed:\n%s", bOut.String())
	}
	for i, wd := range c.workdirs {
		if entries, _ := os.ReadDir(filepath.Join(wd, "jobs")); len(entries) != jobsBefore[i] {
			t.Errorf("job B wrote a job directory in %s", wd)
		}
	}

	if err := a.wait(t, 3*time.Minute, "job B's refusal"); err != nil {
		t.Fatalf("job A: exit %d\n%s%s", exitStatus(err), aOut.String(), aErr.String())
	}
	// A's checkpoints (rank 0's node) hold A's seed; every node's metrics
	// files are whole JSON lines of A's steps; no lock is left.
	out := filepath.Join(c.workdirs[0], "output")
	steps, _, err := checkpoint.Contents(out)
	if err != nil || len(steps) == 0 {
		t.Fatalf("job A's checkpoints in %s: %v, %v", out, steps, err)
	}
	for _, s := range steps {
		var m struct{ Config string }
		b, err := os.ReadFile(filepath.Join(out, s, checkpoint.ManifestFile))
		if err != nil || json.Unmarshal(b, &m) != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if !regexp.MustCompile(`(?m)^\s*seed: 1234$`).MatchString(m.Config) {
			t.Errorf("checkpoint %s does not hold job A's seed 1234", s)
		}
	}
	for i, wd := range c.workdirs {
		n := checkMetricsFiles(t, filepath.Join(wd, "log"))
		if i == 0 && n != 40 {
			t.Errorf("rank 0's metrics hold %d records, want job A's 40", n)
		}
		if h := readLockFile(t, wd); h != nil {
			t.Errorf("%s: a lock is left after job A's end: %+v", wd, h)
		}
	}
}

// TestStaleWorkerWritesNothing: a worker started by an attempt that a
// later one has outdated (its GPTUI_FENCE below the workdir's generation)
// stops with one line naming both, before it writes a log line.
func TestStaleWorkerWritesNothing(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.WriteFile(fence.File, []byte("2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(fence.Env, "1")
	code, _, stderr := runCLI(t, append([]string{"train", "-c", "tiny", "-o", "Engine.max_steps=2", "-o", "Engine.log_dir=log"}, ownOutput(t)...)...)
	if code == 0 || !strings.Contains(stderr, "this process belongs to attempt 1 of its job, and attempt 2 holds the workdir now") {
		t.Fatalf("exit %d, stderr %q: want a refusal naming attempts 1 and 2", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "log")); !os.IsNotExist(err) {
		t.Errorf("the stale worker made its log folder (%v)", err)
	}
}
