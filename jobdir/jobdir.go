// Package jobdir keeps a job of `gptui run` (or of the terminal UI) apart
// from any view of it: its supervisor — the launcher of package cluster,
// which sets the nodes up, runs the gang and restarts it — runs on its own,
// detached from every terminal, and keeps the job's state in the job's
// folder, jobs/<id>/ in the directory the job was started from (where the
// job's config and rank table already live):
//
//	job.json         what the job runs (Spec): inventory or local workers, config, overrides, policies
//	supervisor.json  the supervisor's process (Supervisor): pid, boot id, start time, control socket
//	events.jsonl     the event log: every event of the job (package event) but samples, append-only
//	samples.jsonl    the latest samples (memory, health, progress: each second), cut back as it grows
//	summary.json     the job's state, step, loss and nodes (Summary), kept up to date
//	output.log       what the supervisor prints (the lines of 'gptui run --no-tui')
//	control.sock     the control endpoint: a Unix socket only the job's owner can reach
//	supervisor.lock  the job's claim: its supervisor holds an flock of it while it runs (Claim)
//
// The event log is the protocol between the supervisor and its views: the
// terminal UI's dashboard, `gptui attach`, `gptui jobs`, `gptui stop`
// follow or read it (Follow, Read) and act through the control socket
// (Call). Nothing else passes between them. A view that goes away — a
// closed terminal, a dropped SSH session — takes nothing with it.
//
// The folder is made mode 0700 and the socket 0600, and the supervisor
// answers only peers of its own user id (SO_PEERCRED). A supervisor that
// died without writing the job's end is found by its process id, the
// process's start time and the machine's boot id (Supervisor.Alive), never
// left "running".
package jobdir

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"time"
)

// Root is the directory of the job folders, relative to the directory a
// job is started from.
const Root = "jobs"

// Files of a job's folder.
const (
	SpecFile       = "job.json"
	SupervisorFile = "supervisor.json"
	EventsFile     = "events.jsonl"
	SamplesFile    = "samples.jsonl"
	SummaryFile    = "summary.json"
	OutputFile     = "output.log"
	SocketFile     = "control.sock"
)

// SuperviseCommand is the hidden gptui command that runs a job's
// supervisor: `gptui __supervise DIR`, started by Launch.
const SuperviseCommand = "__supervise"

// Spec is what a job runs: the flags of `gptui run` (or the UI's job
// screen) that make it. The supervisor builds the job from it, and
// `gptui restart` starts it again from it.
type Spec struct {
	ID      string    `json:"id"`
	Created time.Time `json:"created"`
	// Dir is the directory the job was started from (absolute): the
	// supervisor's working directory, which relative paths are taken from.
	Dir string `json:"dir"`
	// Hosts is the inventory's file; empty for this machine alone, with
	// Nproc workers.
	Hosts string `json:"hosts,omitempty"`
	Nproc int    `json:"nproc,omitempty"`
	// Nodes names the inventory's nodes the job runs on; none means every
	// node (the UI's drop of a lost node sets the rest).
	Nodes []string `json:"nodes,omitempty"`
	// Config and Overrides are -c and -o.
	Config    string   `json:"config"`
	Overrides []string `json:"overrides,omitempty"`
	// Resume: every attempt resumes from the newest checkpoint
	// (Engine.save_load.ckpt_dir=auto).
	Resume bool `json:"resume,omitempty"`
	// Continues is the id of the failed job this one resumes in its place
	// (cluster.Options.Continues), if any.
	Continues string `json:"continues,omitempty"`
	// RankTable is a rank table file giving the ranks, if any.
	RankTable         string `json:"rank_table,omitempty"`
	AcceptNewHostKeys bool   `json:"accept_new_host_keys,omitempty"`
	MasterPort        int    `json:"master_port,omitempty"`
	KeepJobs          int    `json:"keep_jobs,omitempty"`
	// NoStaging: a data path a node lacks refuses the job rather than
	// being copied there (--stage-data=never).
	NoStaging bool `json:"no_staging,omitempty"`
	// AgentTimeout and HangTimeout; 0 for the defaults.
	AgentTimeout time.Duration `json:"agent_timeout,omitempty"`
	HangTimeout  time.Duration `json:"hang_timeout,omitempty"`
	MaxRestarts  int           `json:"max_restarts,omitempty"`
	MinNodes     int           `json:"min_nodes,omitempty"`
	MaxNodes     int           `json:"max_nodes,omitempty"`
	// ShowRanks and SummaryEvery shape output.log as --show-ranks and
	// --summary-every do the output of 'gptui run --no-tui'.
	ShowRanks    string        `json:"show_ranks,omitempty"`
	SummaryEvery time.Duration `json:"summary_every,omitempty"`
}

// Local reports whether the job runs on this machine alone.
func (s *Spec) Local() bool { return s.Hosts == "" }

// NewID returns a new job id, made of the time and random digits
// (20261121-201141-455c59): the name of the job's folder here and of its
// jobs/<id> directories on the nodes.
func NewID() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return time.Now().Format(idTime) + "-" + hex.EncodeToString(b)
}

// idTime is the time layout that starts a job id.
const idTime = "20060102-150405"

// IDPattern is the regular expression of the ids jobs get (NewID), the
// only names of folders this package creates or reads as jobs, and that a
// node's prune removes.
const IDPattern = `[0-9]{8}-[0-9]{6}-[0-9a-f]{6}`

var idRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^` + IDPattern + `$`) })

// ValidID reports whether id is a job id.
func ValidID(id string) bool { return idRE().MatchString(id) }

// Path returns the folder of the job id under the directory base.
func Path(base, id string) string { return filepath.Join(base, Root, id) }

// Create makes the folder of spec.ID under base (mode 0700; a folder
// already there, such as one the UI wrote the rank table in, is kept and
// made 0700) and writes spec in it. It returns the folder's path.
func Create(base string, spec Spec) (string, error) {
	if !ValidID(spec.ID) {
		return "", fmt.Errorf("jobdir: %q is not a job id", spec.ID)
	}
	dir := Path(base, spec.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("jobdir: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", fmt.Errorf("jobdir: %w", err)
	}
	if spec.Created.IsZero() {
		spec.Created = time.Now()
	}
	return dir, WriteSpec(dir, spec)
}

// WriteSpec writes spec as the folder's job.json.
func WriteSpec(dir string, spec Spec) error { return writeJSON(filepath.Join(dir, SpecFile), spec) }

// ReadSpec reads the folder's job.json.
func ReadSpec(dir string) (Spec, error) {
	var s Spec
	err := readJSON(filepath.Join(dir, SpecFile), &s)
	return s, err
}

// writeJSON writes v to path atomically: to a temporary file renamed over
// it, so that a reader never sees half of it.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("jobdir: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("jobdir: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("jobdir: %w", err)
	}
	return nil
}

// maxJSON bounds the small files read whole (job.json, supervisor.json,
// summary.json).
const maxJSON = 1 << 20

// readJSON reads path into v; the error names the file.
func readJSON(path string, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxJSON+1))
	switch {
	case err != nil:
		return fmt.Errorf("%s: %w", path, err)
	case len(b) > maxJSON:
		return fmt.Errorf("%s: longer than %d bytes", path, maxJSON)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// Job is what Read finds in a job's folder.
type Job struct {
	ID   string
	Dir  string // the folder
	Spec Spec
	// Summary is the job's state as the supervisor last wrote it.
	Summary Summary
	// Supervisor is the supervisor's process; zero if none has started.
	Supervisor Supervisor
	// Alive: the supervisor runs.
	Alive bool
}

// State is the job's state as `gptui jobs` shows it: the summary's, but
// "dead" for a job whose supervisor is gone without having written its
// end (killed, or its machine rebooted).
func (j *Job) State() string {
	s := j.Summary.State
	if s == "" {
		s = StateStarting
	}
	if !j.Alive && !Ended(s) {
		return StateDead
	}
	return s
}

// Read reads the job in the folder dir.
func Read(dir string) (*Job, error) {
	spec, err := ReadSpec(dir)
	if err != nil {
		return nil, err
	}
	j := &Job{ID: filepath.Base(dir), Dir: dir, Spec: spec}
	if err := readJSON(filepath.Join(dir, SummaryFile), &j.Summary); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if err := readJSON(filepath.Join(dir, SupervisorFile), &j.Supervisor); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	j.Alive = j.Supervisor.PID > 0 && j.Supervisor.Alive()
	return j, nil
}

// List returns the jobs under base (base/jobs/<id> folders holding a
// job.json), oldest first. Folders of other names, and jobs/<id> folders
// without a job.json (a node's, or a job that never had a supervisor),
// are left out.
func List(base string) ([]*Job, error) {
	des, err := os.ReadDir(filepath.Join(base, Root))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("jobdir: %w", err)
	}
	var ids []string
	for _, de := range des {
		if de.IsDir() && ValidID(de.Name()) {
			ids = append(ids, de.Name())
		}
	}
	slices.Sort(ids) // the ids begin with the time
	var jobs []*Job
	for _, id := range ids {
		j, err := Read(Path(base, id))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return jobs, err
		}
		jobs = append(jobs, j)
	}
	return jobs, nil
}

// Find returns the job id under base, or the newest job when id is "".
// Its error says what there is instead.
func Find(base, id string) (*Job, error) {
	if id == "" {
		jobs, err := List(base)
		if err != nil {
			return nil, err
		}
		if len(jobs) == 0 {
			return nil, fmt.Errorf("no job in %s: start one with 'gptui run --detach' or from the UI", filepath.Join(base, Root))
		}
		return jobs[len(jobs)-1], nil
	}
	if !ValidID(id) {
		return nil, fmt.Errorf("%q is not a job id (like 20261121-201141-455c59): 'gptui jobs' lists them", id)
	}
	j, err := Read(Path(base, id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no job %s in %s: 'gptui jobs' lists them", id, filepath.Join(base, Root))
	}
	return j, err
}
