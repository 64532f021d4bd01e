// Package torchtest finds the Python with PyTorch that the tests check
// gptui's models against (Debian's python3-torch, which .ci/run
// installs): independent reference implementations written from the
// published formulas.
package torchtest

import (
	"os"
	"os/exec"
	"testing"
)

// Python returns a python3 that imports torch. Under -short it skips the
// test (starting Python and torch takes seconds); where there is none it
// skips it too, except in CI (CI set), where it fails: .ci/run installs
// python3-torch, so a missing one is a broken setup, not a missing tool.
func Python(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: starts Python with torch")
	}
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(p, "-c", "import torch").Run() == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no python3 with torch; .ci/run should have installed python3-torch")
	}
	t.Skip("no python3 with torch (Debian: apt install python3-torch)")
	return ""
}
