package jobdir

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Supervisor is the process that runs a job (supervisor.json): the facts
// that tell it from any later process of the same id.
type Supervisor struct {
	PID int `json:"pid"`
	// Boot is the machine's boot id when it started
	// (/proc/sys/kernel/random/boot_id): a pid of another boot is not it.
	Boot string `json:"boot,omitempty"`
	// Start is its start time in clock ticks after boot (the 22nd field of
	// /proc/PID/stat): another process given the same pid later has
	// another.
	Start uint64 `json:"start,omitempty"`
	// Socket is the path of its control socket.
	Socket  string    `json:"socket"`
	Started time.Time `json:"started"`
}

// Alive reports whether the supervisor still runs: a process of its pid,
// started when it was, in this boot of the machine.
func (s Supervisor) Alive() bool {
	if s.PID <= 0 {
		return false
	}
	return processIs(s.PID, s.Boot, s.Start)
}

// Self returns the record of this process as the supervisor of the job,
// listening on socket.
func Self(socket string) Supervisor {
	boot, start := identity(os.Getpid())
	return Supervisor{PID: os.Getpid(), Boot: boot, Start: start, Socket: socket, Started: time.Now()}
}

// WriteSupervisor writes s as the folder's supervisor.json.
func WriteSupervisor(dir string, s Supervisor) error {
	return writeJSON(filepath.Join(dir, SupervisorFile), s)
}

// LaunchTimeout bounds how long Launch waits for the supervisor to be up.
const LaunchTimeout = 30 * time.Second

// Launch starts the supervisor of the job in the folder dir, exe
// SuperviseCommand dir, detached from any terminal: in a session of its
// own (setsid), its standard input /dev/null, its standard output and
// error appended to the folder's output.log, its working directory the
// spec's Dir. It returns once the supervisor has written its record and
// listens on its control socket; if it exits first, or is not up within
// LaunchTimeout, the error has the end of its output. exe empty means this
// executable.
func Launch(dir, exe string) (Supervisor, error) {
	spec, err := ReadSpec(dir)
	if err != nil {
		return Supervisor{}, err
	}
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return Supervisor{}, fmt.Errorf("jobdir: the gptui executable: %w", err)
		}
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return Supervisor{}, fmt.Errorf("jobdir: %w", err)
	}
	out, err := os.OpenFile(filepath.Join(dir, OutputFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return Supervisor{}, fmt.Errorf("jobdir: %w", err)
	}
	defer out.Close()
	before, _ := out.Seek(0, 2)
	var old Supervisor
	_ = readJSON(filepath.Join(dir, SupervisorFile), &old)
	cmd := exec.Command(exe, SuperviseCommand, abs)
	cmd.Dir = spec.Dir
	cmd.Stdout, cmd.Stderr = out, out // stdin: /dev/null
	cmd.SysProcAttr = detachedSysProcAttr()
	if err := cmd.Start(); err != nil {
		return Supervisor{}, fmt.Errorf("jobdir: starting the supervisor: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // reaps it, should it end while we run
	deadline := time.After(LaunchTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var s Supervisor
		if readJSON(filepath.Join(dir, SupervisorFile), &s) == nil && s.PID == cmd.Process.Pid && s != old {
			return s, nil
		}
		select {
		case err := <-exited:
			return Supervisor{}, fmt.Errorf("the job's supervisor exited (%v) before it was up: %s", err, tail(filepath.Join(dir, OutputFile), before))
		case <-deadline:
			return Supervisor{}, fmt.Errorf("the job's supervisor (pid %d) is not up after %v: %s", cmd.Process.Pid, LaunchTimeout, tail(filepath.Join(dir, OutputFile), before))
		case <-tick.C:
		}
	}
}

// tail returns the last lines of what path holds past offset from, on
// one line.
func tail(path string, from int64) string {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) <= from {
		return "it printed nothing (" + path + ")"
	}
	lines := strings.Split(strings.TrimSpace(string(b[from:])), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, " / ")
}

// identity returns this boot's id and the start time of process pid;
// empty and 0 where the system does not say (not Linux).
func identity(pid int) (boot string, start uint64) {
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		boot = string(bytes.TrimSpace(b))
	}
	start, _ = startTime(pid)
	return boot, start
}

// startTime returns the start time of process pid in clock ticks after
// boot, from /proc/PID/stat.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStartTime(b)
}

// parseStartTime returns the 22nd field of a /proc/PID/stat line: the
// fields after the command name, which is in parentheses and may hold
// anything, start with the 3rd.
func parseStartTime(stat []byte) (uint64, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("jobdir: /proc stat line without a command")
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 20 {
		return 0, errors.New("jobdir: /proc stat line too short")
	}
	var v uint64
	if _, err := fmt.Sscan(f[19], &v); err != nil {
		return 0, fmt.Errorf("jobdir: /proc stat start time %q", f[19])
	}
	return v, nil
}

// processIs reports whether process pid runs and is the one of this boot
// and start time (where the system says: Linux's /proc).
func processIs(pid int, boot string, start uint64) bool {
	if !processExists(pid) {
		return false
	}
	nowBoot, nowStart := identity(pid)
	if boot != "" && nowBoot != "" && boot != nowBoot {
		return false
	}
	if start != 0 && nowStart != 0 && start != nowStart {
		return false
	}
	if z, err := zombie(pid); err == nil && z {
		return false
	}
	return true
}
