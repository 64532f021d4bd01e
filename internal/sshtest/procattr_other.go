//go:build !linux

package sshtest

import "syscall"

// sysProcAttr returns nil: only Linux can tie sshd's life to the test's.
func sysProcAttr() *syscall.SysProcAttr { return nil }
