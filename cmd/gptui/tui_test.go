package main

import (
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/gptui/gptui/agent"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/jobdir"
)

// The terminal UI's end-to-end tests run a real gptui binary (builtGPTUI)
// in a real terminal, Debian's tmux: they type with send-keys and read the
// screen with capture-pane.

const tmuxPath = "/usr/bin/tmux"

// tmuxSession is a detached tmux server of its own running one command.
type tmuxSession struct {
	t      *testing.T
	socket string
}

// startTmux runs command (a shell command line) in dir in a w×h terminal.
func startTmux(t *testing.T, dir string, w, h int, command string) *tmuxSession {
	t.Helper()
	if _, err := os.Stat(tmuxPath); err != nil {
		t.Skip("tmux is not installed (.ci/run installs it)")
	}
	// The server's socket in a directory of the test's, which goes with
	// it: tmux leaves its socket behind when its server is killed.
	s := &tmuxSession{t: t, socket: filepath.Join(t.TempDir(), "tmux.sock")}
	// The shell line prints the exit status and keeps the pane open, so the
	// test can read it after the UI has left the alternate screen.
	line := fmt.Sprintf("cd %s && %s; echo gptui-exit=$?; sleep 600", shellQuoteTest(dir), command)
	s.tmux("new-session", "-d", "-s", "ui", "-x", strconv.Itoa(w), "-y", strconv.Itoa(h), line)
	t.Cleanup(func() { exec.Command(tmuxPath, "-S", s.socket, "kill-server").Run() })
	return s
}

func (s *tmuxSession) tmux(args ...string) string {
	s.t.Helper()
	out, err := exec.Command(tmuxPath, append([]string{"-S", s.socket, "-f", "/dev/null"}, args...)...).CombinedOutput()
	if err != nil {
		s.t.Fatalf("tmux %v: %v: %s", args, err, out)
	}
	return string(out)
}

// screen returns what the terminal shows.
func (s *tmuxSession) screen() string { return s.tmux("capture-pane", "-p", "-t", "ui") }

// keys types keys (tmux key names, such as Enter or q).
func (s *tmuxSession) keys(keys ...string) {
	s.tmux(append([]string{"send-keys", "-t", "ui"}, keys...)...)
}

// await waits until the screen matches re and returns the screen.
func (s *tmuxSession) await(re *regexp.Regexp, limit time.Duration) string {
	s.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		scr := s.screen()
		if re.MatchString(scr) {
			return scr
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("after %v the screen does not match %q:\n%s", limit, re, scr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func shellQuoteTest(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// processesOf returns the live processes whose executable is exe.
func processesOf(exe string) []int {
	return liveProcesses(func(proc string) bool {
		p, err := os.Readlink(filepath.Join(proc, "exe"))
		return err == nil && p == exe
	})
}

// awaitNoProcess waits for every process running exe but those of keep
// to end; it fails the test, and kills them, if some remain after limit.
func awaitNoProcess(t *testing.T, exe string, limit time.Duration, keep ...int) {
	t.Helper()
	awaitNone(t, "gptui processes", func() []int {
		return slices.DeleteFunc(processesOf(exe), func(pid int) bool { return slices.Contains(keep, pid) })
	}, time.Now(), limit)
}

var (
	lossRE    = regexp.MustCompile(`step \d+/\d+  loss \d+\.\d{4}`)
	memBarRE  = regexp.MustCompile(`(?m)^.*  r[0-3] +[█░]+ [\d.]+(?: [KMG]iB)?/\d+\.\d GiB`)
	logTailRE = regexp.MustCompile(`(?m)^ \[train\] epoch: \d+ step: \d+ lr: \S+ loss: \d+\.\d+`)
	exitRE    = regexp.MustCompile(`gptui-exit=(\d+)`)
)

// localCommand is the shell command line of 'gptui --nproc 2' training
// tiny dp2 without end, one thread per worker, with extra flags.
func localCommand(exe string, extra ...string) string {
	return "NO_COLOR=1 GPTUI_THREADS=1 " + shellQuoteTest(exe) + " --nproc 2 --preset tiny" +
		" -o Distributed.dp_degree=2 -o Global.local_batch_size=4 -o Global.micro_batch_size=4" +
		" -o Engine.max_steps=100000 -o Engine.eval_freq=0 " + strings.Join(extra, " ")
}

// localPID returns the pid of this machine's gptui process exe running
// what (the "agent", or "train" for the worker of rank), 0 if none.
func localPID(exe, what string, rank int) int {
	for _, pid := range processesOf(exe) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(string(cmdline), "\x00")
		if len(args) < 2 || args[1] != what || what == "agent" && len(args) != 3 { // not the lock holder, "agent --lock"
			continue
		}
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if what == "agent" || strings.Contains("\x00"+string(env), fmt.Sprintf("\x00RANK=%d\x00", rank)) {
			return pid
		}
	}
	return 0
}

// throttle gives the process pid half a CPU, as cpulimit does: stopped
// 100 ms of every 200 ms, until the function it returns is called.
func throttle(pid int) (stop func()) {
	done, over := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(over)
		for {
			syscall.Kill(pid, syscall.SIGSTOP)
			time.Sleep(100 * time.Millisecond)
			syscall.Kill(pid, syscall.SIGCONT)
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); <-over }) }
}

var headerStepRE = regexp.MustCompile(`step (\d+)/\d+  loss`)

// headerStep returns the step the dashboard's header shows, -1 if none.
func headerStep(scr string) int {
	m := headerStepRE.FindStringSubmatch(scr)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// rankRow returns the ranks pane's row of rank r, "" if it is not shown.
func rankRow(scr string, r int) string {
	re := regexp.MustCompile(fmt.Sprintf(`(?m)^[ ›]%d +(waiting|starting|running|silent|done|stopped|failed|lost|hung|restarting).*$`, r))
	return re.FindString(scr)
}

// TestTUILocal runs 'gptui --nproc 2 --preset tiny' in tmux: it launches
// the job from the Job screen, waits for a loss in the dashboard, checks
// every rank's row, the memory bars and the log tail, writes the report
// picture with w; q asks whether to detach or stop (esc stays); the
// terminal is then closed, and the job trains on without the UI; 'gptui
// attach' opens it again, s stops it (every rank stopped, none failed), q
// quits, and says where the logs and the checkpoint are.
func TestTUILocal(t *testing.T) {
	t.Parallel() // its processes are its own: ownGPTUI
	exe := ownGPTUI(t)
	dir := t.TempDir()
	s := startTmux(t, dir, 120, 32, localCommand(exe, "-o Engine.logging_freq=2 -o Engine.save_load.save_steps=4"))

	s.await(regexp.MustCompile(`dp 2 × sharding 1 \(stage 1\) × mp 1 × pp 1 = 2 ranks · rank table: 2 ✓`), 30*time.Second)
	// The planner's ranked table for 2 CPU workers.
	s.await(regexp.MustCompile(`(?s)✓ fits: config's strategy dp2 mb4: .*strategy \(\*: config's\).* 1  \S.*\d+ feasible, \d+ rejected`), 10*time.Second)
	s.keys("Enter") // the Launch row is selected
	scr := s.await(lossRE, 120*time.Second)
	// Memory is sampled each second; the log shows rank 0's steps; a
	// checkpoint every 4 steps.
	scr = s.await(memBarRE, 20*time.Second)
	scr = s.await(logTailRE, 20*time.Second)
	scr = s.await(regexp.MustCompile(`checkpoint step \d+`), 60*time.Second)
	if !strings.Contains(scr, "ranks: 2 running") || !strings.Contains(scr, "Log  rank 0 on localhost · follow") {
		t.Errorf("the dashboard lacks the ranks' states or the log pane:\n%s", scr)
	}
	for r := range 2 {
		if row := rankRow(scr, r); !strings.Contains(row, "running     localhost") {
			t.Errorf("rank %d's row %q", r, row)
		}
	}
	if strings.Contains(scr, "\x1b") {
		t.Errorf("escape sequences on screen with NO_COLOR")
	}
	if len(processesOf(exe)) < 4 {
		t.Errorf("expected the UI, the agent and two workers running, found %v", processesOf(exe))
	}
	// The launch writes the rank table in the job's directory, not here.
	if tables, _ := filepath.Glob(filepath.Join(dir, "jobs", "*", "rank_table.json")); len(tables) != 1 {
		t.Errorf("the launch wrote rank tables %v; want one under jobs/<job>/", tables)
	}
	if _, err := os.Stat(filepath.Join(dir, "rank_table.json")); err == nil {
		t.Errorf("the launch wrote rank_table.json in the current directory")
	}

	// w: the report picture of the ranks' steps so far.
	s.keys("w")
	s.await(regexp.MustCompile(`wrote .*report\.png: 1200×900 pixels, 2 ranks`), 30*time.Second)
	if f, err := os.Open(filepath.Join(dir, "report.png")); err != nil {
		t.Error(err)
	} else if _, err := png.Decode(f); err != nil {
		t.Errorf("report.png: %v", err)
	}

	// q: the job runs on its own, detached; the UI asks, detach first.
	// esc stays; then the terminal is closed (SIGHUP to the UI), and the
	// job runs on.
	s.keys("q")
	s.await(regexp.MustCompile(`A job is running: detach \(it runs on; gptui attach reopens it\) or stop it\? \[D/s\]`), 10*time.Second)
	s.keys("Escape")
	s.await(regexp.MustCompile(`s stop  r restart  \? help  q quit`), 10*time.Second)
	ui := uiPID(exe)
	s.kill()
	deadline := time.Now().Add(20 * time.Second)
	for slices.Contains(processesOf(exe), ui) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if slices.Contains(processesOf(exe), ui) {
		t.Errorf("the UI (pid %d) runs on after its terminal closed", ui)
	}
	metrics := filepath.Join(dir, "log", "metrics.0.jsonl")
	awaitSteps(t, metrics, metricsStep(metrics), 2, 60*time.Second)
	if n := len(processesOf(exe)); n < 4 {
		t.Errorf("after the UI's terminal closed, %d gptui processes: want the supervisor, the agent and two workers", n)
	}

	// gptui attach opens it again; s stops it: every rank is stopped, none
	// failed.
	s = startTmux(t, dir, 120, 32, "NO_COLOR=1 "+shellQuoteTest(exe)+" attach")
	s.await(lossRE, 30*time.Second)
	s.keys("s")
	s.await(regexp.MustCompile(`Stop the job\?`), 10*time.Second)
	s.keys("y")
	scr = s.await(regexp.MustCompile(`job stopped`), 60*time.Second)
	t.Logf("after s:\n%s", scr)
	if !strings.Contains(scr, "ranks: 2 stopped") || strings.Contains(scr, "failed") || strings.Contains(scr, "✗") {
		t.Errorf("after s, want every rank stopped and none failed:\n%s", scr)
	}
	awaitNoProcess(t, exe, 20*time.Second, os.Getpid(), uiPID(exe))

	s.keys("q")
	scr = s.await(exitRE, 30*time.Second)
	if code := exitRE.FindStringSubmatch(scr)[1]; code != "0" {
		t.Errorf("gptui exited with status %s:\n%s", code, scr)
	}
	flat := strings.Join(strings.Fields(scr), " ")
	if !regexp.MustCompile(`gptui: the job's logs \(workerlog.<rank>, metrics.<rank>.jsonl\): localhost:log gptui: the newest checkpoint: localhost:\S*output/step_\d+ \(step \d+\)`).MatchString(flat) {
		t.Errorf("quitting does not say where the logs and the checkpoint are:\n%s", scr)
	}
	awaitNoProcess(t, exe, 10*time.Second)
}

// uiPID returns the pid of the UI among exe's processes: the one that is
// neither an agent, a worker nor a job's supervisor.
func uiPID(exe string) int {
	for _, pid := range processesOf(exe) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(string(cmdline), "\x00")
		if len(args) > 1 && args[1] != "agent" && args[1] != "train" && args[1] != jobdir.SuperviseCommand {
			return pid
		}
	}
	return 0
}

// TestTUILocalStraggler: one worker of a local dp2 job given half a CPU is
// named the slowest rank in the header within 8 steps or three of its
// progress reports (agent.ProgressEvery), whichever is later, though both
// ranks' steps take as long (one waits for the other); kill -9 of it then
// shows it failed by SIGKILL, the cause, and the other rank stopped. (4
// steps on a quiet machine, twice; 6 in a .ci/run whose other packages
// loaded both cores, where the ranks' reports and the screen trail by a
// step or two; 10 steps, 2.1 s, beside cmd/gptui's other tests alone,
// where a report came a second late.)
func TestTUILocalStraggler(t *testing.T) {
	long(t)
	exe := builtGPTUI(t)
	s := startTmux(t, t.TempDir(), 120, 32, localCommand(exe, "-o Engine.logging_freq=1"))
	s.await(regexp.MustCompile(`rank table: 2 ✓`), 30*time.Second)
	s.keys("Enter")
	// Past the first steps, whose times the start-up skews.
	s.await(regexp.MustCompile(`step ([5-9]|\d\d+)/100000  loss`), 120*time.Second)
	pid := localPID(exe, "train", 1)
	if pid == 0 {
		t.Fatalf("no worker of rank 1 among %v", processesOf(exe))
	}
	before := s.screen()
	from := headerStep(before)
	t.Logf("before: %s", regexp.MustCompile(`slowest rank \d+ ×\S+`).FindString(before))
	stop := throttle(pid)
	defer stop()
	slowed := time.Now()
	named := regexp.MustCompile(`slowest rank 1 ×(\d+\.\d)`)
	var scr string
	deadline := time.Now().Add(60 * time.Second)
	for {
		scr = s.screen()
		if m := named.FindStringSubmatch(scr); m != nil {
			if x, _ := strconv.ParseFloat(m[1], 64); x >= 1.5 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("rank 1 not named the slowest 60 s after it was slowed at step %d:\n%s", from, scr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	at, after := headerStep(scr), time.Since(slowed)
	t.Logf("slowed at step %d, named at step %d, %.1f s later: %s", from, at, after.Seconds(), named.FindString(scr))
	if at-from > 8 && after > 3*agent.ProgressEvery {
		t.Errorf("rank 1 named %d steps and %.1f s after it was slowed, want at most 8 steps or %v:\n%s", at-from, after.Seconds(), 3*agent.ProgressEvery, scr)
	}
	stop()

	syscall.Kill(pid, syscall.SIGKILL)
	scr = s.await(regexp.MustCompile(`job failed`), 30*time.Second)
	t.Logf("after kill -9 of rank 1:\n%s", scr)
	if row := rankRow(scr, 1); !strings.Contains(row, "failed ✗") || !strings.Contains(row, "killed by SIGKILL") {
		t.Errorf("rank 1's row %q, want failed ✗, killed by SIGKILL", row)
	}
	if row := rankRow(scr, 0); !strings.Contains(row, "stopped") {
		t.Errorf("rank 0's row %q, want stopped", row)
	}
	if !strings.Contains(scr, "ranks: 1 stopped · 1 failed (cause)") || !strings.Contains(scr, "✗ rank 1 on localhost failed: killed by SIGKILL") {
		t.Errorf("the header or the banner:\n%s", scr)
	}
	s.keys("q")
	s.await(exitRE, 30*time.Second)
	awaitNoProcess(t, exe, 10*time.Second)
}

// TestTUILocalHang: a worker of a local dp2 job stopped for 4 s
// (SIGSTOP, SIGCONT) is shown silent meanwhile (a rank is silent 2 s
// after its last progress report, sent every second: a 3 s stop left a
// window of a second or less, which a loaded machine's screen captures
// could miss), with no other rank named
// the slowest while it is, and named the slowest within 3 steps of the
// stop; then the other is stopped for 4 s, and the header names it within
// 3 steps in turn. Then a worker stopped for good shows silent within
// 5 s, its own row and the header naming it, then hung at the hang bound
// (10 s, checked every second) and the other stopped, saying why; the
// stopped worker is killed with the gang, and the UI exits 1 after the
// failed job.
func TestTUILocalHang(t *testing.T) {
	long(t)
	t.Parallel() // its processes are its own (ownGPTUI); most of it is waiting
	exe := ownGPTUI(t)
	s := startTmux(t, t.TempDir(), 120, 32, localCommand(exe, "-o Engine.logging_freq=1 --hang-timeout 10s"))
	s.await(regexp.MustCompile(`rank table: 2 ✓`), 30*time.Second)
	s.keys("Enter")
	s.await(regexp.MustCompile(`step ([5-9]|\d\d+)/100000  loss`), 120*time.Second)
	for _, rank := range []int{1, 0} {
		pid := localPID(exe, "train", rank)
		if pid == 0 {
			t.Fatalf("no worker of rank %d among %v", rank, processesOf(exe))
		}
		from := headerStep(s.screen())
		const stopFor = 4 * time.Second
		syscall.Kill(pid, syscall.SIGSTOP)
		stopped := time.Now()
		other := regexp.MustCompile(fmt.Sprintf(`slowest rank %d`, 1-rank))
		named := regexp.MustCompile(fmt.Sprintf(`slowest rank %d: stalled (\d+\.\d) s in step (\d+)`, rank))
		silent := false
		var scr string
		for {
			scr = s.screen()
			if time.Since(stopped) > stopFor {
				syscall.Kill(pid, syscall.SIGCONT)
			}
			now := strings.Contains(scr, fmt.Sprintf("rank %d silent", rank))
			silent = silent || now
			if now && other.MatchString(scr) {
				t.Errorf("rank %d silent, rank %d named the slowest:\n%s", rank, 1-rank, scr)
			}
			if named.MatchString(scr) {
				break
			}
			if time.Since(stopped) > 60*time.Second {
				syscall.Kill(pid, syscall.SIGCONT)
				t.Fatalf("rank %d not named the slowest 60 s after its %v stop at step %d:\n%s", rank, stopFor, from, scr)
			}
			time.Sleep(50 * time.Millisecond)
		}
		syscall.Kill(pid, syscall.SIGCONT)
		at := headerStep(scr)
		t.Logf("rank %d stopped at step %d, named at step %d: %s (silent shown: %v)", rank, from, at, named.FindString(scr), silent)
		if at-from > 3 {
			t.Errorf("rank %d named %d steps after its stop, want at most 3:\n%s", rank, at-from, scr)
		}
		if !silent {
			t.Errorf("rank %d was never shown silent during its %v stop", rank, stopFor)
		}
		for deadline := time.Now().Add(60 * time.Second); headerStep(s.screen()) < at+3; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no step %d 60 s after step %d:\n%s", at+3, at, s.screen())
			}
		}
	}

	pid := localPID(exe, "train", 0)
	syscall.Kill(pid, syscall.SIGSTOP)
	defer syscall.Kill(pid, syscall.SIGCONT)
	at := time.Now()
	scr := s.await(regexp.MustCompile(`rank 0 silent \d+s`), 5*time.Second)
	t.Logf("silent %v after the SIGSTOP:\n%s", time.Since(at).Round(100*time.Millisecond), scr)
	if row := rankRow(scr, 0); !regexp.MustCompile(`^[ ›]0 +silent \d+s`).MatchString(row) {
		t.Errorf("rank 0's row %q, want silent", row)
	}
	if strings.Contains(scr, "slowest rank 1") || !strings.Contains(scr, "ranks: 1 running · 1 silent") {
		t.Errorf("while rank 0 is silent:\n%s", scr)
	}
	scr = s.await(regexp.MustCompile(`ranks: 1 stopped · 1 hung \(cause\)`), 30*time.Second)
	t.Logf("hung %v after the SIGSTOP:\n%s", time.Since(at).Round(100*time.Millisecond), scr)
	if time.Since(at) < 10*time.Second {
		t.Errorf("hung %v after the SIGSTOP, before the 10 s bound", time.Since(at))
	}
	flat := strings.Join(strings.Fields(scr), " ")
	if row := rankRow(scr, 0); !strings.Contains(row, "hung ✗") || !strings.Contains(flat, "✗ the job hung: rank 0 on localhost stuck: no progress report for") {
		t.Errorf("rank 0's row %q, or the banner:\n%s", row, scr)
	}
	if row := rankRow(scr, 1); !strings.Contains(row, "stopped with the job because rank 0 hung") {
		t.Errorf("rank 1's row %q, want its reason", row)
	}
	s.keys("q")
	scr = s.await(exitRE, 30*time.Second)
	if code := exitRE.FindStringSubmatch(scr)[1]; code != "1" || !strings.Contains(strings.Join(strings.Fields(scr), " "), "gptui: the job failed: job hung: rank 0") {
		t.Errorf("after the failed job gptui exited with status %s, want 1 and the failure:\n%s", code, scr)
	}
	awaitNoProcess(t, exe, 10*time.Second)
}

// hostsCommand is the shell command line of 'gptui --hosts' on c's
// nodes, training tiny dp2 without end, with extra flags.
func hostsCommand(c *sshCluster, exe string, extra ...string) string {
	return "HOME=" + shellQuoteTest(c.home) + " SSH_AUTH_SOCK= NO_COLOR=1 GPTUI_THREADS=1 " + shellQuoteTest(exe) +
		" --hosts " + shellQuoteTest(c.hosts) + " --preset tiny" +
		" -o Distributed.dp_degree=2 -o Global.local_batch_size=4 -o Global.micro_batch_size=4" +
		" -o Engine.max_steps=100000 -o Engine.logging_freq=2 " + strings.Join(extra, " ")
}

var bothReadyRE = regexp.MustCompile(`(?s)127\.0\.0\.2 .* ready .*127\.0\.0\.3 .* ready `)

// launchHosts launches the job from the Job screen and waits for its
// first loss, the memory bars and a log tail; it returns the screen.
func launchHosts(t *testing.T, s *tmuxSession) string {
	t.Helper()
	s.keys("3")
	s.await(regexp.MustCompile(`dp 2 × sharding 1 \(stage 1\) × mp 1 × pp 1 = 2 ranks · rank table: 2 ✓`), 10*time.Second)
	s.keys("G", "Enter")
	s.await(lossRE, 120*time.Second)
	s.await(memBarRE, 20*time.Second)
	return s.await(logTailRE, 20*time.Second)
}

// TestTUIHosts runs 'gptui --hosts FILE --preset tiny' in tmux against two
// sshd nodes on 127.0.0.2 and 127.0.0.3 with one CPU worker each, the
// second's host key unknown: the Nodes screen shows it, a accepts it after
// asking with its fingerprint (the line recorded is ssh-keyscan's), and
// both nodes become ready. The job is launched from the Job screen: a
// loss, the memory bars, both nodes' health and a log tail show in the
// dashboard. kill -9 of rank 1 shows it failed by SIGKILL, the cause, and
// rank 0 stopped. q quits: no agent or worker remains on either node, and
// the UI exits 0.
func TestTUIHosts(t *testing.T) {
	long(t)
	t.Parallel() // its processes are its own: ownGPTUI
	exe := ownGPTUI(t)
	c := newSSHCluster(t, "cpu:1")
	known := filepath.Join(c.home, ".ssh", "known_hosts")
	if err := os.WriteFile(known, []byte(c.servers[0].KnownHostsLine()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startTmux(t, t.TempDir(), 120, 32, hostsCommand(c, exe))

	scr := s.await(regexp.MustCompile(`(?s)127\.0\.0\.2 .* ready .*127\.0\.0\.3 .* host key `), 90*time.Second)
	if !strings.Contains(scr, "[1 Nodes]") {
		t.Errorf("the nodes screen:\n%s", scr)
	}
	fp := ssh.FingerprintSHA256(c.servers[1].HostKey)
	s.keys("j", "a")
	s.await(regexp.MustCompile(`Trust 127\.0\.0\.3's host key `+regexp.QuoteMeta(fp)), 10*time.Second)
	s.keys("y")
	s.await(bothReadyRE, 90*time.Second)
	if b, _ := os.ReadFile(known); !strings.Contains(string(b), c.servers[1].KnownHostsLine()+"\n") {
		t.Errorf("known_hosts after accepting:\n%s\nwant the line %s", b, c.servers[1].KnownHostsLine())
	}

	scr = launchHosts(t, s)
	t.Logf("the dashboard:\n%s", scr)
	if !strings.Contains(scr, "ranks: 2 running") || !strings.Contains(scr, "Log  rank 0 on 127.0.0.2 · follow") || !strings.Contains(scr, "127.0.0.3  cpu ") {
		t.Errorf("the dashboard lacks the ranks' states, the log pane or the nodes' health:\n%s", scr)
	}
	if n := len(c.jobProcesses()); n < 4 {
		t.Errorf("expected two agents and two workers on the nodes, found %d processes", n)
	}

	// kill -9 of rank 1, on the second node.
	syscall.Kill(c.workerPID(t, 1), syscall.SIGKILL)
	scr = s.await(regexp.MustCompile(`job failed`), 30*time.Second)
	t.Logf("after kill -9 of rank 1:\n%s", scr)
	if !strings.Contains(scr, "ranks: 1 stopped · 1 failed (cause)") || !strings.Contains(rankRow(scr, 1), "failed ✗") ||
		!strings.Contains(rankRow(scr, 1), "killed by SIGKILL") || !strings.Contains(rankRow(scr, 0), "stopped") {
		t.Errorf("after kill -9 of rank 1:\n%s", scr)
	}

	s.keys("q")
	quit := time.Now()
	scr = s.await(exitRE, 30*time.Second)
	if code := exitRE.FindStringSubmatch(scr)[1]; code != "1" {
		t.Errorf("gptui exited with status %s after the failed job, want 1:\n%s", code, scr)
	}
	c.awaitGone(t, quit, 10*time.Second)
	awaitNoProcess(t, exe, 10*time.Second)
}

// TestTUIHostsNodeLost: the second node's agent killed during a job shows
// its rank lost and rank 0 stopped; Launch is then off, naming the lost
// node, until R on the Nodes screen sets it up again.
func TestTUIHostsNodeLost(t *testing.T) {
	long(t)
	t.Parallel() // its processes are its own: ownGPTUI
	exe := ownGPTUI(t)
	c := newSSHCluster(t, "cpu:1")
	s := startTmux(t, t.TempDir(), 120, 32, hostsCommand(c, exe, "--agent-timeout 3s"))
	s.await(bothReadyRE, 90*time.Second)
	launchHosts(t, s)

	syscall.Kill(c.agentPID(1), syscall.SIGKILL)
	scr := s.await(regexp.MustCompile(`job failed`), 30*time.Second)
	t.Logf("after kill -9 of node 127.0.0.3's agent:\n%s", scr)
	if !strings.Contains(scr, "ranks: 1 stopped · 1 lost") || !strings.Contains(rankRow(scr, 1), "lost") || !strings.Contains(rankRow(scr, 0), "stopped") ||
		!strings.Contains(scr, "✗ node 127.0.0.3 lost") {
		t.Errorf("after the agent was killed:\n%s", scr)
	}
	c.awaitGone(t, time.Now(), 20*time.Second)
	s.keys("3")
	s.await(regexp.MustCompile(`(?s)\[ Launch \] +✗ off:.*127\.0\.0\.3 lost`), 10*time.Second)
	s.keys("1", "j", "R")
	s.await(bothReadyRE, 90*time.Second)
	s.keys("3")
	s.await(regexp.MustCompile(`\[ Launch \]   \(enter\)`), 10*time.Second)

	s.keys("q")
	s.await(exitRE, 30*time.Second)
	awaitNoProcess(t, exe, 10*time.Second)
}

// TestTUIHostsDropNode: small as dp4 on two sshd nodes (two CPU workers
// each), launched from the Job screen with Restarts 1 and Min nodes 2 set
// there; the second node's sshd, agent and workers are killed after step
// 12. Its ranks show lost, and stay lost through the restart, which
// cannot set the node up again and, with min nodes 2, fails; the banner
// offers D, which asks, drops the node, re-plans for the first node's two
// ranks (dp2, accumulating 2: the global batch kept) and resumes from its
// checkpoint. The job finishes with every step's loss that of the
// uninterrupted run (1e-5), and the UI exits 0.
func TestTUIHostsDropNode(t *testing.T) {
	long(t)
	t.Parallel() // its processes are its own: ownGPTUI
	exe := ownGPTUI(t)
	c := newSSHCluster(t, "cpu:2")
	want := uninterrupted(t)
	var args []string
	// The checkpoints in one folder both nodes reach (a shared
	// filesystem): the node kept holds the whole of each.
	for _, a := range restartArgs(t, filepath.Join(t.TempDir(), "shared-out")) {
		args = append(args, shellQuoteTest(a))
	}
	line := "HOME=" + shellQuoteTest(c.home) + " SSH_AUTH_SOCK= NO_COLOR=1 GPTUI_THREADS=1 " + shellQuoteTest(exe) +
		" --hosts " + shellQuoteTest(c.hosts) + " --agent-timeout 3s " + strings.Join(args, " ")
	s := startTmux(t, t.TempDir(), 140, 40, line)
	s.await(bothReadyRE, 90*time.Second)
	s.keys("3", "g", "j", "Enter", "BSpace", "1", "Enter", "j", "Enter", "BSpace", "2", "Enter")
	s.await(regexp.MustCompile(`(?s)Restarts   1 .*Min nodes  2 .*rank table: 4 ✓`), 10*time.Second)
	s.keys("G", "Enter")
	for deadline := time.Now().Add(120 * time.Second); headerStep(s.screen()) < 12; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no step 12 after 120 s:\n%s", s.screen())
		}
	}
	// The second node goes: its sshd first, so that the restart cannot
	// reach it, then its agent and workers.
	c.loseNode(t, 1)
	scr := s.await(regexp.MustCompile(`restart 1/1 from step \d+`), 60*time.Second)
	for r := 2; r < 4; r++ {
		if row := rankRow(scr, r); !strings.Contains(row, "lost") {
			t.Errorf("at the restart, rank %d's row %q, want lost:\n%s", r, row, scr)
		}
	}
	scr = s.await(regexp.MustCompile(`D drops 127\.0\.0\.3 and resumes on the nodes left`), 60*time.Second)
	t.Logf("the restart failed:\n%s", scr)
	flat := strings.Join(strings.Fields(scr), " ")
	if !strings.Contains(flat, "--min-nodes 2") || !strings.Contains(scr, "ranks: 2 stopped · 2 lost") {
		t.Errorf("after the restart failed:\n%s", scr)
	}
	for r := 2; r < 4; r++ {
		if row := rankRow(scr, r); !strings.Contains(row, "lost") {
			t.Errorf("rank %d's row %q, want lost", r, row)
		}
	}
	s.keys("D")
	s.await(regexp.MustCompile(`Drop 127\.0\.0\.3 and resume from the newest checkpoint on the nodes left \(1 node, 2 ranks: dp4 mb1 → dp2 mb1, accumulate 2`), 10*time.Second)
	s.keys("y")
	// The failed job's last attempt keeps its workdir locks for the
	// restart that did not come; the drop continues that job and takes
	// them over at once rather than waiting for them to expire.
	dropped := time.Now()
	s.await(regexp.MustCompile(`job (running|done)`), agent.LockLinger+30*time.Second)
	// (Waiting, it would resume about LockLinger after the failure, which
	// came a second or two before the drop.)
	if d := time.Since(dropped); d >= agent.LockLinger/2 {
		t.Errorf("the job resumed %.1f s after the drop: it waited for the failed job's locks (agent.LockLinger %v)", d.Seconds(), agent.LockLinger)
	} else {
		t.Logf("the job resumed %.1f s after the drop", d.Seconds())
	}
	scr = s.await(regexp.MustCompile(`job done`), 240*time.Second)
	t.Logf("after the drop:\n%s", scr)
	if !strings.Contains(scr, "ranks: 2 done") {
		t.Errorf("after the drop, the job's two ranks are not done:\n%s", scr)
	}
	// Rank 0's metrics: the steps before the resume, and those after.
	f, err := os.Open(filepath.Join(c.workdirs[0], "log", "metrics.0.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	ms, err := event.ReadMetrics(f.Name(), f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	got := map[int]float64{}
	for _, m := range ms {
		if m.EvalLoss == 0 {
			got[m.Step] = m.Loss
		}
	}
	compareLosses(t, got, want, 1, restartSteps)
	s.keys("q")
	scr = s.await(exitRE, 30*time.Second)
	if code := exitRE.FindStringSubmatch(scr)[1]; code != "0" {
		t.Errorf("gptui exited with status %s:\n%s", code, scr)
	}
	c.awaitGone(t, time.Now(), 10*time.Second)
	awaitNoProcess(t, exe, 10*time.Second)
}

func TestTUIArgs(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want bool
	}{
		{[]string{"--hosts", "h.txt"}, true},
		{[]string{"--preset", "tiny"}, true},
		{[]string{"-c", "tiny"}, true},
		{[]string{"train", "-c", "tiny"}, false},
		{[]string{"help"}, false},
		{[]string{"-h"}, false},
		{[]string{"--help"}, false},
		{nil, false}, // the tests' stdin and stdout are no terminal
	} {
		if got := wantsTUI(tt.args); got != tt.want {
			t.Errorf("wantsTUI(%q) = %v, want %v", tt.args, got, tt.want)
		}
	}

	// Bad input exits 2 with one line naming the mistake, before any UI.
	dir := t.TempDir()
	bad := filepath.Join(dir, "hosts.txt")
	os.WriteFile(bad, []byte("gpu0 devices=0-7\ngpu1 devices=0-x\n"), 0o644)
	good := filepath.Join(dir, "good.txt")
	os.WriteFile(good, []byte("gpu0 devices=0-7\ngpu1 devices=0-7\n"), 0o644)
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"--hosts", bad, "--preset", "tiny"}, []string{"hosts.txt:2", "0-x"}},
		{[]string{"--hosts", filepath.Join(dir, "none.txt")}, []string{"none.txt"}},
		{[]string{"--nproc", "0", "--preset", "tiny"}, []string{"--nproc 0"}},
		{[]string{"--preset", "tiny", "-c", "gpt2-124m"}, []string{"--preset or -c"}},
		{[]string{"--no-such-flag"}, []string{"no-such-flag"}},
		{[]string{"--min-nodes", "1", "--preset", "tiny"}, []string{"--min-nodes and --max-nodes need --hosts"}},
		{[]string{"--max-restarts", "-1", "--preset", "tiny"}, []string{"--max-restarts -1", "0 (never restart) or more"}},
		{[]string{"--hosts", good, "--min-nodes", "3"}, []string{"--min-nodes 3", "want 1 to 2"}},
	} {
		code, _, stderr := runCLI(t, tt.args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		last := lines[len(lines)-1]
		if code != 2 {
			t.Errorf("%q: exit %d, want 2 (%s)", tt.args, code, stderr)
		}
		for _, w := range tt.want {
			if !strings.Contains(last, w) {
				t.Errorf("%q: error %q lacks %q", tt.args, last, w)
			}
		}
	}
}
