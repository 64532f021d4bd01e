// Package testwd runs a package's tests in a working directory of their
// own, so that what a test writes to a relative path — a preset's
// output_dir or log_dir, a rank table — never lands in the source tree.
//
// A test binary that starts itself again as a helper process (a worker
// that is killed on purpose, a rank of a multi-process test) passes its
// directories on through the environment: the helper makes no directory of
// its own, so a helper that is killed or calls os.Exit leaves nothing
// behind in the temporary directory. A test binary that is itself killed
// (go test's -timeout, a person's ^C twice) cannot remove its directory:
// the next test binary that starts removes every directory of a test
// binary that no longer runs (the directory's name holds its pid).
package testwd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// prefix starts the name of every directory Main makes, followed by the
// test binary's pid and a dash.
const prefix = "gptui-test-wd-"

// Environment variables a test binary's helpers inherit: the directory
// the tests run in and the package's source directory.
const (
	dirEnv = "GPTUI_TESTWD_DIR"
	srcEnv = "GPTUI_TESTWD_SRC"
)

// Main sets *src to the directory the tests started in (the package's
// source directory, for reading testdata), changes the working directory
// to a new temporary directory, runs m's tests there, removes the
// directory and returns m.Run's exit code. Call it from TestMain:
//
//	var srcDir string
//
//	func TestMain(m *testing.M) { os.Exit(testwd.Main(m, &srcDir)) }
//
// In a helper process, one that the tests started from their own binary
// with their environment, Main sets *src to the tests' source directory
// and runs m's tests where the helper was started (the tests' directory,
// unless the command said otherwise), making and removing nothing.
func Main(m *testing.M, src *string) int {
	if dir := os.Getenv(dirEnv); dir != "" {
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			*src = os.Getenv(srcEnv)
			return m.Run()
		}
	}
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testwd:", err)
		return 1
	}
	*src = wd
	removeStale(os.TempDir())
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", prefix, os.Getpid()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "testwd:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := os.Chdir(dir); err != nil {
		fmt.Fprintln(os.Stderr, "testwd:", err)
		return 1
	}
	// The helpers this process starts inherit these (TestMain runs before
	// any test, so nothing reads the environment concurrently).
	os.Setenv(dirEnv, dir)
	os.Setenv(srcEnv, wd)
	return m.Run()
}

// removeStale removes the directories in tmp that Main made for test
// binaries that no longer run: a process's pid is in its directory's
// name, and no process has it now. (Where the pid was reused since, the
// directory stays until a later start finds it free.)
func removeStale(tmp string) {
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, ok := pidOf(e.Name())
		if !ok || !e.IsDir() || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(filepath.Join(tmp, e.Name()))
		}
	}
}

// pidOf is the pid in the name of a directory Main made.
func pidOf(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	digits, _, ok := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(digits)
	return pid, ok && err == nil && pid > 0
}
