package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gptui/gptui/fence"
)

// One job per workdir: a job holds the lock of each node's workdir, the
// file LockFile there, for its lifetime. The holder is a process on the
// node (`gptui agent --lock`, see [HoldLock]) whose pid, start time, host
// and boot id the file records with the job's id, start time and command
// line. A lock whose holder is gone (no such process, another process under
// its pid, or a machine that has restarted since) is stale and is taken
// over; a live one refuses every other job, naming it.

// LockFile is the lock's file in a workdir.
const LockFile = "gptui.lock"

// LingerLine is what a launcher writes on a holder's standard input when a
// restart of the job follows: at the end of its input the holder then keeps
// the lock for LockLinger, or until the restart's holder takes it over,
// rather than releasing it, so that no other job takes the workdir between
// two attempts.
const LingerLine = "linger"

// LockLinger bounds how long a holder keeps the lock after a LingerLine
// and the end of its input.
const LockLinger = 30 * time.Second

// Holder is the content of a lock file (one JSON object): the job that
// holds the workdir and the process that holds the lock for it.
type Holder struct {
	Job      string    `json:"job"`               // the job's id (a restart's: <id>-r<n>)
	Owner    string    `json:"owner"`             // the job across its restarts: its first id
	Node     string    `json:"node,omitempty"`    // the node's name in the job's inventory
	Started  time.Time `json:"started"`           // when the job started
	Command  string    `json:"command"`           // the launcher's command line
	Launcher string    `json:"launcher"`          // the launcher's host name
	Host     string    `json:"host"`              // the host name of the holding process's machine
	BootID   string    `json:"boot_id,omitempty"` // that machine's boot id, where it has one
	PID      int       `json:"pid"`               // the holding process
	// PIDStart is the holding process's start time, in clock ticks after
	// boot (field 22 of /proc/<pid>/stat), so that another process that
	// got its pid is not taken for it.
	PIDStart uint64 `json:"pid_start,omitempty"`
	// Gen is the workdir's generation this holder took (package fence):
	// one more than any attempt's before, the token of the job's workers.
	Gen uint64 `json:"gen,omitempty"`
}

// String names the job and its holder: "job 20261121-201141-455c59,
// started 2026-11-21 20:11:41 CET, pid 4242 on node1: gptui run ...".
func (h *Holder) String() string {
	return fmt.Sprintf("job %s, started %s, pid %d on %s: %s", h.Job, h.Started.Format("2006-01-02 15:04:05 MST"), h.PID, h.Host, h.Command)
}

// ParseHolder parses a lock file's content; name is the file, for errors.
func ParseHolder(name string, b []byte) (*Holder, error) {
	var h Holder
	if err := json.Unmarshal(b, &h); err != nil || h.Job == "" || h.PID <= 0 || h.Host == "" {
		return nil, fmt.Errorf("%s is not a lock gptui wrote: remove it if no job runs in %s", name, filepath.Dir(name))
	}
	return &h, nil
}

// Machine is what a node says about itself and about a lock's holder,
// for [Holder.Stale].
type Machine struct {
	Host   string // its host name
	BootID string // its boot id (/proc/sys/kernel/random/boot_id); empty where it has none
	Proc   bool   // it has /proc, so that an empty Stat means no such process
	Stat   string // /proc/<the holder's pid>/stat; empty when there is no such process
}

// ThisMachine describes this machine, with the /proc/<pid>/stat of pid.
func ThisMachine(pid int) Machine {
	var m Machine
	m.Host, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		m.BootID = strings.TrimSpace(string(b))
	}
	if _, err := os.Stat("/proc/self/stat"); err == nil {
		m.Proc = true
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
			m.Stat = string(b)
		}
	}
	return m
}

// ThisProcess returns this process as a Holder names a process: its pid,
// its start time, its machine's host name and boot id (the job's fields
// left empty). [Holder.Stale] tells whether a process so named still
// runs; a detached job's supervisor record (package jobdir) names its
// process so too.
func ThisProcess() Holder {
	self := ThisMachine(os.Getpid())
	h := Holder{PID: os.Getpid(), Host: self.Host, BootID: self.BootID}
	if st, ok := parseStat(self.Stat); ok {
		h.PIDStart = st.start
	}
	return h
}

// Stale says why the lock h is stale on the machine m, the machine that
// holds the workdir, or returns "" if its holder may still run: its
// machine has restarted since (another boot id), its process is gone (no
// such pid, or a zombie), or its pid is another process's now (another
// start time). A holder on another machine (a workdir on a shared
// filesystem) cannot be checked, and counts as running.
func (h *Holder) Stale(m Machine) string {
	switch {
	case h.Host != m.Host:
		return ""
	case h.BootID != "" && m.BootID != "" && h.BootID != m.BootID:
		return "its machine has restarted since"
	case !m.Proc:
		return ""
	case m.Stat == "":
		return fmt.Sprintf("its process %d is gone", h.PID)
	}
	st, ok := parseStat(m.Stat)
	switch {
	case !ok:
		return ""
	case st.state == 'Z' || st.state == 'X':
		return fmt.Sprintf("its process %d is gone", h.PID)
	case h.PIDStart != 0 && st.start != h.PIDStart:
		return fmt.Sprintf("its pid %d is another process's now", h.PID)
	}
	return ""
}

// HeldError is the refusal of a lock that another job holds.
type HeldError struct {
	Dir    string // the workdir, as the launcher names it
	Holder Holder // the job that holds it
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("workdir %s is in use by %s; wait for that job to end or stop it, or give this job a workdir of its own (workdir= in the inventory; for --nproc, another directory)", e.Dir, e.Holder.String())
}

// Lock is a workdir's lock, taken by AcquireLock.
type Lock struct {
	dir string
	me  Holder
	// Joined is set when another node of the same job (a workdir shared
	// between nodes) held the lock already: Release leaves it to that
	// node's holder.
	Joined bool
	// TookOver describes the lock that was taken over, if any: a stale
	// one, or an earlier attempt's of this job.
	TookOver string
}

// AcquireLock takes the lock of the workdir dir for the job of want, with
// this process as its holder (AcquireLock fills in PID, PIDStart, Host and
// BootID). It returns a *HeldError when another job's live holder has it.
// The lock is the job's already when a holder of the same Owner has it:
// that of another attempt is taken over, that of the same attempt (another
// node sharing the workdir) joined.
func AcquireLock(dir string, want Holder) (*Lock, error) {
	self := ThisProcess()
	want.PID, want.PIDStart, want.Host, want.BootID = self.PID, self.PIDStart, self.Host, self.BootID
	unguard, err := guard(dir)
	if err != nil {
		return nil, err
	}
	defer unguard()
	path := filepath.Join(dir, LockFile)
	cur, err := readHolder(path)
	if err != nil {
		return nil, err
	}
	l := &Lock{dir: dir, me: want}
	if cur != nil {
		why := cur.Stale(ThisMachine(cur.PID))
		switch {
		case cur.Owner == want.Owner && cur.Job == want.Job && why == "":
			l.Joined = true
			l.me.Gen = cur.Gen
			return l, nil
		case cur.Owner == want.Owner:
			l.TookOver = fmt.Sprintf("job %s's own lock of %s", cur.Job, cur.Started.Format("15:04:05"))
		case why != "":
			l.TookOver = fmt.Sprintf("the stale lock of %s (%s)", cur.String(), why)
		default:
			return nil, &HeldError{Dir: dir, Holder: *cur}
		}
	}
	// A new attempt in the workdir: a new generation, which outdates the
	// tokens of every earlier attempt's workers (package fence).
	if want.Gen, err = fence.Next(dir); err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	l.me = want
	return l, writeHolder(path, &want)
}

// ReadLock returns the holder of dir's lock that Stale does not find
// stale, or nil when there is none; it changes nothing.
func ReadLock(dir string) (*Holder, error) {
	h, err := readHolder(filepath.Join(dir, LockFile))
	if err != nil || h == nil || h.Stale(ThisMachine(h.PID)) != "" {
		return nil, err
	}
	return h, nil
}

// Holder returns what the lock file says of this holder.
func (l *Lock) Holder() Holder { return l.me }

// owned reports whether the lock file still names this holder.
func (l *Lock) owned() bool {
	cur, err := readHolder(filepath.Join(l.dir, LockFile))
	return err == nil && cur != nil && cur.PID == l.me.PID && cur.Host == l.me.Host && cur.Job == l.me.Job
}

// Release removes the lock file if it still names this holder.
func (l *Lock) Release() error {
	if l.Joined {
		return nil
	}
	unguard, err := guard(l.dir)
	if err != nil {
		return err
	}
	defer unguard()
	if !l.owned() {
		return nil
	}
	return os.Remove(filepath.Join(l.dir, LockFile))
}

// readHolder reads the lock file at path: nil when there is none.
func readHolder(path string) (*Holder, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	return ParseHolder(path, b)
}

// writeHolder replaces the lock file at path by h, atomically: a reader
// sees the old holder or the new one, whole.
func writeHolder(path string, h *Holder) error {
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	tmp := path + ".tmp-" + strconv.Itoa(os.Getpid())
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("lock: %w", err)
	}
	return nil
}

// guardTimeout bounds the wait for another process's check of the lock.
const guardTimeout = 5 * time.Second

// LockReply is what `gptui agent --lock` answers, one JSON line, once it
// has tried to take the lock.
type LockReply struct {
	Locked   bool    `json:"locked"`              // the job holds the lock
	Joined   bool    `json:"joined,omitempty"`    // another node of the job held it already
	TookOver string  `json:"took_over,omitempty"` // the lock taken over, described
	Holder   *Holder `json:"holder,omitempty"`    // the job that holds it, when refused
	Gen      uint64  `json:"gen,omitempty"`       // the workdir's generation the job took (package fence)
	Error    string  `json:"error,omitempty"`     // why it could not be taken otherwise
}

// HoldLock is `gptui agent --lock`: it reads the job's Holder (one JSON
// line) from stdin, takes the lock of the workdir dir for it, answers with
// a LockReply line on stdout and, if it took the lock, holds it until
// stdin ends or ctx does, then releases it. A LingerLine on stdin before
// its end keeps the lock for LockLinger more, or until another attempt of
// the job takes it over.
func HoldLock(ctx context.Context, dir string, stdin io.Reader, stdout io.Writer) error {
	in := bufio.NewReader(io.LimitReader(stdin, 1<<20))
	line, err := in.ReadBytes('\n')
	if err != nil && len(line) == 0 {
		return errors.New("agent: --lock: no job on standard input (one JSON line)")
	}
	var want Holder
	if err := json.Unmarshal(bytes.TrimSpace(line), &want); err != nil || want.Job == "" {
		return fmt.Errorf("agent: --lock: the job on standard input: %v", err)
	}
	if want.Owner == "" {
		want.Owner = want.Job
	}
	l, err := AcquireLock(dir, want)
	var reply LockReply
	var held *HeldError
	switch {
	case errors.As(err, &held):
		reply.Holder = &held.Holder
	case err != nil:
		reply.Error = err.Error()
	default:
		reply.Locked, reply.Joined, reply.TookOver, reply.Gen = true, l.Joined, l.TookOver, l.me.Gen
	}
	b, _ := json.Marshal(reply)
	if _, werr := stdout.Write(append(b, '\n')); werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		if l != nil {
			l.Release()
		}
		return err
	}

	// Hold it until the launcher is done with it.
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	linger := false
wait:
	for {
		select {
		case <-ctx.Done():
			return l.Release()
		case s, ok := <-lines:
			if !ok {
				break wait
			}
			if s == LingerLine {
				linger = true
			}
		}
	}
	if linger {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		until := time.After(LockLinger)
	lingering:
		for l.owned() {
			select {
			case <-ctx.Done():
				break lingering
			case <-until:
				break lingering
			case <-tick.C:
			}
		}
	}
	return l.Release()
}
