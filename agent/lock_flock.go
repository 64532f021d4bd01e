//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package agent

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// guard serializes the reads and changes of dir's lock file between
// processes, by an flock of the directory held for the moment of the
// change. On a filesystem without flock (some NFS mounts) it does
// nothing: two jobs that find the same stale lock at the same moment
// could then both take it.
func guard(dir string) (unguard func(), err error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	fd := int(f.Fd())
	deadline := time.Now().Add(guardTimeout)
	for {
		err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return func() { syscall.Flock(fd, syscall.LOCK_UN); f.Close() }, nil
		case !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR):
			return func() { f.Close() }, nil
		case time.Now().After(deadline):
			f.Close()
			return nil, fmt.Errorf("lock: %s: another process has been checking its lock for %v", dir, guardTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
