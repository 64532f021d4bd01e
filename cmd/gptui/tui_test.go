package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
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
	s := &tmuxSession{t: t, socket: fmt.Sprintf("gptui-test-%d-%d", os.Getpid(), time.Now().UnixNano())}
	// The shell line prints the exit status and keeps the pane open, so the
	// test can read it after the UI has left the alternate screen.
	line := fmt.Sprintf("cd %s && %s; echo gptui-exit=$?; sleep 600", shellQuoteTest(dir), command)
	s.tmux("new-session", "-d", "-s", "ui", "-x", strconv.Itoa(w), "-y", strconv.Itoa(h), line)
	t.Cleanup(func() { exec.Command(tmuxPath, "-L", s.socket, "kill-server").Run() })
	return s
}

func (s *tmuxSession) tmux(args ...string) string {
	s.t.Helper()
	out, err := exec.Command(tmuxPath, append([]string{"-L", s.socket, "-f", "/dev/null"}, args...)...).CombinedOutput()
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
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && p == exe {
			if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
				if i := strings.LastIndexByte(string(stat), ')'); i > 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X') {
					continue
				}
			}
			pids = append(pids, pid)
		}
	}
	return pids
}

// awaitNoProcess waits for every process running exe to end; it fails the
// test, and kills them, if some remain after limit.
func awaitNoProcess(t *testing.T, exe string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		left := processesOf(exe)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d gptui processes remain %v after quitting: %v", len(left), limit, left)
			for _, pid := range left {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var (
	lossRE    = regexp.MustCompile(`step \d+/\d+  loss \d+\.\d{4}`)
	memBarRE  = regexp.MustCompile(`(?m)^.*  r[0-3] +[█░]+ \d+M/\d+\.\dG`)
	logTailRE = regexp.MustCompile(`(?m)^ \[train\] epoch: \d+ step: \d+ lr: \S+ loss: \d+\.\d+`)
	exitRE    = regexp.MustCompile(`gptui-exit=(\d+)`)
)

// TestTUILocal runs 'gptui --nproc 2 --preset tiny' in tmux: it launches
// the job from the Job screen, waits for a loss in the dashboard, checks
// the memory bars and the log tail, quits with q (confirmed with y) and
// checks that no worker remains.
func TestTUILocal(t *testing.T) {
	exe := builtGPTUI(t)
	dir := t.TempDir()
	cmd := "NO_COLOR=1 GPTUI_THREADS=1 " + shellQuoteTest(exe) + " --nproc 2 --preset tiny" +
		" -o Distributed.dp_degree=2 -o Global.local_batch_size=4 -o Global.micro_batch_size=4" +
		" -o Engine.max_steps=100000 -o Engine.logging_freq=2"
	s := startTmux(t, dir, 100, 30, cmd)

	s.await(regexp.MustCompile(`dp 2 × sharding 1 \(stage 1\) × mp 1 × pp 1 = 2 ranks · rank table: 2 ✓`), 30*time.Second)
	// The planner's ranked table for 2 CPU workers.
	s.await(regexp.MustCompile(`(?s)✓ fits: config's strategy dp2 mb4: .*strategy \(\*: config's\).* 1  \S.*\d+ feasible, \d+ rejected`), 10*time.Second)
	s.keys("Enter") // the Launch row is selected
	scr := s.await(lossRE, 120*time.Second)
	// Memory is sampled each second; the log shows rank 0's steps.
	scr = s.await(memBarRE, 20*time.Second)
	scr = s.await(logTailRE, 20*time.Second)
	if !strings.Contains(scr, "ranks: 2 running") || !strings.Contains(scr, "Log  rank 0 on localhost · follow") {
		t.Errorf("the dashboard lacks the ranks' states or the log pane:\n%s", scr)
	}
	if strings.Contains(scr, "\x1b") {
		t.Errorf("escape sequences on screen with NO_COLOR")
	}
	if len(processesOf(exe)) < 3 {
		t.Errorf("expected the UI and two workers running, found %v", processesOf(exe))
	}
	if _, err := os.Stat(filepath.Join(dir, "rank_table.json")); err != nil {
		t.Errorf("the launch did not write the rank table: %v", err)
	}

	s.keys("q")
	s.await(regexp.MustCompile(`A job is running: stop it and quit\? \[y/N\]`), 10*time.Second)
	s.keys("y")
	scr = s.await(exitRE, 30*time.Second)
	if code := exitRE.FindStringSubmatch(scr)[1]; code != "0" {
		t.Errorf("gptui exited with status %s:\n%s", code, scr)
	}
	awaitNoProcess(t, exe, 10*time.Second)
}

// TestTUIHosts runs 'gptui --hosts FILE --preset tiny' in tmux against two
// sshd nodes on 127.0.0.2 and 127.0.0.3 with one CPU worker each: the
// nodes screen shows both probed and ready, the job is launched from the
// Job screen, a loss, the memory bars and a log tail show in the
// dashboard, and q (confirmed) stops it: no agent or worker remains on
// either node, and the UI exits 0.
func TestTUIHosts(t *testing.T) {
	exe := builtGPTUI(t)
	c := newSSHCluster(t, "cpu:1")
	dir := t.TempDir()
	cmd := "HOME=" + shellQuoteTest(c.home) + " SSH_AUTH_SOCK= NO_COLOR=1 GPTUI_THREADS=1 " + shellQuoteTest(exe) +
		" --hosts " + shellQuoteTest(c.hosts) + " --preset tiny" +
		" -o Distributed.dp_degree=2 -o Global.local_batch_size=4 -o Global.micro_batch_size=4" +
		" -o Engine.max_steps=100000 -o Engine.logging_freq=2"
	s := startTmux(t, dir, 120, 32, cmd)

	scr := s.await(regexp.MustCompile(`(?s)127\.0\.0\.2 .* ready .*127\.0\.0\.3 .* ready `), 90*time.Second)
	if !strings.Contains(scr, "[1 Nodes]") || strings.Contains(scr, "failed") {
		t.Errorf("the nodes screen:\n%s", scr)
	}
	s.keys("3")
	s.await(regexp.MustCompile(`dp 2 × sharding 1 \(stage 1\) × mp 1 × pp 1 = 2 ranks · rank table: 2 ✓`), 10*time.Second)
	s.keys("Enter")
	s.await(lossRE, 120*time.Second)
	s.await(memBarRE, 20*time.Second)
	scr = s.await(logTailRE, 20*time.Second)
	t.Logf("the dashboard:\n%s", scr)
	if !strings.Contains(scr, "ranks: 2 running") || !strings.Contains(scr, "Log  rank 0 on 127.0.0.2 · follow") {
		t.Errorf("the dashboard lacks the ranks' states or the log pane:\n%s", scr)
	}
	if n := len(c.jobProcesses()); n < 4 {
		t.Errorf("expected two agents and two workers on the nodes, found %d processes", n)
	}

	s.keys("q")
	s.await(regexp.MustCompile(`A job is running: stop it and quit\? \[y/N\]`), 10*time.Second)
	s.keys("y")
	quit := time.Now()
	scr = s.await(exitRE, 30*time.Second)
	if code := exitRE.FindStringSubmatch(scr)[1]; code != "0" {
		t.Errorf("gptui exited with status %s:\n%s", code, scr)
	}
	c.awaitGone(t, quit, 10*time.Second)
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
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"--hosts", bad, "--preset", "tiny"}, []string{"hosts.txt:2", "0-x"}},
		{[]string{"--hosts", filepath.Join(dir, "none.txt")}, []string{"none.txt"}},
		{[]string{"--nproc", "0", "--preset", "tiny"}, []string{"--nproc 0"}},
		{[]string{"--preset", "tiny", "-c", "gpt2-124m"}, []string{"--preset or -c"}},
		{[]string{"--no-such-flag"}, []string{"no-such-flag"}},
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
