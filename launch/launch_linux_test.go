package launch

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// TestLauncherKilled: a worker does not outlive a launcher killed with
// SIGKILL, which has no chance to stop it.
func TestLauncherKilled(t *testing.T) {
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	l := exec.Command(exe)
	l.Env = append(os.Environ(), "LAUNCH_TEST_LAUNCHER="+dir)
	if err := l.Start(); err != nil {
		t.Fatal(err)
	}
	defer l.Process.Kill()
	pids, err := awaitReady(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	l.Wait()
	checkGone(t, pids)
}
