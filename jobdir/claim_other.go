//go:build !unix

package jobdir

import (
	"errors"
	"os"
)

var errBusy = errors.New("held by another process")

// tryFlock does nothing where there is no flock: two restarts of one job
// at the same instant could both start a supervisor.
func tryFlock(f *os.File) error { return nil }

func cloexec(fd int) {}
