// Package testwd runs a package's tests in a working directory of their
// own, so that what a test writes to a relative path — a preset's
// output_dir or log_dir, a rank table — never lands in the source tree.
package testwd

import (
	"fmt"
	"os"
	"testing"
)

// Main sets *src to the directory the tests started in (the package's
// source directory, for reading testdata), changes the working directory
// to a new temporary directory, runs m's tests there, removes the
// directory and returns m.Run's exit code. Call it from TestMain:
//
//	var srcDir string
//
//	func TestMain(m *testing.M) { os.Exit(testwd.Main(m, &srcDir)) }
func Main(m *testing.M, src *string) int {
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
	return m.Run()
}
