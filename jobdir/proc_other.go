//go:build !linux

package jobdir

import (
	"net"
	"os"
	"syscall"
)

// detachedSysProcAttr puts the supervisor in a session of its own.
func detachedSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setsid: true}
}

// peerUID takes the socket's file permissions (0600, in a 0700 folder)
// for the check: without SO_PEERCRED, the peer is this user.
func peerUID(c *net.UnixConn) (int, error) { return os.Getuid(), nil }
