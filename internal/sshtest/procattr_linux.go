package sshtest

import "syscall"

// sysProcAttr makes the kernel stop sshd if the test binary dies without
// running its cleanups (a test timeout, a kill), so that no listener is
// left behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
