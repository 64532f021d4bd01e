package cluster

import "syscall"

// agentSysProcAttr puts a local agent in its own process group and has the
// kernel kill it (and so, through their own death signal, its workers)
// when the launcher dies.
func agentSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
