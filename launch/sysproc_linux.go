package launch

import "syscall"

// sysProcAttr puts a worker in its own process group and has the kernel
// send it SIGKILL when the launcher dies.
//
// Pdeathsig is tied to the thread that started the worker, not to the whole
// launcher. The Go runtime ends a thread only when a goroutine locked to it
// with runtime.LockOSThread exits without unlocking, so a launcher whose
// goroutines do that may see its workers killed.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
