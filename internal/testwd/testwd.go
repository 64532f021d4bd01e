// Package testwd runs a package's tests in a working directory of their
// own, so that what a test writes to a relative path — a preset's
// output_dir or log_dir, a rank table — never lands in the source tree.
//
// A test binary that starts itself again as a helper process (a worker
// that is killed on purpose, a rank of a multi-process test) passes its
// directories on through the environment: the helper makes no directory of
// its own, so a helper that is killed or calls os.Exit leaves nothing
// behind in the temporary directory.
package testwd

import (
	"fmt"
	"os"
	"testing"
)

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
	dir, err := os.MkdirTemp("", "gptui-test-wd-")
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
