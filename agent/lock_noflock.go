//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package agent

// guard does nothing where there is no flock: two jobs that find the
// same stale lock at the same moment could both take it.
func guard(dir string) (unguard func(), err error) { return func() {}, nil }
