//go:build !linux

package jobdir

import (
	"errors"
	"net"
	"os"
	"syscall"
)

// detachedSysProcAttr puts the supervisor in a session of its own.
func detachedSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setsid: true}
}

// processExists reports whether a process of id pid exists.
func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// zombie cannot tell here: no /proc.
func zombie(pid int) (bool, error) { return false, errors.ErrUnsupported }

// peerUID takes the socket's file permissions (0600, in a 0700 folder)
// for the check: without SO_PEERCRED, the peer is this user.
func peerUID(c *net.UnixConn) (int, error) { return os.Getuid(), nil }
