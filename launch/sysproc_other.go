//go:build unix && !linux

package launch

import "syscall"

// sysProcAttr puts a worker in its own process group. Outside Linux there
// is no portable way to have a worker die with its launcher.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
