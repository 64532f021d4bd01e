package jobdir

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
)

// detachedSysProcAttr puts the supervisor in a session of its own: no
// controlling terminal, so no hang-up when the one that started it
// closes, and no signal sent to the terminal's process group reaches it.
func detachedSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setsid: true}
}

// processExists reports whether a process of id pid exists.
func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// zombie reports whether process pid has exited and waits to be reaped.
func zombie(pid int) (bool, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false, errors.New("jobdir: /proc stat line without a state")
	}
	return b[i+2] == 'Z' || b[i+2] == 'X', nil
}

// peerUID returns the user id of the process at the other end of c
// (SO_PEERCRED).
func peerUID(c *net.UnixConn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	uid := -1
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		var cred *syscall.Ucred
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
		if cerr == nil {
			uid = int(cred.Uid)
		}
	}); err != nil {
		return -1, err
	}
	return uid, cerr
}
