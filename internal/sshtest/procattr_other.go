//go:build !linux

package sshtest

import (
	"errors"
	"syscall"
)

// sysProcAttr returns nil: only Linux can tie sshd's life to the test's.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// limitFileSize is Linux's only (prlimit).
func limitFileSize(pid int, bytes int64) error {
	return errors.New("sshtest: limiting a running sshd's file size needs Linux")
}
