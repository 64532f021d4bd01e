package sshtest

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// sysProcAttr makes the kernel stop sshd if the test binary dies without
// running its cleanups (a test timeout, a kill), so that no listener is
// left behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}

// limitFileSize sets the soft RLIMIT_FSIZE of process pid to bytes, or
// back to its hard limit for bytes < 0.
func limitFileSize(pid int, bytes int64) error {
	var old unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_FSIZE, nil, &old); err != nil {
		return err
	}
	lim := unix.Rlimit{Cur: old.Max, Max: old.Max}
	if bytes >= 0 {
		lim.Cur = min(uint64(bytes), old.Max)
	}
	return unix.Prlimit(pid, unix.RLIMIT_FSIZE, &lim, nil)
}
