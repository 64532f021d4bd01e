//go:build unix

package jobdir

import (
	"errors"
	"os"
	"syscall"
)

// errBusy is tryFlock's answer for a lock another open file holds.
var errBusy = errors.New("held by another process")

// tryFlock takes an exclusive flock of f without waiting.
func tryFlock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EWOULDBLOCK):
			return errBusy
		}
		return err
	}
}

// cloexec keeps fd from the programs this process starts: an inherited
// claim must end with its supervisor, not live on in a worker.
func cloexec(fd int) { syscall.CloseOnExec(fd) }
