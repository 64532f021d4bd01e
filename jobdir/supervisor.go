package jobdir

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/gptui/gptui/agent"
)

// Supervisor is the process that runs a job (supervisor.json): the facts
// that tell it from any later process of the same id, as a workdir lock
// names its holder (agent.Holder).
type Supervisor struct {
	PID int `json:"pid"`
	// Start is its start time in clock ticks after boot (field 22 of
	// /proc/PID/stat): another process given the same pid later has
	// another.
	Start uint64 `json:"start,omitempty"`
	// Host is its machine's host name, and Boot the machine's boot id
	// when it started: a pid of another boot is not it.
	Host string `json:"host,omitempty"`
	Boot string `json:"boot,omitempty"`
	// Socket is the path of its control socket.
	Socket  string    `json:"socket"`
	Started time.Time `json:"started"`
}

// Alive reports whether the supervisor still runs: a process of its pid,
// started when it was, in this boot of its machine (agent.Holder.Stale
// decides; a supervisor on another machine, whose job folder is on a
// shared filesystem, cannot be checked and counts as running).
func (s Supervisor) Alive() bool {
	if s.PID <= 0 {
		return false
	}
	h := agent.Holder{PID: s.PID, PIDStart: s.Start, Host: s.Host, BootID: s.Boot}
	return h.Stale(agent.ThisMachine(s.PID)) == ""
}

// Self returns the record of this process as the supervisor of the job,
// listening on socket.
func Self(socket string) Supervisor {
	h := agent.ThisProcess()
	return Supervisor{PID: h.PID, Start: h.PIDStart, Host: h.Host, Boot: h.BootID, Socket: socket, Started: time.Now()}
}

// WriteSupervisor writes s as the folder's supervisor.json.
func WriteSupervisor(dir string, s Supervisor) error {
	return writeJSON(filepath.Join(dir, SupervisorFile), s)
}

// LaunchTimeout bounds how long Launch waits for the supervisor to be up.
const LaunchTimeout = 30 * time.Second

// Launch starts the supervisor of the job in the folder dir, as
// Claim.Launch does, under a claim it takes first (TakeClaim): a job that
// has a supervisor, or is being started by another command, is refused
// with a *BusyError.
func Launch(dir, exe string) (Supervisor, error) {
	c, err := TakeClaim(dir)
	if err != nil {
		return Supervisor{}, err
	}
	defer c.Release()
	return c.Launch(exe)
}

// Launch starts the supervisor of the claimed job, exe SuperviseCommand
// dir, detached from any terminal: in a session of its own (setsid), its
// standard input /dev/null, its standard output and error appended to the
// folder's output.log, its working directory the spec's Dir, and the
// claim passed on to it (the claim's holder is then the supervisor, for
// as long as it runs). It returns once the supervisor has written its
// record and listens on its control socket; if it exits first, or is not
// up within LaunchTimeout, the error has the end of its output. exe empty
// means this executable. The caller still releases its own hold (Release).
func (c *Claim) Launch(exe string) (Supervisor, error) {
	dir := c.dir
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
	cmd.ExtraFiles = []*os.File{c.f}  // descriptor 3
	cmd.Env = append(os.Environ(), claimFDEnv+"=3")
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
