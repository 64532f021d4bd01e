package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// The tests find the processes a job started on this machine through
// /proc: by their executable (a node's workdir, a test's own gptui) or
// their working directory (a local node's workdir).

// liveProcesses returns the pids of this machine's live processes (not
// zombies) whose /proc directory (/proc/PID) match accepts.
func liveProcesses(match func(proc string) bool) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if match(filepath.Join("/proc", e.Name())) && !zombie(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// zombie reports whether pid has exited but not been reaped.
func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z' || b[i+2] == 'X'
}

// describeProcess names pid for a failure's log: its parent, state,
// executable and arguments, as /proc gives them.
func describeProcess(pid int) string {
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	state, ppid := "?", "?"
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 {
		if f := bytes.Fields(stat[i+1:]); len(f) >= 2 {
			state, ppid = string(f[0]), string(f[1])
		}
	}
	return fmt.Sprintf("pid %d (parent %s, state %s) %s: %q", pid, ppid, state, exe, bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0}))
}

// rankWorker returns the worker of rank among pids: the process training
// with RANK=rank in its environment. It fails the test if there is none.
func rankWorker(t *testing.T, pids []int, rank int) int {
	t.Helper()
	for _, pid := range pids {
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if bytes.Contains(cmdline, []byte("train")) && bytes.Contains(append([]byte{0}, env...), []byte(fmt.Sprintf("\x00RANK=%d\x00", rank))) {
			return pid
		}
	}
	t.Fatalf("no worker of rank %d among %v", rank, pids)
	return 0
}

// awaitNone waits until list returns no process, up to limit from since,
// and returns how long from since that took; it fails the test, and kills
// them, if some remain (what names them: "processes of the job").
func awaitNone(t *testing.T, what string, list func() []int, since time.Time, limit time.Duration) time.Duration {
	t.Helper()
	for {
		left := list()
		if len(left) == 0 {
			return time.Since(since)
		}
		if time.Since(since) > limit {
			t.Errorf("%d %s remain %v after: %v", len(left), what, limit, left)
			for _, pid := range left {
				t.Logf("killing %s", describeProcess(pid))
				syscall.Kill(pid, syscall.SIGKILL)
			}
			return time.Since(since)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
