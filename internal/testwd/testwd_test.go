package testwd

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var srcDir string

func TestMain(m *testing.M) { os.Exit(Main(m, &srcDir)) }

// helperEnv selects what TestHelper does: "exit" exits at once, "hang"
// waits to be killed.
const helperEnv = "TESTWD_HELPER"

// TestHelper is not a test: TestHelpersLeaveNothing runs it as a helper
// process, which reports its directories and then exits or is killed.
func TestHelper(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		return
	}
	wd, _ := os.Getwd()
	os.Stdout.WriteString(srcDir + "\n" + wd + "\n")
	if mode == "exit" {
		os.Exit(3) // as a helper that exits from inside a test does
	}
	select {} // killed
}

// A helper that exits from inside a test or is killed leaves nothing in
// the temporary directory, and sees the tests' source directory.
func TestHelpersLeaveNothing(t *testing.T) {
	tmp := t.TempDir()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if wd == srcDir {
		t.Fatalf("the tests run in their source directory %s", srcDir)
	}
	for _, mode := range []string{"exit", "hang"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelper$", "-test.count=1")
		cmd.Env = append(os.Environ(), helperEnv+"="+mode, "TMPDIR="+tmp)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		var lines []string
		for len(lines) < 2 && sc.Scan() {
			lines = append(lines, sc.Text())
		}
		if mode == "hang" {
			cmd.Process.Kill()
		}
		cmd.Wait()
		if len(lines) != 2 || lines[0] != srcDir || lines[1] != wd {
			t.Errorf("%s: the helper saw source and working directories %q, want %q and %q", mode, lines, srcDir, wd)
		}
		entries, err := os.ReadDir(tmp)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if len(names) > 0 {
			t.Errorf("%s: the helper left %s in the temporary directory", mode, strings.Join(names, ", "))
		}
	}
}

// TestRemoveStale: a start removes the directories of test binaries that
// no longer run, and keeps those of live ones and every other name.
func TestRemoveStale(t *testing.T) {
	tmp := t.TempDir()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{ // name: removed
		fmt.Sprintf("%s%d-123", prefix, dead.Process.Pid): true,
		fmt.Sprintf("%s%d-456", prefix, os.Getppid()):     false,
		fmt.Sprintf("%s%d-789", prefix, os.Getpid()):      false,
		prefix + "123456789":                              false, // no pid: another naming
		"TestSomething123":                                false,
	}
	for name := range names {
		if err := os.MkdirAll(filepath.Join(tmp, name, "wd"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	removeStale(tmp)
	for name, removed := range names {
		_, err := os.Stat(filepath.Join(tmp, name))
		if gone := os.IsNotExist(err); gone != removed {
			t.Errorf("%s: removed %v, want %v", name, gone, removed)
		}
	}
}
