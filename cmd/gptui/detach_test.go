package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/jobdir"
)

// The detached jobs' end-to-end tests: 'gptui run --detach' started in a
// terminal (tmux) that is then closed, the job watched with 'gptui jobs'
// and its metrics files, opened with 'gptui attach' (the dashboard read
// off the screen), left running with q, stopped with 'gptui stop', and
// opened again once it has ended.

var jobIDRE = regexp.MustCompile(`\d{8}-\d{6}-[0-9a-f]{6}`)

// kill closes the terminal: the tmux server and its session go, and the
// processes of the session get SIGHUP.
func (s *tmuxSession) kill() {
	exec.Command(tmuxPath, "-S", s.socket, "kill-server").Run()
}

// detachArgs are the small job of the detached tests: dp2 on two CPU
// workers, without end, a checkpoint every 100 steps.
func detachArgs(t *testing.T) string {
	args := append(small(t), "-o", "Distributed.dp_degree=2", "-o", "Global.local_batch_size=4", "-o", "Global.micro_batch_size=4",
		"-o", "Engine.max_steps=100000", "-o", "Engine.eval_freq=0", "-o", "Engine.logging_freq=5", "-o", "Engine.save_load.save_steps=100")
	for i, a := range args {
		args[i] = shellQuoteTest(a)
	}
	return strings.Join(args, " ")
}

// gptuiIn runs exe with args in dir with env and returns its exit status,
// standard output and error. A parallel test passes its own exe
// (ownGPTUI): the processes a command starts (a supervisor from gptui
// restart) run the same file, which tells them from other tests'.
func gptuiIn(t *testing.T, exe, dir string, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(exe, args...)
	cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return exitStatus(err), out.String(), errb.String()
}

// jobState returns the state 'gptui jobs' (run by exe in dir) gives the
// job id, and its row.
func jobState(t *testing.T, exe, dir, id string) (string, string) {
	t.Helper()
	code, out, errs := gptuiIn(t, exe, dir, nil, "jobs")
	if code != 0 {
		t.Fatalf("gptui jobs: exit %d: %s", code, errs)
	}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == id {
			return f[1], l
		}
	}
	t.Fatalf("gptui jobs does not list %s:\n%s", id, out)
	return "", ""
}

// metricsStep returns the newest step of a metrics file, -1 if none.
func metricsStep(path string) int {
	f, err := os.Open(path)
	if err != nil {
		return -1
	}
	defer f.Close()
	ms, _ := event.ReadMetrics(path, f)
	if len(ms) == 0 {
		return -1
	}
	return ms[len(ms)-1].Step
}

// awaitSteps waits until the metrics file at path has passed step from
// by at least n steps, and returns its newest step.
func awaitSteps(t *testing.T, path string, from, n int, limit time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if s := metricsStep(path); s >= from+n {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: step %d, not past %d after %v", path, metricsStep(path), from+n-1, limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// killSupervisors kills, at the end of a test that failed half-way, the
// supervisors of the jobs in dir still running (their agents and workers
// die with them).
func killSupervisors(t *testing.T, dir string) {
	t.Cleanup(func() {
		jobs, _ := jobdir.List(dir)
		for _, j := range jobs {
			if j.Alive {
				t.Logf("killing the supervisor of %s (pid %d)", j.ID, j.Supervisor.PID)
				syscall.Kill(j.Supervisor.PID, syscall.SIGKILL)
			}
		}
	})
}

// detachScenario is the test of a detached job whose output lives in
// dir, started by the shell line start (in dir, with env) that runs exe,
// whose rank 0 writes its metrics to metrics and its checkpoints to
// outputDir on node.
func detachScenario(t *testing.T, exe, dir string, env []string, start, metrics, node, outputDir string) {
	killSupervisors(t, dir)
	var shellEnv []string // env for a shell line
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		shellEnv = append(shellEnv, k+"="+shellQuoteTest(v))
	}
	sh := strings.Join(shellEnv, " ")
	t0 := time.Now()
	// Started from a terminal, which is then closed.
	term := startTmux(t, dir, 200, 10, sh+" "+start)
	scr := term.await(regexp.MustCompile(`(?m)^`+jobIDRE.String()+`$`), 60*time.Second)
	id := jobIDRE.FindString(scr)
	if !strings.Contains(strings.Join(strings.Fields(scr), " "), "gptui: job "+id+" runs detached") {
		t.Errorf("run --detach says:\n%s", scr)
	}
	if code := exitRE.FindStringSubmatch(term.await(exitRE, 10*time.Second))[1]; code != "0" {
		t.Fatalf("gptui run --detach exited %s", code)
	}
	term.kill()
	t.Logf("%s started detached in %v; its terminal closed", id, time.Since(t0).Round(10*time.Millisecond))
	if st, row := jobState(t, exe, dir, id); st != "starting" && st != "running" {
		t.Errorf("gptui jobs, just started: %q", row)
	}

	// Training goes on without the terminal.
	step := awaitSteps(t, metrics, 0, 1, 120*time.Second)
	step = awaitSteps(t, metrics, step, 5, 60*time.Second)
	// The summary 'gptui jobs' reads is written as steps are logged (at
	// least every jobdir.SummaryEvery).
	running := regexp.MustCompile(`^` + id + ` +running +\d+/100000 +\d+\.\d{4} +` + regexp.QuoteMeta(node) + `[ ,]`)
	var row string
	for deadline := time.Now().Add(2*jobdir.SummaryEvery + time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, row = jobState(t, exe, dir, id); running.MatchString(row) || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("training on without its terminal at step %d: %s", step, row)
	if !running.MatchString(row) {
		t.Errorf("gptui jobs while it runs: %q", row)
	}

	// attach: the live dashboard.
	ui := startTmux(t, dir, 120, 32, sh+" NO_COLOR=1 "+shellQuoteTest(exe)+" attach")
	scr = ui.await(regexp.MustCompile(`(?s)job running.*step \d+/100000  loss \d+\.\d{4}.*ranks: 2 running`), 30*time.Second)
	if !strings.Contains(scr, "Log  rank 0 on "+node) || !logTailRE.MatchString(scr) {
		t.Errorf("the attached dashboard lacks rank 0's log:\n%s", scr)
	}
	// q leaves it running: detach is the default.
	ui.keys("q")
	ui.await(regexp.MustCompile(`detach \(it runs on; gptui attach reopens it\) or stop it\? \[D/s\]`), 10*time.Second)
	ui.keys("Enter")
	scr = ui.await(exitRE, 20*time.Second)
	if code := exitRE.FindStringSubmatch(scr)[1]; code != "0" || !strings.Contains(strings.Join(strings.Fields(scr), " "), "gptui: job "+id+" runs on") {
		t.Errorf("q, enter: exit %s:\n%s", code, scr)
	}
	step = awaitSteps(t, metrics, metricsStep(metrics), 5, 60*time.Second)
	if st, row := jobState(t, exe, dir, id); st != "running" {
		t.Errorf("after q detached: %q", row)
	}
	t.Logf("detached from the dashboard; the job at step %d", step)

	// gptui stop: a checkpoint, the job stopped, nothing left running.
	t1 := time.Now()
	code, out, errs := gptuiIn(t, exe, dir, env, "stop", id)
	t.Logf("gptui stop in %v:\n%s%s", time.Since(t1).Round(10*time.Millisecond), out, errs)
	m := regexp.MustCompile(`(?m)^job ` + id + ` stopped\nthe newest checkpoint: ` + regexp.QuoteMeta(node) + `:(output/step_(\d+)) \(step (\d+)\)$`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("gptui stop: exit %d:\n%s%s", code, out, errs)
	}
	if m[2] != strings.Repeat("0", 8-len(m[3]))+m[3] || m[3] == "0" {
		t.Errorf("the checkpoint %s of step %s", m[1], m[3])
	}
	if _, err := checkpoint.Load(filepath.Join(outputDir, filepath.Base(m[1]))); err != nil {
		t.Errorf("the stop's checkpoint does not load: %v", err)
	}
	if st, row := jobState(t, exe, dir, id); st != "stopped" {
		t.Errorf("after gptui stop: %q", row)
	}
	awaitNoProcess(t, exe, 20*time.Second, os.Getpid())

	// A finished run opens in attach.
	ui = startTmux(t, dir, 120, 32, sh+" NO_COLOR=1 "+shellQuoteTest(exe)+" attach "+id)
	scr = ui.await(regexp.MustCompile(`(?s)job stopped.*step \d+/100000  loss.*ranks: 2 stopped.*checkpoint step `+m[3]), 30*time.Second)
	if strings.Contains(scr, "failed") {
		t.Errorf("the stopped job shows a failure:\n%s", scr)
	}
	sameDone(t, exe, dir, id, scr)

	// gptui restart from another terminal: the open attach follows the
	// job into its new attempt, showing it running within 2 s of its
	// event log saying so, and then through a second stop.
	events := filepath.Join(dir, jobdir.Root, id, jobdir.EventsFile)
	fi, err := os.Stat(events)
	if err != nil {
		t.Fatal(err)
	}
	t2 := time.Now()
	if code, out, errs := gptuiIn(t, exe, dir, env, "restart", id); code != 0 {
		t.Fatalf("gptui restart: exit %d:\n%s%s", code, out, errs)
	}
	again := []*regexp.Regexp{regexp.MustCompile(`job running`), regexp.MustCompile(`ranks: 2 running`),
		regexp.MustCompile(`restart \(manual\) from step ` + m[3] + `, this attempt`)}
	var runs time.Time // when the event log has the new attempt running
	for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if runs.IsZero() && attemptRunning(t, events, fi.Size(), 2) {
			runs = time.Now()
		}
		scr = ui.screen()
		if !slices.ContainsFunc(again, func(re *regexp.Regexp) bool { return !re.MatchString(scr) }) {
			if runs.IsZero() && attemptRunning(t, events, fi.Size(), 2) {
				runs = time.Now() // written while the screen was read
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the attach did not follow the restart:\n%s", scr)
		}
	}
	switch lag := time.Since(runs); {
	case runs.IsZero():
		t.Errorf("the attach shows the job running before its event log does:\n%s", scr)
	case lag > 2*time.Second:
		t.Errorf("the attach showed the restarted job running %v after its event log", lag)
	default:
		t.Logf("restarted in %v; the open attach showed it running %v after its event log", runs.Sub(t2).Round(10*time.Millisecond), lag.Round(10*time.Millisecond))
	}
	t3 := time.Now()
	if code, out, errs := gptuiIn(t, exe, dir, env, "stop", id); code != 0 {
		t.Fatalf("the second gptui stop: exit %d:\n%s%s", code, out, errs)
	}
	// Workers stop at their next step: a stop that takes the launcher's
	// kill grace (launch.DefaultInterruptGrace) lost the interrupt.
	if took := time.Since(t3); took > 30*time.Second {
		t.Errorf("the second gptui stop took %v; the job's log:\n%s", took.Round(time.Second), jobLogs(filepath.Dir(events)))
	}
	scr = ui.await(regexp.MustCompile(`(?s)job stopped.*ranks: 2 stopped`), 30*time.Second)
	sameDone(t, exe, dir, id, scr)
	ui.keys("q") // nothing runs: no question
	if scr = ui.await(exitRE, 10*time.Second); exitRE.FindStringSubmatch(scr)[1] != "0" {
		t.Errorf("q on an ended job:\n%s", scr)
	}
	awaitNoProcess(t, exe, 20*time.Second, os.Getpid())
	t.Logf("the whole scenario took %v", time.Since(t0).Round(100*time.Millisecond))
}

// jobLogs returns a job's event log and output, for a failure's message.
func jobLogs(jobDir string) string {
	var b strings.Builder
	for _, name := range []string{jobdir.EventsFile, jobdir.OutputFile} {
		data, _ := os.ReadFile(filepath.Join(jobDir, name))
		fmt.Fprintf(&b, "--- %s\n%s", name, data)
	}
	return b.String()
}

// doneRE reads the steps done of the total on the dashboard's header.
var doneRE = regexp.MustCompile(`step (\d+/\d+)`)

// sameDone checks that the dashboard's screen scr and 'gptui jobs' (run
// by exe in dir) give the job id the same steps done of the same total.
func sameDone(t *testing.T, exe, dir, id, scr string) {
	t.Helper()
	state, row := jobState(t, exe, dir, id)
	m := doneRE.FindStringSubmatch(scr)
	if f := strings.Fields(row); m == nil || len(f) < 3 || f[2] != m[1] {
		t.Errorf("the job %s: gptui jobs says %q, the dashboard:\n%s", state, row, scr)
		return
	}
	t.Logf("the job %s: %s steps done on the dashboard and in gptui jobs", state, m[1])
}

// attemptRunning reports whether the event log at path has, past offset
// from, a job started and n workers running.
func attemptRunning(t *testing.T, path string, from int64, n int) bool {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < from {
		t.Fatalf("the event log: %v", err)
	}
	started, running := false, 0
	for _, l := range strings.Split(string(b[from:]), "\n") {
		e, err := event.Decode([]byte(l))
		switch {
		case err != nil:
		case e.Kind == event.KindJob && e.State == event.JobStarted:
			started = true
		case e.Kind == event.KindWorker && e.State == event.WorkerRunning:
			running++
		}
	}
	return started && running >= n
}

// TestDetachLocal: a local job (--nproc 2) started with 'gptui run
// --detach' outlives its terminal, is attached to, detached from with q,
// stopped with 'gptui stop' (a checkpoint) and opened again once stopped,
// 'gptui jobs' giving its state at each point.
func TestDetachLocal(t *testing.T) {
	t.Parallel() // its processes are its own: ownGPTUI
	dir := t.TempDir()
	exe := ownGPTUI(t)
	start := "GPTUI_THREADS=1 " + shellQuoteTest(exe) + " run --detach --nproc 2 " + detachArgs(t)
	detachScenario(t, exe, dir, nil, start, event.MetricsFile(filepath.Join(dir, "log"), 0), "localhost", filepath.Join(dir, "output"))
}

// TestDetachHosts: the same for a job on two sshd nodes with workdirs of
// their own: its supervisor reaches the nodes over SSH, and rank 0's
// metrics and checkpoint are in the first node's workdir.
func TestDetachHosts(t *testing.T) {
	long(t)
	t.Parallel() // its processes are its own: ownGPTUI
	dir := t.TempDir()
	exe := ownGPTUI(t)
	c := newSSHCluster(t, "cpu:1")
	env := []string{"HOME=" + c.home, "SSH_AUTH_SOCK=", "GPTUI_THREADS=1"}
	start := shellQuoteTest(exe) + " run --detach --hosts " + shellQuoteTest(c.hosts) + " " + detachArgs(t)
	detachScenario(t, exe, dir, env, start, event.MetricsFile(filepath.Join(c.workdirs[0], "log"), 0), "127.0.0.2", filepath.Join(c.workdirs[0], "output"))
	c.awaitGone(t, time.Now(), 10*time.Second)
}

// TestDoneOnBothScreens: a local detached job that ends done, and one
// that fails (a worker killed): 'gptui attach' in a terminal and 'gptui
// jobs' give each the same steps done of the same total. (The stopped and
// restarted states: TestDetachLocal.)
func TestDoneOnBothScreens(t *testing.T) {
	long(t)
	t.Parallel() // its processes are its own: ownGPTUI
	dir := t.TempDir()
	exe := ownGPTUI(t)
	killSupervisors(t, dir)
	run := func(steps int, logDir string) string {
		t.Helper()
		args := append([]string{"run", "--detach", "--nproc", "2"}, small(t)...)
		args = append(args, "-o", "Distributed.dp_degree=2", "-o", "Global.local_batch_size=4", "-o", "Global.micro_batch_size=4",
			"-o", fmt.Sprintf("Engine.max_steps=%d", steps), "-o", "Engine.eval_freq=0", "-o", "Engine.logging_freq=5",
			"-o", "Engine.save_load.save_steps=0", "-o", "Engine.log_dir="+logDir, "-o", "Engine.save_load.output_dir="+logDir+"-output")
		cmd := exec.Command(exe, args...)
		cmd.Dir, cmd.Env = dir, append(os.Environ(), "GPTUI_THREADS=1")
		out, err := cmd.Output()
		id := jobIDRE.FindString(string(out))
		if err != nil || id == "" {
			t.Fatalf("gptui run --detach: %v: %s", err, out)
		}
		return id
	}
	awaitState := func(id, want string) {
		t.Helper()
		for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			st, row := jobState(t, exe, dir, id)
			if st == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the job is not %s after 120 s: %q", want, row)
			}
		}
	}
	attach := func(id, state string) {
		t.Helper()
		ui := startTmux(t, dir, 120, 32, "NO_COLOR=1 "+shellQuoteTest(exe)+" attach "+id)
		sameDone(t, exe, dir, id, ui.await(regexp.MustCompile(`(?s)job `+state+`.*step \d+/\d+`), 30*time.Second))
		ui.keys("q")
		ui.await(exitRE, 10*time.Second)
	}

	id := run(20, "log-done")
	awaitState(id, "done")
	attach(id, "done")

	id = run(100000, "log-failed")
	awaitSteps(t, event.MetricsFile(filepath.Join(dir, "log-failed"), 0), 0, 10, 120*time.Second)
	syscall.Kill(rankWorker(t, processesOf(exe), 1), syscall.SIGKILL)
	awaitState(id, "failed")
	attach(id, "failed")
	awaitNoProcess(t, exe, 20*time.Second, os.Getpid())
}
