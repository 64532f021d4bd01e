//go:build !unix

package agent

import "errors"

// The limits a pre-flight reads (rlimit).
const (
	rlimitMemlock = iota
	rlimitNofile
)

var errNoLimits = errors.New("not on this system")

// rlimit is not known off Unix.
func rlimit(resource int) (cur, max int64, err error) { return 0, 0, errNoLimits }

// diskSpace is not known off Unix.
func diskSpace(path string) (size, free int64, err error) { return 0, 0, errNoLimits }
