// Package fence keeps a process of an older attempt of a job from writing
// into a workdir that a newer attempt holds.
//
// Each time a job's attempt takes a workdir's lock (package agent), the
// workdir's generation — the number in its File, which only grows and is
// never removed — goes up by one, and the attempt's workers are given the
// new number as their Token (the Env variable). Before each write a worker
// makes to the workdir — a log line, a metrics record, a checkpoint's
// files and its publication — it checks its token (Token.Check): once a
// later attempt has taken the workdir, the check fails with a *StaleError
// and the worker writes nothing more. A worker that was frozen (SIGSTOP, a
// partitioned node) while its job was restarted elsewhere thus cannot
// interleave its records with the new attempt's, or publish an old
// checkpoint over a new one.
//
// The check and the write are two steps: a write that has passed its
// check when the new attempt takes the workdir still lands. The new
// attempt's own workers start after the lock is taken and the old
// attempt's gang is stopped, so what can land is at most the one write in
// flight at that instant.
package fence

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// File is the name of a workdir's generation file.
const File = "gptui.fence"

// Env is the environment variable that gives a worker its token: the
// generation of the attempt that started it.
const Env = "GPTUI_FENCE"

// Token is a worker's right to write into the workdir Dir: the generation
// Gen of the lock its attempt took.
type Token struct {
	Dir string
	Gen uint64
}

// StaleError is a check of a token that a later attempt has outdated.
type StaleError struct {
	Dir      string
	Gen, Now uint64
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("workdir %s: this process belongs to attempt %d of its job, and attempt %d holds the workdir now: it writes nothing more there", e.Dir, e.Gen, e.Now)
}

// FromEnv returns the token in the environment (Env) for the workdir dir
// (the worker's working directory when ""), or nil when there is none:
// a process not started by a job's agent writes unchecked.
func FromEnv(getenv func(string) string, dir string) (*Token, error) {
	v := getenv(Env)
	if v == "" {
		return nil, nil
	}
	gen, err := strconv.ParseUint(v, 10, 64)
	if err != nil || gen == 0 {
		return nil, fmt.Errorf("%s=%q: not a generation (a positive number)", Env, v)
	}
	if dir == "" {
		if dir, err = os.Getwd(); err != nil {
			return nil, fmt.Errorf("fence: %w", err)
		}
	}
	return &Token{Dir: dir, Gen: gen}, nil
}

// Check returns nil while the workdir's generation is still the token's,
// and a *StaleError once a later attempt has taken the workdir. A nil
// token checks nothing. A generation file that cannot be read is an
// error too: a worker that cannot tell must not write.
func (t *Token) Check() error {
	if t == nil {
		return nil
	}
	now, err := Read(t.Dir)
	if err != nil {
		return err
	}
	if now != t.Gen {
		return &StaleError{Dir: t.Dir, Gen: t.Gen, Now: now}
	}
	return nil
}

// Read returns the workdir dir's generation: 0 when it has none yet.
func Read(dir string) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(dir, File))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("fence: %w", err)
	}
	if len(b) > 32 {
		return 0, fmt.Errorf("fence: %s: not a generation (%d bytes): remove it if no job runs in %s", filepath.Join(dir, File), len(b), dir)
	}
	gen, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("fence: %s: not a generation (%q): remove it if no job runs in %s", filepath.Join(dir, File), b, dir)
	}
	return gen, nil
}

// Next raises the workdir dir's generation by one and returns it. The
// caller serialises it with every other change of the workdir's lock
// (package agent's guard); the file is replaced atomically, so a Check
// sees the old generation or the new one.
func Next(dir string) (uint64, error) {
	gen, err := Read(dir)
	if err != nil {
		return 0, err
	}
	gen++
	path := filepath.Join(dir, File)
	tmp := path + ".tmp-" + strconv.Itoa(os.Getpid())
	if err := os.WriteFile(tmp, []byte(strconv.FormatUint(gen, 10)+"\n"), 0o644); err != nil {
		return 0, fmt.Errorf("fence: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return 0, fmt.Errorf("fence: %w", err)
	}
	return gen, nil
}
