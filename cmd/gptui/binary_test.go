package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestBinaryFlag: --binary GOOS/GOARCH=PATH, one platform a flag.
func TestBinaryFlag(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "gptui-arm64")
	os.WriteFile(file, []byte("x"), 0o755)
	t.Chdir(dir)
	for _, tc := range []struct {
		args []string
		want map[string]string
		err  string // in the error; "" for none
	}{
		{[]string{"linux/arm64=" + file}, map[string]string{"linux/arm64": file}, ""},
		{[]string{"linux/arm64=gptui-arm64"}, map[string]string{"linux/arm64": file}, ""}, // made absolute
		{[]string{"linux/arm64=" + file, "linux/ppc64le=" + file}, map[string]string{"linux/arm64": file, "linux/ppc64le": file}, ""},
		{[]string{"linux/arm64=" + file, "linux/arm64=" + file}, nil, "linux/arm64 already has"},
		{[]string{"arm64=" + file}, nil, "want GOOS/GOARCH=PATH"},
		{[]string{"linux/arm64"}, nil, "want GOOS/GOARCH=PATH"},
		{[]string{"linux/=" + file}, nil, "want GOOS/GOARCH=PATH"},
		{[]string{"linux/arm64/v8=" + file}, nil, "want GOOS/GOARCH=PATH"},
		{[]string{"linux/arm64="}, nil, "want GOOS/GOARCH=PATH"},
		{[]string{"linux/arm64=" + filepath.Join(dir, "missing")}, nil, "no such file"},
	} {
		b := binaryFlags{}
		var err error
		for _, a := range tc.args {
			if err = b.Set(a); err != nil {
				break
			}
		}
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want an error with %q", tc.args, err, tc.err)
			}
		case err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case b.String() != binaryFlags(tc.want).String():
			t.Errorf("%q: %s, want %s", tc.args, b, binaryFlags(tc.want))
		}
	}
}

// TestBinaryArgs: where --binary is refused, in one line (exit 2): without
// --hosts, with --detach, in the UI (which does not carry it yet), and a
// file that is not built for the platform it is given for (the launcher
// checks it before connecting to any node).
func TestBinaryArgs(t *testing.T) {
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts.txt")
	os.WriteFile(hosts, []byte("127.0.0.9:1 devices=cpu:1\n"), 0o644)
	self, err := os.Executable() // this machine's platform
	if err != nil {
		t.Fatal(err)
	}
	other := "linux/arm64"
	if runtime.GOARCH == "arm64" {
		other = "linux/amd64"
	}
	bin := other + "=" + self
	for _, tc := range []struct {
		name string
		run  func(args []string, stdout, stderr *bytes.Buffer) error
		args []string
		want []string
	}{
		{"run without --hosts", cmdRunArgs, []string{"--no-tui", "-c", "tiny", "--binary", bin}, []string{"--binary need --hosts FILE"}},
		{"run --detach", cmdRunArgs, []string{"--detach", "--hosts", hosts, "-c", "tiny", "--binary", bin}, []string{"--binary does not go with --detach"}},
		{"the UI", cmdTUIArgs, []string{"--hosts", hosts, "--preset", "tiny", "--binary", bin}, []string{"the UI does not pass it on", "gptui run --no-tui --hosts FILE --binary " + other + "="}},
		{"a file of another platform", cmdRunArgs, []string{"--no-tui", "--dry-run", "--hosts", hosts, "-c", "tiny", "--binary", bin},
			[]string{"--binary " + bin + ": the file is a " + runtime.GOOS + "/" + runtime.GOARCH + " executable", "CGO_ENABLED=0 go build"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := exitCode(tc.run(tc.args, &out, &errb), &errb)
			lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
			last := lines[len(lines)-1]
			if code != 2 {
				t.Errorf("exit %d, want 2 (stderr %q)", code, errb.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(last, w) {
					t.Errorf("error line %q lacks %q", last, w)
				}
			}
		})
	}
}

func cmdRunArgs(args []string, stdout, stderr *bytes.Buffer) error {
	return cmdRun(context.Background(), args, stdout, stderr)
}

func cmdTUIArgs(args []string, stdout, stderr *bytes.Buffer) error {
	return cmdTUI(context.Background(), args, stdout, stderr)
}
