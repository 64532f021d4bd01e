package cluster

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/gptui/gptui/event"
)

// writeELF writes the header of an ELF executable, and nothing else, to
// path: enough for exePlatform, which reads no more.
func writeELF(t *testing.T, path string, class elf.Class, data elf.Data, m elf.Machine, abi elf.OSABI) {
	t.Helper()
	var ident [elf.EI_NIDENT]byte
	copy(ident[:], elf.ELFMAG)
	ident[elf.EI_CLASS], ident[elf.EI_DATA], ident[elf.EI_VERSION], ident[elf.EI_OSABI] = byte(class), byte(data), byte(elf.EV_CURRENT), byte(abi)
	var order binary.ByteOrder = binary.LittleEndian
	if data == elf.ELFDATA2MSB {
		order = binary.BigEndian
	}
	var buf bytes.Buffer
	var h any = &elf.Header64{Ident: ident, Type: uint16(elf.ET_EXEC), Machine: uint16(m), Version: uint32(elf.EV_CURRENT), Ehsize: 64}
	if class == elf.ELFCLASS32 {
		h = &elf.Header32{Ident: ident, Type: uint16(elf.ET_EXEC), Machine: uint16(m), Version: uint32(elf.EV_CURRENT), Ehsize: 52}
	}
	if err := binary.Write(&buf, order, h); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestExePlatform: the platform of an executable from its header, for
// crafted ELF headers of each architecture, a script and this test.
func TestExePlatform(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		class elf.Class
		data  elf.Data
		m     elf.Machine
		abi   elf.OSABI
		want  string
	}{
		{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_X86_64, elf.ELFOSABI_NONE, "linux/amd64"},
		{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_AARCH64, elf.ELFOSABI_NONE, "linux/arm64"},
		{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_AARCH64, elf.ELFOSABI_LINUX, "linux/arm64"},
		{elf.ELFCLASS32, elf.ELFDATA2LSB, elf.EM_386, elf.ELFOSABI_NONE, "linux/386"},
		{elf.ELFCLASS32, elf.ELFDATA2LSB, elf.EM_ARM, elf.ELFOSABI_NONE, "linux/arm"},
		{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_PPC64, elf.ELFOSABI_NONE, "linux/ppc64le"},
		{elf.ELFCLASS64, elf.ELFDATA2MSB, elf.EM_PPC64, elf.ELFOSABI_NONE, "linux/ppc64"},
		{elf.ELFCLASS64, elf.ELFDATA2MSB, elf.EM_S390, elf.ELFOSABI_NONE, "linux/s390x"},
		{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_RISCV, elf.ELFOSABI_NONE, "linux/riscv64"},
		{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_LOONGARCH, elf.ELFOSABI_NONE, "linux/loong64"},
		{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_MIPS, elf.ELFOSABI_NONE, "linux/mips64le"},
		{elf.ELFCLASS32, elf.ELFDATA2MSB, elf.EM_MIPS, elf.ELFOSABI_NONE, "linux/mips"},
		{elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_X86_64, elf.ELFOSABI_FREEBSD, "freebsd/amd64"},
	} {
		file := filepath.Join(dir, strings.ReplaceAll(tc.want, "/", "-")+"-"+tc.abi.String())
		writeELF(t, file, tc.class, tc.data, tc.m, tc.abi)
		if got, err := exePlatform(file); err != nil || got != tc.want {
			t.Errorf("%v %v %v %v: %q, %v; want %q", tc.class, tc.data, tc.m, tc.abi, got, err, tc.want)
		}
	}
	sparc := filepath.Join(dir, "sparc")
	writeELF(t, sparc, elf.ELFCLASS32, elf.ELFDATA2MSB, elf.EM_SPARC, elf.ELFOSABI_NONE)
	if got, err := exePlatform(sparc); err == nil || errors.Is(err, errUnknownExe) {
		t.Errorf("a 32-bit SPARC ELF: %q, %v; want an error naming its machine", got, err)
	}
	script := filepath.Join(dir, "script")
	os.WriteFile(script, []byte("#!/bin/sh\nexit 1\n"), 0o755)
	if got, err := exePlatform(script); !errors.Is(err, errUnknownExe) {
		t.Errorf("a script: %q, %v; want errUnknownExe", got, err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := exePlatform(self); runtime.GOOS != "windows" && runtime.GOOS != "darwin" && runtime.GOOS != "linux" {
		t.Logf("this test: %q, %v", got, err)
	} else if err != nil || got != localPlatform() {
		t.Errorf("this test's own executable: %q, %v; want %q", got, err, localPlatform())
	}
}

// TestUnamePlatform: a node's `uname -sm` as GOOS/GOARCH.
func TestUnamePlatform(t *testing.T) {
	for _, tc := range []struct{ uname, want string }{
		{"Linux x86_64", "linux/amd64"},
		{"Linux aarch64", "linux/arm64"},
		{"Linux armv7l", "linux/arm"},
		{"Linux i686", "linux/386"},
		{"Linux ppc64le", "linux/ppc64le"},
		{"Linux s390x", "linux/s390x"},
		{"Linux riscv64", "linux/riscv64"},
		{"Linux loongarch64", "linux/loong64"},
		{"Darwin arm64", "darwin/arm64"},
		{"FreeBSD amd64", "freebsd/amd64"},
		{"SunOS i86pc", "solaris/i86pc"}, // no GOARCH: kept, and refused as another platform
		{"Linux sparc64", "linux/sparc64"},
		{"  Linux   x86_64 \n", "linux/amd64"},
	} {
		if got, err := unamePlatform(tc.uname); err != nil || got != tc.want {
			t.Errorf("%q: %q, %v; want %q", tc.uname, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "Linux", "Linux x86_64 extra", "bash: uname: command not found"} {
		if got, err := unamePlatform(bad); err == nil {
			t.Errorf("%q: %q, want an error", bad, got)
		}
	}
}

// TestCheckBinaries: --binary's files are checked against the platforms
// they are given for, before any node is set up.
func TestCheckBinaries(t *testing.T) {
	dir := t.TempDir()
	arm := filepath.Join(dir, "gptui-arm64")
	writeELF(t, arm, elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_AARCH64, elf.ELFOSABI_NONE)
	script := filepath.Join(dir, "script")
	os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755)
	for _, tc := range []struct {
		bins map[string]string
		want string // in the error; "" for none
	}{
		{nil, ""},
		{map[string]string{"linux/arm64": arm}, ""},
		{map[string]string{"linux/arm64": script}, ""},
		{map[string]string{"linux/amd64": arm}, "--binary linux/amd64=" + arm + ": the file is a linux/arm64 executable; build one for linux/amd64 with GOOS=linux GOARCH=amd64 CGO_ENABLED=0 go build -o gptui-amd64 ./cmd/gptui"},
		{map[string]string{"arm64": arm}, "name the platform as GOOS/GOARCH"},
		{map[string]string{"linux/arm64/v8": arm}, "name the platform as GOOS/GOARCH"},
		{map[string]string{"linux/arm64": filepath.Join(dir, "missing")}, "no such file"},
	} {
		err := checkBinaries(tc.bins)
		var ie *InputError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v", tc.bins, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.As(err, &ie)):
			t.Errorf("%v: %v; want an *InputError with %q", tc.bins, err, tc.want)
		}
	}
}

// TestArchRefused: SSH nodes of another architecture than the executable
// (an arm64 ELF for these amd64 nodes) are refused, each in one line that
// names the node, its platform and the fix, before anything is pushed;
// with --binary naming an executable for the nodes' platform, the push
// uses that.
func TestArchRefused(t *testing.T) {
	tc := newCluster(t, "cpu:1")
	arm := filepath.Join(t.TempDir(), "gptui-arm64")
	writeELF(t, arm, elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EM_AARCH64, elf.ELFOSABI_NONE)
	plat := localPlatform() // the loopback nodes are this machine
	if plat != "linux/amd64" {
		t.Skip("the loopback nodes must be linux/amd64 (uname: Linux x86_64), not arm64 as the executable")
	}
	goarch := "amd64"

	o := tc.optionsWithout(t)
	o.Exe = arm
	j := New(o)
	events := collect(j)
	_, err := j.Plan(context.Background())
	j.Close()
	es := <-events
	var ie *InputError
	if err == nil || !errors.As(err, &ie) {
		t.Fatalf("Plan: %v, want an *InputError", err)
	}
	// The first node refused stops the other's setup: either is named.
	want := " is " + plat + " (uname: Linux x86_64) and " + arm + " is built for linux/arm64: give the node one for " + plat +
		" with --binary " + plat + "=PATH (build it with GOOS=linux GOARCH=" + goarch + " CGO_ENABLED=0 go build -o gptui-" + goarch + " ./cmd/gptui)"
	msg := err.Error()
	if !(strings.HasSuffix(msg, ":1: node 127.0.0.2"+want) || strings.HasSuffix(msg, ":2: node 127.0.0.3"+want)) || strings.Contains(msg, "\n") {
		t.Errorf("Plan: %v\nwant one line ending in: node 127.0.0.2 (or .3)%s", err, want)
	}
	for _, e := range es {
		if e.Kind == event.KindNode && e.State == event.NodePushing {
			t.Errorf("a push after the refusal: %+v", e)
		}
	}
	for _, wd := range tc.workdirs {
		if _, err := os.Stat(filepath.Join(wd, "gptui")); !os.IsNotExist(err) {
			t.Errorf("%s: gptui pushed before the refusal (%v)", wd, err)
		}
	}
	t.Logf("refused: %v", err)

	// --binary for the nodes' platform: pushed in place of Exe.
	o = tc.options(t)
	real := o.Exe
	o.Exe, o.Binaries, o.DryRun = arm, map[string]string{plat: real}, true
	j = New(o)
	events = collect(j)
	p, err := j.Plan(context.Background())
	j.Close()
	es = <-events
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range p.Nodes {
		if n.Platform != plat || len(n.Pushes) == 0 || n.Pushes[0].From != real {
			t.Errorf("node %s: platform %q, pushes %+v; want %s and %s pushed", n.Name, n.Platform, n.Pushes, plat, real)
		}
	}
	pushed := 0
	for _, e := range es {
		if e.Kind == event.KindNode && e.State == event.NodePushing && strings.HasSuffix(e.Message, ": "+real+", the binary for "+plat) {
			pushed++
		}
	}
	if pushed != len(p.Nodes) {
		t.Errorf("%d push events name the --binary file, want %d: %+v", pushed, len(p.Nodes), es)
	}
}
