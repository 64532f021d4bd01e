package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxFileLines is the most lines a non-test file of the command holds:
// cmd/gptui is flags and printing, one concept a file, and a file that
// outgrows this is split by concept (or its logic moved to the package
// that owns it).
const maxFileLines = 300

// TestFileSizes: no non-test .go file of cmd/gptui is longer than
// maxFileLines.
func TestFileSizes(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(srcDir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no .go files in %s (%v)", srcDir, err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		n := bytes.Count(b, []byte("\n"))
		if len(b) > 0 && b[len(b)-1] != '\n' {
			n++
		}
		if n > maxFileLines {
			t.Errorf("%s: %d lines, more than %d: split it by concept", filepath.Base(f), n, maxFileLines)
		}
	}
}
