package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gptui/gptui/jobdir"
)

// TestFrozenAgent: two sshd nodes, small as dp4; the second node's agent
// is frozen (SIGSTOP) for 8 s, past the 5 s agent timeout the job is
// given (not the default 10 s: every worker trains flat out while the
// test waits), while its workers train on. The node is shown with a
// silent agent whose ranks train on (the first node's ranks, in step with
// them, keep advancing), never lost, in the headless lines and on the
// dashboard of 'gptui attach' in a terminal; once the agent answers again
// (SIGCONT) the dashboard says so no more, and the job goes on and ends
// when stopped, not failed.
func TestFrozenAgent(t *testing.T) {
	long(t)
	t.Parallel() // its processes are those of its own workdirs (c.jobProcesses)
	c := newSSHCluster(t, "cpu:2")
	var stdout, stderr syncBuffer
	const timeout, freeze = 5 * time.Second, 8 * time.Second
	args := append([]string{"--show-ranks", "0", "--agent-timeout", timeout.String()}, restartArgs(t, "output")...)
	args = append(args, "-o", "Engine.max_steps=1000000", "-o", "Engine.save_load.save_steps=0", "-o", "Engine.logging_freq=10")
	job := c.start(t, &stdout, &stderr, args...)
	job.awaitLine(t, stdout.await("/0] [train] epoch: 0 step: 20 "), "step 20", 120*time.Second)
	agent := -1
	for _, pid := range c.jobProcesses() {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		cmd := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if len(cmd) == 2 && cmd[1] == "agent" && strings.HasPrefix(exe, c.workdirs[1]) {
			agent = pid
		}
	}
	if agent < 0 {
		t.Fatal("no agent process of the second node")
	}
	// The lines come close together: polled, not awaited one at a time.
	waitFor := func(what, s string, limit time.Duration) {
		t.Helper()
		for deadline := time.Now().Add(limit); !strings.Contains(stdout.String(), s); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %s after %v:\n%s%s", what, limit, stdout.String(), stderr.String())
			}
		}
	}
	// The dashboard, in a terminal: gptui attach on the job.
	wd, _ := os.Getwd()
	ui := startTmux(t, wd, 140, 40, "HOME="+shellQuoteTest(c.home)+" NO_COLOR=1 "+shellQuoteTest(builtGPTUI(t))+" attach "+c.jobID(t))
	ui.await(regexp.MustCompile(`ranks: 4 running`), 30*time.Second)

	syscall.Kill(agent, syscall.SIGSTOP)
	frozen := time.Now()
	waitFor("silent agent", "[127.0.0.3] agent-silent: its agent has been silent for ", 10*time.Second)
	waitFor("ranks training on", ", but its ranks train on: the other nodes' ranks, which move in step with them, have reached step ", 20*time.Second)
	// On the screen: the node's agent silent, its ranks training — all
	// four running, none silent or lost — and the steps going on.
	scr := ui.await(regexp.MustCompile(`agent silent: its ranks train on`), 10*time.Second)
	before := headerStep(scr)
	time.Sleep(time.Until(frozen.Add(freeze)))
	scr = ui.screen()
	if !strings.Contains(scr, "ranks: 4 running") || strings.Contains(scr, "lost") || headerStep(scr) <= before {
		t.Errorf("%v into the agent's freeze (timeout %v), the dashboard (step %d before):\n%s", freeze, timeout, before, scr)
	}
	syscall.Kill(agent, syscall.SIGCONT)
	waitFor("agent back", "[127.0.0.3] agent-back: its agent answers again, after ", 10*time.Second)
	for deadline := time.Now().Add(10 * time.Second); strings.Contains(scr, "agent silent"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("10 s after the agent answered again, the dashboard still says it is silent:\n%s", scr)
			break
		}
		scr = ui.screen()
	}
	job.cmd.Process.Signal(syscall.SIGINT)
	err := job.wait(t, 120*time.Second, "the interrupt")
	out := stdout.String() + stderr.String()
	if strings.Contains(out, "lost:") || strings.Contains(out, "[job] failed") {
		t.Errorf("the node with a frozen agent was lost, or the job failed:\n%s", out)
	}
	if !strings.Contains(out, "[job] stopped") {
		t.Errorf("exit %d, no [job] stopped:\n%s", exitStatus(err), out)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "agent-") {
			t.Log(l)
		}
	}
}

// jobID returns the id of the job folder (in the current directory) of
// the job started on c's nodes.
func (c *sshCluster) jobID(t *testing.T) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		dirs, _ := filepath.Glob(filepath.Join(jobdir.Root, "*"))
		for _, d := range dirs {
			if j, err := jobdir.Read(d); err == nil && j.Spec.Hosts == c.hosts {
				return j.ID
			}
		}
	}
	t.Fatalf("no job folder of the job on %s", c.hosts)
	return ""
}
