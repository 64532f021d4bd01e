package cluster

import (
	"debug/elf"
	"debug/macho"
	"debug/pe"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"

	"github.com/gptui/gptui/sshexec"
)

// A platform is an operating system and a CPU architecture as Go names
// them (GOOS/GOARCH): "linux/amd64", "linux/arm64". Every SSH node is
// asked its own (`uname -sm`, in the first command the launcher runs
// there) before anything is pushed, and gets the gptui executable built
// for it: Options.Exe when that is the node's platform, else
// Options.Binaries[platform]; a node neither fits is refused.

// localPlatform is this machine's platform, where a local node runs.
func localPlatform() string { return runtime.GOOS + "/" + runtime.GOARCH }

// errUnknownExe is the error of exePlatform for a file that is no
// executable it knows (a script, say): its platform is not checked.
var errUnknownExe = errors.New("not an ELF, Mach-O or PE executable")

// exePlatform returns the platform an executable file was built for, from
// its header (ELF, Mach-O or PE): that of the file, not of this process,
// since the file pushed may be another program (Options.Exe, --binary).
func exePlatform(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var magic [4]byte
	if _, err := f.ReadAt(magic[:], 0); err != nil {
		return "", fmt.Errorf("%s: %w", file, errUnknownExe)
	}
	switch {
	case string(magic[:]) == elf.ELFMAG:
		ef, err := elf.NewFile(f)
		if err != nil {
			return "", fmt.Errorf("%s: %w", file, err)
		}
		arch := elfArch(ef.Machine, ef.Class, ef.Data == elf.ELFDATA2LSB)
		if arch == "" {
			return "", fmt.Errorf("%s: an ELF executable for %v, which Go does not build for", file, ef.Machine)
		}
		return elfOS(ef) + "/" + arch, nil
	case magic[0] == 'M' && magic[1] == 'Z':
		pf, err := pe.NewFile(f)
		if err != nil {
			return "", fmt.Errorf("%s: %w", file, err)
		}
		arch, ok := peArch[pf.Machine]
		if !ok {
			return "", fmt.Errorf("%s: a PE executable for machine %#x", file, pf.Machine)
		}
		return "windows/" + arch, nil
	}
	if mf, err := macho.NewFile(f); err == nil {
		arch, ok := machoArch[mf.Cpu]
		if !ok {
			return "", fmt.Errorf("%s: a Mach-O executable for %v", file, mf.Cpu)
		}
		return "darwin/" + arch, nil
	}
	return "", fmt.Errorf("%s: %w", file, errUnknownExe)
}

// elfArch is GOARCH of an ELF file's machine, class and byte order; ""
// for a machine Go does not build for.
func elfArch(m elf.Machine, class elf.Class, little bool) string {
	is64 := class == elf.ELFCLASS64
	switch m {
	case elf.EM_X86_64:
		return "amd64"
	case elf.EM_386:
		return "386"
	case elf.EM_AARCH64:
		return "arm64"
	case elf.EM_ARM:
		return "arm"
	case elf.EM_PPC64:
		if little {
			return "ppc64le"
		}
		return "ppc64"
	case elf.EM_S390:
		return "s390x"
	case elf.EM_RISCV:
		if is64 {
			return "riscv64"
		}
	case elf.EM_LOONGARCH:
		return "loong64"
	case elf.EM_MIPS:
		switch {
		case is64 && little:
			return "mips64le"
		case is64:
			return "mips64"
		case little:
			return "mipsle"
		}
		return "mips"
	}
	return ""
}

// elfOS is GOOS of an ELF executable: Go marks FreeBSD's by its OS/ABI
// byte, NetBSD's and OpenBSD's by a note section, and Linux's by neither.
func elfOS(f *elf.File) string {
	switch f.OSABI {
	case elf.ELFOSABI_FREEBSD:
		return "freebsd"
	case elf.ELFOSABI_NETBSD:
		return "netbsd"
	case elf.ELFOSABI_OPENBSD:
		return "openbsd"
	case elf.ELFOSABI_SOLARIS:
		return "solaris"
	}
	for _, s := range []string{"netbsd", "openbsd", "freebsd", "dragonfly"} {
		if f.Section(".note."+s+".ident") != nil {
			return s
		}
	}
	return "linux"
}

var peArch = map[uint16]string{
	pe.IMAGE_FILE_MACHINE_AMD64: "amd64",
	pe.IMAGE_FILE_MACHINE_I386:  "386",
	pe.IMAGE_FILE_MACHINE_ARM64: "arm64",
}

var machoArch = map[macho.Cpu]string{
	macho.CpuAmd64: "amd64",
	macho.CpuArm64: "arm64",
}

// unameArch maps `uname -m` to GOARCH.
var unameArch = map[string]string{
	"x86_64": "amd64", "amd64": "amd64",
	"aarch64": "arm64", "arm64": "arm64",
	"i386": "386", "i486": "386", "i586": "386", "i686": "386",
	"armv5l": "arm", "armv6l": "arm", "armv7l": "arm", "armv8l": "arm", "arm": "arm",
	"ppc64le": "ppc64le", "ppc64": "ppc64",
	"s390x":       "s390x",
	"riscv64":     "riscv64",
	"loongarch64": "loong64",
	"mips":        "mips", "mipsel": "mipsle", "mips64": "mips64", "mips64el": "mips64le",
}

// unamePlatform returns the platform of a node from its `uname -sm`
// ("Linux x86_64"): the kernel's name lowercased as GOOS, the machine
// mapped to GOARCH, or kept as uname says where Go has no name for it (a
// node no gptui is built for, refused as not matching).
func unamePlatform(uname string) (string, error) {
	f := strings.Fields(uname)
	if len(f) != 2 {
		return "", fmt.Errorf("`uname -sm` said %q: want the kernel's name and the machine", uname)
	}
	goos := strings.ToLower(f[0])
	if goos == "sunos" {
		goos = "solaris"
	}
	arch, ok := unameArch[f[1]]
	if !ok {
		arch = f[1]
	}
	return goos + "/" + arch, nil
}

// checkBinaries checks Options.Binaries before any node is set up: each
// key a platform ("linux/arm64"), each file an executable built for it.
func checkBinaries(bins map[string]string) error {
	keys := make([]string, 0, len(bins))
	for k := range bins {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		file := bins[k]
		goos, arch, ok := strings.Cut(k, "/")
		if !ok || goos == "" || arch == "" || strings.Contains(arch, "/") {
			return inputErrorf("--binary %s=%s: name the platform as GOOS/GOARCH, such as linux/arm64", k, file)
		}
		p, err := exePlatform(file)
		switch {
		case errors.Is(err, errUnknownExe):
			// A script, say: taken at its word.
		case err != nil:
			return inputErrorf("--binary %s=%s: %w", k, file, err)
		case p != k:
			return inputErrorf("--binary %s=%s: the file is a %s executable; build one for %s with GOOS=%s GOARCH=%s CGO_ENABLED=0 go build -o gptui-%s ./cmd/gptui", k, file, p, k, goos, arch, arch)
		}
	}
	return nil
}

// binaryFor returns the executable node n of platform p gets: exe, built
// for exePlat ("" where its header did not say), or Options.Binaries[p];
// a node neither fits is refused in one line that says how to give it
// one. uname is what the node said, for the message ("" for this
// machine).
func (j *Job) binaryFor(n *node, p, uname, exe, exePlat string) (string, error) {
	if p == exePlat {
		return exe, nil
	}
	if b, ok := j.opts.Binaries[p]; ok {
		return b, nil
	}
	if exePlat == "" {
		return exe, nil
	}
	where := ""
	if j.opts.Hosts != sshexec.LocalHosts {
		where = fmt.Sprintf("%s:%d: ", j.opts.Hosts, n.inv.Line)
	}
	said := ""
	if uname != "" {
		said = " (uname: " + uname + ")"
	}
	goos, arch, _ := strings.Cut(p, "/")
	return "", inputErrorf("%snode %s is %s%s and %s is built for %s: give the node one for %s with --binary %s=PATH (build it with GOOS=%s GOARCH=%s CGO_ENABLED=0 go build -o gptui-%s ./cmd/gptui)",
		where, n.name, p, said, exe, exePlat, p, p, goos, arch, arch)
}
