package main

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// maxGLIBC is the newest glibc symbol version the gptui binary may
// reference: 2.17 (CentOS 7, 2014) and every glibc since can start it.
// The launcher pushes the head's binary to every node, and nodes run
// older systems than heads: Debian 11 has 2.31, Ubuntu 20.04 2.31,
// RHEL/Rocky 8 2.28.
var maxGLIBC = []int{2, 17}

// readmeBuildRE finds the README's command that builds gptui: its
// environment assignments, then 'go build ... ./cmd/gptui'.
var readmeBuildRE = regexp.MustCompile(`(?m)^((?:[A-Z_]+=\S* )*go build [^&\n]*\./cmd/gptui)`)

// readmeBuild returns the README's build command as the environment
// assignments that precede it and go's arguments, with the -o output
// replaced by out.
func readmeBuild(t *testing.T, readme, out string) (env, args []string) {
	t.Helper()
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	m := readmeBuildRE.FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s: no 'go build ... ./cmd/gptui' command", readme)
	}
	words, err := shellWords(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	for len(words) > 0 && strings.Contains(words[0], "=") {
		env, words = append(env, words[0]), words[1:]
	}
	args = slices.Clone(words[1:]) // after "go"
	i := slices.Index(args, "-o")
	if i < 0 || i+1 >= len(args) {
		t.Fatalf("%s: %q has no -o FILE", readme, m[1])
	}
	args[i+1] = out
	return env, args
}

// TestBinaryGLIBC builds gptui as the README says and fails naming each
// dynamic symbol it takes from glibc at a version newer than maxGLIBC:
// a binary that needs one does not start on a node of an older system
// ("version `GLIBC_2.34' not found"). A build with cgo (CGO_ENABLED=1, a
// C compiler present) takes dlopen, pthread_create and others at 2.34;
// one without cgo references no versioned glibc symbol at all.
func TestBinaryGLIBC(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("glibc symbol versions are Linux's")
	}
	t.Parallel()
	root := filepath.Join(srcDir, "..", "..")
	bin := filepath.Join(t.TempDir(), "gptui")
	env, args := readmeBuild(t, filepath.Join(root, "README.md"), bin)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	line := strings.Join(append(append(slices.Clone(env), "go"), args...), " ")
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", line, err, out)
	}
	t.Logf("%s: %v", line, time.Since(start).Round(time.Millisecond))
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.ImportedSymbols()
	if err != nil && f.Section(".dynsym") != nil {
		t.Fatal(err)
	}
	for _, s := range glibcAbove(syms, maxGLIBC) {
		t.Errorf("the binary needs %s, newer than GLIBC_%s: nodes with an older glibc cannot start it (build with CGO_ENABLED=0)", s, versionString(maxGLIBC))
	}
}

// glibcAbove returns, as "NAME@VERSION (LIBRARY)", the symbols of syms
// taken from glibc at a version above max: a numbered GLIBC_x.y[.z] newer
// than max, or any other GLIBC_ version (GLIBC_PRIVATE), which no other
// glibc promises. Unversioned symbols and other libraries' versions are
// left out.
func glibcAbove(syms []elf.ImportedSymbol, max []int) []string {
	var above []string
	for _, s := range syms {
		v, ok := strings.CutPrefix(s.Version, "GLIBC_")
		if !ok {
			continue
		}
		n, err := parseVersion(v)
		if err == nil && slices.Compare(n, max) <= 0 {
			continue
		}
		above = append(above, fmt.Sprintf("%s@%s (%s)", s.Name, s.Version, s.Library))
	}
	return above
}

// parseVersion parses "2.2.5" as [2 2 5].
func parseVersion(v string) ([]int, error) {
	var n []int
	for f := range strings.SplitSeq(v, ".") {
		k, err := strconv.Atoi(f)
		if err != nil || k < 0 {
			return nil, fmt.Errorf("version %q: not numbers separated by dots", v)
		}
		n = append(n, k)
	}
	return n, nil
}

// versionString is the inverse of parseVersion.
func versionString(v []int) string {
	s := make([]string, len(v))
	for i, k := range v {
		s[i] = strconv.Itoa(k)
	}
	return strings.Join(s, ".")
}

// TestGLIBCAbove: glibcAbove on a table of symbol versions.
func TestGLIBCAbove(t *testing.T) {
	sym := func(name, version, lib string) elf.ImportedSymbol {
		return elf.ImportedSymbol{Name: name, Version: version, Library: lib}
	}
	for _, tc := range []struct {
		sym   elf.ImportedSymbol
		above bool
	}{
		{sym("malloc", "GLIBC_2.2.5", "libc.so.6"), false},
		{sym("__cxa_finalize", "GLIBC_2.3.2", "libc.so.6"), false},
		{sym("secure_getenv", "GLIBC_2.17", "libc.so.6"), false},
		{sym("clock_gettime", "GLIBC_2.17.1", "libc.so.6"), true},
		{sym("__cxa_thread_atexit_impl", "GLIBC_2.18", "libc.so.6"), true},
		{sym("__libc_single_threaded", "GLIBC_2.32", "libc.so.6"), true},
		{sym("dlopen", "GLIBC_2.34", "libc.so.6"), true},
		{sym("pthread_create", "GLIBC_2.34", "libc.so.6"), true},
		{sym("_dl_find_object", "GLIBC_2.35", "ld-linux-x86-64.so.2"), true},
		{sym("x", "GLIBC_3.0", "libc.so.6"), true},
		{sym("x", "GLIBC_2.9", "libc.so.6"), false}, // 2.9 < 2.17, numerically
		{sym("x", "GLIBC_2", "libc.so.6"), false},
		{sym("_dl_x", "GLIBC_PRIVATE", "ld-linux-x86-64.so.2"), true},
		{sym("dlopen", "", "libdl.so.2"), false}, // unversioned: Go's cgo_import_dynamic without cgo
		{sym("x", "GCC_3.0", "libgcc_s.so.1"), false},
		{sym("x", "GLIBCXX_3.4.29", "libstdc++.so.6"), false},
	} {
		got := glibcAbove([]elf.ImportedSymbol{tc.sym}, maxGLIBC)
		if (len(got) > 0) != tc.above {
			t.Errorf("%s@%s: above 2.17 = %v, want %v", tc.sym.Name, tc.sym.Version, len(got) > 0, tc.above)
		}
		if want := tc.sym.Name + "@" + tc.sym.Version + " (" + tc.sym.Library + ")"; len(got) > 0 && got[0] != want {
			t.Errorf("%s@%s: named %q, want %q", tc.sym.Name, tc.sym.Version, got[0], want)
		}
	}
}
