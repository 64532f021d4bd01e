//go:build !linux

package cluster

import "syscall"

// agentSysProcAttr puts a local agent in its own process group.
func agentSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
