package jobdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// One supervisor per job: the supervisor of a job holds an exclusive flock
// of the job folder's ClaimFile for as long as it runs. Whatever starts a
// supervisor — `gptui run`, `run --detach`, `gptui restart` of an ended
// job — first takes the claim (TakeClaim), then hands it to the supervisor it
// starts (Claim.Launch passes the locked file on as a descriptor; the lock
// belongs to the open file, so the child holds it once the parent lets
// go). Two restarts of one job at the same instant therefore cannot start
// two supervisors: the second Claim is refused with a *BusyError naming
// the first. The kernel drops the lock when its holder exits, however it
// exits, so a claim is never stale.

// ClaimFile is the file of a job folder whose flock is the job's claim.
const ClaimFile = "supervisor.lock"

// claimFDEnv names the descriptor of an inherited claim in the
// environment of a supervisor that Launch starts.
const claimFDEnv = "GPTUI_JOB_CLAIM_FD"

// Claim is a held claim on a job folder.
type Claim struct {
	dir string
	f   *os.File
}

// BusyError is the refusal of a claim that another process holds: a job
// supervised, or being started, by someone else.
type BusyError struct {
	ID         string
	Supervisor Supervisor // its record, if it has written one yet
}

func (e *BusyError) Error() string {
	if e.Supervisor.PID > 0 {
		return fmt.Sprintf("job %s is supervised by pid %d (since %s): it is running or being restarted; 'gptui jobs' shows it, 'gptui stop %s' stops it",
			e.ID, e.Supervisor.PID, e.Supervisor.Started.Format("15:04:05"), e.ID)
	}
	return fmt.Sprintf("job %s is being started by another gptui command: 'gptui jobs' shows it once it runs", e.ID)
}

// TakeClaim takes the claim of the job folder dir, without waiting: a
// claim held by another process is a *BusyError.
func TakeClaim(dir string) (*Claim, error) {
	f, err := os.OpenFile(filepath.Join(dir, ClaimFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("jobdir: %w", err)
	}
	switch err := tryFlock(f); {
	case errors.Is(err, errBusy):
		f.Close()
		busy := &BusyError{ID: filepath.Base(dir)}
		_ = readJSON(filepath.Join(dir, SupervisorFile), &busy.Supervisor)
		return nil, busy
	case err != nil:
		f.Close()
		return nil, fmt.Errorf("jobdir: %s: %w", f.Name(), err)
	}
	return &Claim{dir: dir, f: f}, nil
}

// inheritedClaim returns the claim that Launch passed to this process (a
// supervisor), or nil when it was started otherwise.
func inheritedClaim(dir string) *Claim {
	fd, err := strconv.Atoi(os.Getenv(claimFDEnv))
	if err != nil || fd < 3 {
		return nil
	}
	os.Unsetenv(claimFDEnv) // not for the workers it starts
	cloexec(fd)
	return &Claim{dir: dir, f: os.NewFile(uintptr(fd), filepath.Join(dir, ClaimFile))}
}

// SuperviseClaim is the claim a supervisor runs under: the one Launch
// handed it, or else one it takes itself (a foreground `gptui run`, or
// `gptui __supervise` started by hand). It is held until the process
// exits; Release gives it up sooner.
func SuperviseClaim(dir string) (*Claim, error) {
	if c := inheritedClaim(dir); c != nil {
		return c, nil
	}
	return TakeClaim(dir)
}

// Release gives the claim up. A claim handed to a supervisor by Launch
// stays with the supervisor.
func (c *Claim) Release() error {
	if c == nil || c.f == nil {
		return nil
	}
	err := c.f.Close()
	c.f = nil
	return err
}
