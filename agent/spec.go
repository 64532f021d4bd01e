// Package agent is the node side of a cluster job: what `gptui agent` does
// on each machine of the inventory, started there by the launcher over SSH
// (see package cluster).
//
// [Probe] describes the machine (`gptui agent --probe`). [Run] starts the
// node's workers from a [Spec] and reports on them as a stream of events
// (package event) on its writer, the agent's standard output: each worker's
// state changes, output lines, training metrics (tailed from
// <log_dir>/metrics.<rank>.jsonl), memory every second (NVML for GPU
// workers, the resident set of the process group for CPU workers), and a
// final job event.
//
// The agent is tied to its launcher: when its standard input reaches end of
// file (the launcher closed it, or the SSH connection dropped) it stops the
// workers, as it does when the context ends (SIGINT, SIGTERM, SIGHUP). The
// workers run in their own process groups and receive SIGKILL from the
// kernel if the agent itself dies, so no worker outlives its agent.
//
// [RunPreflight] (`gptui agent --preflight`) checks the node before a
// job's workers start, meeting the other nodes' pre-flights: the ports
// the job needs, the interface toward the master, its limits, disk and
// CUDA libraries.
//
// [HoldLock] (`gptui agent --lock`) holds the lock of the node's workdir
// for a job, the file [LockFile] there, so that one job at a time uses a
// workdir; [AcquireLock] takes it and [Holder.Stale] tells a dead holder's
// lock from a live one.
package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// Spec is the job as one node runs it: the launcher writes it as one JSON
// line on the agent's standard input (or in a file).
type Spec struct {
	// Job identifies the job, for log messages and file names.
	Job string `json:"job"`
	// Node is the node's name in the inventory; every event carries it.
	Node string `json:"node"`
	// Exe is the program the workers run; empty means the agent's own
	// executable.
	Exe string `json:"exe,omitempty"`
	// LogDir is the workers' log directory (Engine.log_dir), where the
	// agent tails metrics.<rank>.jsonl; relative to the agent's working
	// directory.
	LogDir string `json:"log_dir"`
	// GraceS is how long, in seconds, a worker has between SIGTERM and
	// SIGKILL when the job is stopped; 0 means DefaultGrace.
	GraceS float64 `json:"grace_s,omitempty"`
	// Workers are the node's worker processes.
	Workers []WorkerSpec `json:"workers"`
}

// WorkerSpec is one worker process.
type WorkerSpec struct {
	Rank      int      `json:"rank"`       // global rank
	LocalRank int      `json:"local_rank"` // rank on this node
	Device    int      `json:"device"`     // device index on the node; -1 for a CPU worker
	Args      []string `json:"args"`       // arguments after the program's name
	Env       []string `json:"env"`        // KEY=value added to the agent's environment
}

// DefaultGrace is the time a worker has between SIGTERM and SIGKILL when
// the job is stopped, unless the spec says otherwise. It is short so that a
// stopped job is gone within the launcher's 5 seconds.
const DefaultGrace = 2 * time.Second

// grace returns the spec's grace period.
func (s *Spec) grace() time.Duration {
	if s.GraceS > 0 {
		return time.Duration(s.GraceS * float64(time.Second))
	}
	return DefaultGrace
}

// Check reports the first thing wrong with the spec.
func (s *Spec) Check() error {
	if len(s.Workers) == 0 {
		return errors.New("agent: the job spec has no workers")
	}
	seen := map[int]bool{}
	for i, w := range s.Workers {
		if w.Rank < 0 || seen[w.Rank] {
			return fmt.Errorf("agent: job spec: worker %d: rank %d is negative or repeated", i, w.Rank)
		}
		seen[w.Rank] = true
		if w.Device < -1 {
			return fmt.Errorf("agent: job spec: rank %d: device %d", w.Rank, w.Device)
		}
	}
	return nil
}

// ReadSpec reads a spec written as one line of JSON (the rest of r is left
// unread, bar what a line's buffering takes).
func ReadSpec(r io.Reader) (*Spec, error) {
	var line []byte
	b := make([]byte, 1)
	for {
		n, err := r.Read(b)
		if n == 1 {
			if b[0] == '\n' {
				break
			}
			line = append(line, b[0])
			if len(line) > 64<<20 {
				return nil, errors.New("agent: job spec longer than 64 MiB")
			}
		}
		if err == io.EOF {
			if len(line) == 0 {
				return nil, errors.New("agent: no job spec on standard input (the launcher writes it as one JSON line)")
			}
			break
		}
		if err != nil {
			return nil, fmt.Errorf("agent: reading the job spec: %w", err)
		}
	}
	var s Spec
	if err := json.Unmarshal(line, &s); err != nil {
		return nil, fmt.Errorf("agent: job spec: %w", err)
	}
	return &s, s.Check()
}
