package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"github.com/gptui/gptui/fence"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// deadPID returns the pid of a process that has exited.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// writeLock writes h as dir's lock file.
func writeLock(t *testing.T, dir string, h Holder) {
	t.Helper()
	if err := writeHolder(filepath.Join(dir, LockFile), &h); err != nil {
		t.Fatal(err)
	}
}

func lockHolderOf(t *testing.T, dir string) *Holder {
	t.Helper()
	h, err := readHolder(filepath.Join(dir, LockFile))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestLock: a second job is refused while the first holds the workdir,
// naming it; released, the workdir is free. A stale lock (its process
// gone, its machine restarted, its pid another process's) is taken over;
// a live one of another machine is not. A lock of the same job is joined
// (same attempt) or taken over (a restart).
func TestLock(t *testing.T) {
	started := time.Date(2026, 11, 21, 20, 11, 41, 0, time.UTC)
	a := Holder{Job: "job-a", Owner: "job-a", Node: "n1", Started: started, Command: "gptui run --hosts h.txt -c a.yaml"}
	b := Holder{Job: "job-b", Owner: "job-b", Node: "n1", Started: started, Command: "gptui run --hosts h.txt -c b.yaml"}
	dir := t.TempDir()
	la, err := AcquireLock(dir, a)
	if err != nil || la.Joined || la.TookOver != "" {
		t.Fatalf("AcquireLock of a free workdir = %+v, %v", la, err)
	}
	if h := lockHolderOf(t, dir); h == nil || h.PID != os.Getpid() || h.Job != "job-a" || h.BootID == "" || h.PIDStart == 0 {
		t.Fatalf("the lock file holds %+v", h)
	}
	_, err = AcquireLock(dir, b)
	var held *HeldError
	if !errors.As(err, &held) {
		t.Fatalf("a second job: %v, want a *HeldError", err)
	}
	host, _ := os.Hostname()
	if want := "workdir " + dir + " is in use by job job-a, started 2026-11-21 20:11:41 UTC, pid "; !strings.HasPrefix(err.Error(), want) ||
		!strings.Contains(err.Error(), " on "+host+": gptui run --hosts h.txt -c a.yaml; wait for that job to end or stop it, or give this job a workdir of its own") {
		t.Errorf("refusal %q, want it to start %q and name the command", err, want)
	}
	if h, err := ReadLock(dir); err != nil || h == nil || h.Job != "job-a" {
		t.Errorf("ReadLock = %+v, %v; want job-a's", h, err)
	}
	// Another node of job a in the same workdir joins; a restart of it
	// takes over.
	if l, err := AcquireLock(dir, a); err != nil || !l.Joined {
		t.Errorf("the same job again: %+v, %v; want joined", l, err)
	} else if err := l.Release(); err != nil || lockHolderOf(t, dir) == nil {
		t.Errorf("releasing a joined lock removed it (%v)", err)
	}
	restart := a
	restart.Job = "job-a-r1"
	lr, err := AcquireLock(dir, restart)
	if err != nil || !strings.Contains(lr.TookOver, "job job-a's own lock") {
		t.Errorf("a restart of job a: %+v, %v; want a takeover", lr, err)
	}
	if err := la.Release(); err != nil || lockHolderOf(t, dir).Job != "job-a-r1" {
		t.Errorf("the first attempt's release removed the restart's lock (%v)", err)
	}
	if err := lr.Release(); err != nil || lockHolderOf(t, dir) != nil {
		t.Errorf("after release the lock file is still there (%v)", err)
	}
	if h, err := ReadLock(dir); h != nil || err != nil {
		t.Errorf("ReadLock of a free workdir = %+v, %v", h, err)
	}

	self := ThisMachine(os.Getpid())
	our, _ := parseStat(self.Stat)
	ourStart := our.start
	for _, tc := range []struct {
		name   string
		holder func(h *Holder)
		stale  string // what TookOver must say; "" when refused
	}{
		{"dead pid", func(h *Holder) { h.PID = deadPID(t) }, "(its process "},
		{"another boot", func(h *Holder) { h.BootID = "0b5e1e7e-0000-4000-8000-000000000000" }, "(its machine has restarted since)"},
		{"pid reused", func(h *Holder) { h.PIDStart = ourStart + 1 }, "is another process's now)"},
		{"live", func(h *Holder) {}, ""},
		{"another machine", func(h *Holder) { h.Host, h.PID = "elsewhere", deadPID(t) }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			old := a
			old.PID, old.PIDStart, old.Host, old.BootID = os.Getpid(), ourStart, self.Host, self.BootID
			tc.holder(&old)
			writeLock(t, dir, old)
			l, err := AcquireLock(dir, b)
			if tc.stale == "" {
				if !errors.As(err, &held) || held.Holder.Job != "job-a" {
					t.Fatalf("AcquireLock over a live lock = %+v, %v; want job-a's *HeldError", l, err)
				}
				return
			}
			if err != nil || !strings.HasPrefix(l.TookOver, "the stale lock of job job-a, started ") || !strings.HasSuffix(l.TookOver, tc.stale) && !strings.Contains(l.TookOver, tc.stale) {
				t.Fatalf("AcquireLock over a stale lock = %+v, %v; want a takeover saying %q", l, err, tc.stale)
			}
			if h := lockHolderOf(t, dir); h.Job != "job-b" || h.PID != os.Getpid() {
				t.Errorf("after the takeover the lock holds %+v", h)
			}
		})
	}

	// A file gptui did not write is named, not taken over.
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, LockFile), []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := AcquireLock(bad, b); err == nil || err.Error() != filepath.Join(bad, LockFile)+" is not a lock gptui wrote: remove it if no job runs in "+bad {
		t.Errorf("AcquireLock over a foreign file: %v", err)
	}
}

// holdLock runs HoldLock on dir for h and returns its answer, the pipe to
// its standard input and its result.
func holdLock(t *testing.T, ctx context.Context, dir string, h Holder) (LockReply, io.WriteCloser, chan error) {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- HoldLock(ctx, dir, inR, outW); outW.Close() }()
	b, _ := json.Marshal(h)
	if _, err := inW.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(outR).ReadBytes('\n')
	go io.Copy(io.Discard, outR)
	var r LockReply
	if err != nil || json.Unmarshal(line, &r) != nil {
		t.Fatalf("HoldLock's answer %q: %v", line, err)
	}
	return r, inW, done
}

// TestHoldLock: the holder answers, holds the lock until its input ends
// and then releases it; with a LingerLine it keeps it until the job's
// restart takes it over; a refusal names the holder.
func TestHoldLock(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	a := Holder{Job: "job-a", Command: "gptui run a"}
	r, in, done := holdLock(t, ctx, dir, a)
	if !r.Locked || lockHolderOf(t, dir) == nil {
		t.Fatalf("answer %+v; the lock file: %+v", r, lockHolderOf(t, dir))
	}
	r2, in2, done2 := holdLock(t, ctx, dir, Holder{Job: "job-b", Command: "gptui run b"})
	in2.Close()
	if r2.Locked || r2.Holder == nil || r2.Holder.Job != "job-a" || r2.Holder.Command != "gptui run a" {
		t.Errorf("a second job's answer %+v, want a refusal naming job-a", r2)
	}
	if err := <-done2; err == nil {
		t.Error("HoldLock of a refused job returned nil")
	}
	in.Close()
	if err := <-done; err != nil || lockHolderOf(t, dir) != nil {
		t.Fatalf("after the end of its input: %v; the lock file: %+v", err, lockHolderOf(t, dir))
	}

	// Lingering for a restart, which takes it over.
	_, in, done = holdLock(t, ctx, dir, a)
	in.Write([]byte(LingerLine + "\n"))
	in.Close()
	select {
	case err := <-done:
		t.Fatalf("the lingering holder returned at once: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if h := lockHolderOf(t, dir); h == nil || h.Job != "job-a" {
		t.Fatalf("a lingering holder's lock: %+v", h)
	}
	restart := a
	restart.Job, restart.Owner = "job-a-r1", "job-a"
	r, in, done3 := holdLock(t, ctx, dir, restart)
	if !r.Locked || r.TookOver == "" {
		t.Fatalf("the restart's answer %+v, want a takeover", r)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the lingering holder: %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the lingering holder did not end after the takeover")
	}
	if h := lockHolderOf(t, dir); h == nil || h.Job != "job-a-r1" {
		t.Errorf("after the lingering holder ended, the lock holds %+v, want the restart's", h)
	}
	in.Close()
	if err := <-done3; err != nil || lockHolderOf(t, dir) != nil {
		t.Errorf("the restart's holder: %v; the lock file: %+v", err, lockHolderOf(t, dir))
	}
}

// FuzzParseHolder: any lock file content parses or is refused with its
// name, and never panics.
func FuzzParseHolder(f *testing.F) {
	f.Add([]byte(`{"job":"j","owner":"j","started":"2026-01-02T03:04:05Z","command":"c","launcher":"l","host":"h","pid":1}`))
	f.Add([]byte("{}"))
	f.Add([]byte(`{"job":"j","pid":-1,"host":"h"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHolder("w/gptui.lock", b)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "w/gptui.lock is not a lock gptui wrote") {
				t.Fatalf("error %q", err)
			}
			return
		}
		if h.Job == "" || h.PID <= 0 || h.Host == "" {
			t.Fatalf("accepted %+v", h)
		}
		h.Stale(Machine{Host: h.Host, Proc: true, Stat: string(b)})
	})
}

// TestLockGenerations: each attempt that takes a workdir gets the next
// generation (package fence), never reused after a release; another node
// of the same attempt joining shares its generation.
func TestLockGenerations(t *testing.T) {
	dir := t.TempDir()
	a := Holder{Job: "job-a", Owner: "job-a", Started: time.Now(), Command: "gptui run"}
	l1, err := AcquireLock(dir, a)
	if err != nil || l1.Holder().Gen != 1 {
		t.Fatalf("first attempt: %+v, %v; want generation 1", l1, err)
	}
	if j, err := AcquireLock(dir, a); err != nil || !j.Joined || j.Holder().Gen != 1 {
		t.Fatalf("another node of the attempt: %+v, %v; want joined at generation 1", j, err)
	}
	r := a
	r.Job = "job-a-r1"
	l2, err := AcquireLock(dir, r)
	if err != nil || l2.Holder().Gen != 2 || lockHolderOf(t, dir).Gen != 2 {
		t.Fatalf("the restart: %+v, %v; want generation 2 in the lock file", l2, err)
	}
	if err := (&fence.Token{Dir: dir, Gen: 1}).Check(); err == nil {
		t.Error("the first attempt's token still checks after the restart took the workdir")
	}
	l2.Release()
	l1.Release()
	b := Holder{Job: "job-b", Owner: "job-b", Started: time.Now(), Command: "gptui run"}
	l3, err := AcquireLock(dir, b)
	if err != nil || l3.Holder().Gen != 3 {
		t.Fatalf("the next job after release: %+v, %v; want generation 3", l3, err)
	}
	l3.Release()
}
