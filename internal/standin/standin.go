// Package standin builds, for tests, the stand-in libcuda.so.1,
// libnccl.so.2, libcublas.so.12, libcublasLt.so.12 and libnvrtc.so.12 of
// gptui's GPU path on machines without GPUs: C sources (c/cuda.c,
// c/nccl.c, c/cublas.c, c/nvrtc.c) compiled with gcc (once: Build keeps
// them) and copied into a test's temporary directory, which the code
// under test loads through the same purego path as NVIDIA's libraries
// when GPTUI_CUDA_LIBDIR names that directory.
//
// The stand-in libnccl runs NCCL's operations between the processes of a
// job over shared memory (a segment in /dev/shm per unique id), with
// NCCL's blocking semantics: a peer that never arrives leaves the others
// waiting until they abort. The stand-in driver gives it streams (a
// thread each), events and "device memory" (host memory it keeps a list
// of). It runs kernels from a library that package kernels/cuda/emu
// builds of the kernel sources (emu.BuildLibrary), named by EmuLibEnv; the
// stand-in NVRTC compiles nothing, and gives images the stand-in driver
// loads only beside a library of the same sources. So package cuda's
// whole Backend runs on the CPU. The stand-in cuBLAS and cuBLASLt (one source,
// built twice) run their GEMMs and cuBLASLt's epilogues on the CPU, as
// tasks of those streams. The comments at the top of the C files say
// what each does, and where it fails like the real thing.
package standin

import (
	"embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gptui/gptui/kernels/cuda/emu/filecache"
)

//go:embed c/standin.h c/cuda.c c/nccl.c c/cublas.c c/nvrtc.c
var sources embed.FS

// The environment variables of the stand-in libnccl (see c/nccl.c).
const (
	// TagEnv names the shared-memory segments of a job:
	// /dev/shm/gptui-standin-nccl.TAG.PID.N.
	TagEnv = "GPTUI_STANDIN_NCCL_TAG"
	// RaiseEnv, "RANK:N:SIG", makes world rank RANK send itself SIG (STOP,
	// KILL or a number) when its N-th operation starts on its stream.
	RaiseEnv = "GPTUI_STANDIN_NCCL_RAISE"
	// TraceEnv, when set, logs every operation on stderr.
	TraceEnv = "GPTUI_STANDIN_NCCL_TRACE"
)

// NoAuxEpilogueEnv, when set, makes the stand-in cuBLASLt's heuristic find
// no algorithm for an epilogue with an auxiliary matrix (GELU_AUX_BIAS,
// DGELU; see c/cublas.c), as a library without such a kernel for the
// shape answers.
const NoAuxEpilogueEnv = "GPTUI_STANDIN_CUBLASLT_NO_AUX"

// The environment variables of the stand-in libcuda (see c/cuda.c).
const (
	// MemoryEnv is each device's memory in bytes (16 GiB if unset).
	MemoryEnv = "GPTUI_STANDIN_CUDA_MEMORY"
	// AllocTraceEnv, when set, logs every device allocation on stderr:
	// "[standin] cuMemAlloc_v2 N".
	AllocTraceEnv = "GPTUI_STANDIN_CUDA_TRACE"
	// EmuLibEnv is the kernels' library (emu.BuildLibrary) that
	// cuModuleLoadData loads.
	EmuLibEnv = "GPTUI_STANDIN_EMU_LIB"
)

// LibDirEnv is kernels/cuda's variable naming the folder searched first
// for the libraries (cuda.LibDirEnv; repeated here so that this package
// does not load package cuda).
const LibDirEnv = "GPTUI_CUDA_LIBDIR"

// Build returns a new temporary directory of t holding the stand-ins:
// dir/libcuda.so.1, dir/libnccl.so.2, dir/libcublas.so.12,
// dir/libcublasLt.so.12 and dir/libnvrtc.so.12, compiled with gcc. The
// compiled libraries are kept under the user's cache directory
// (package filecache's entry "standin", keyed by gcc's version, its flags
// and the sources) and copied from there: the tests of a run, and the
// next run, compile them once. Without gcc it skips t.
func Build(t testing.TB) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("the stand-in libcuda.so.1 and libnccl.so.2 need gcc, which is not installed (.ci/run installs it)")
	}
	version, err := exec.Command(gcc, "--version").Output()
	if err != nil {
		t.Fatalf("gcc --version: %v", err)
	}
	dir := t.TempDir()
	cache := filecache.Dir("standin")
	if cache == "" {
		compile(t, gcc, dir)
		return dir
	}
	parts := []any{version}
	for _, l := range libs {
		parts = append(parts, strings.Join(l.args(), " "))
	}
	for _, name := range sourceNames {
		b, err := sources.ReadFile("c/" + name)
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, b)
	}
	entry := filepath.Join(cache, filecache.Key(parts...))
	from := entry // where the libraries are copied from
	if _, err := os.Stat(entry); err != nil {
		from = t.TempDir()
		compile(t, gcc, from)
		built := make(map[string]string)
		for _, l := range libs {
			built[l.soname] = filepath.Join(from, l.soname)
		}
		_ = filecache.Store(entry, built) // a cache not written is only slower
	}
	for _, l := range libs {
		b, err := os.ReadFile(filepath.Join(from, l.soname))
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, l.soname), b, 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// sourceNames are the files of c/ the libraries are compiled from.
var sourceNames = []string{"standin.h", "cuda.c", "nccl.c", "cublas.c", "nvrtc.c"}

// lib is one stand-in library: its soname, its source and a -D flag.
type lib struct{ soname, src, define string }

// libs are the stand-ins Build makes.
var libs = []lib{
	{"libcuda.so.1", "cuda.c", ""},
	{"libnccl.so.2", "nccl.c", ""},
	// cublas.c is cuBLAS, and with STANDIN_CUBLASLT cuBLASLt.
	{"libcublas.so.12", "cublas.c", ""},
	{"libcublasLt.so.12", "cublas.c", "-DSTANDIN_CUBLASLT"},
	{"libnvrtc.so.12", "nvrtc.c", ""},
}

// args are gcc's flags for l, but for its output and source files. No
// -ffast-math: the sums must be IEEE float32 additions in the order the C
// says, as the TCP ring's are.
func (l lib) args() []string {
	args := []string{"-std=gnu11", "-O2", "-Wall", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden"}
	if l.define != "" {
		args = append(args, l.define)
	}
	return append(args, "-Wl,-soname,"+l.soname)
}

// compile compiles the stand-ins with gcc into dir (their sources into
// dir/src).
func compile(t testing.TB, gcc, dir string) {
	t.Helper()
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range sourceNames {
		b, err := sources.ReadFile("c/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range libs {
		args := append(l.args(), "-o", filepath.Join(dir, l.soname), filepath.Join(src, l.src), "-ldl", "-lrt", "-lm")
		if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
			t.Fatalf("compiling the stand-in %s: %v\n%s", l.soname, err, out)
		}
	}
}

var tags atomic.Int64

// Tag returns a name for the segments of one test's jobs, unique on the
// machine while this process runs, and removes those segments when t ends
// (a killed rank cannot remove its own; a clean job leaves none).
func Tag(t testing.TB) string {
	t.Helper()
	tag := fmt.Sprintf("p%dt%d", os.Getpid(), tags.Add(1))
	t.Cleanup(func() {
		for _, p := range Segments(tag) {
			os.Remove(p)
		}
	})
	return tag
}

// Env returns the environment entries that make a process load the
// stand-ins of dir, with its segments named by tag.
func Env(dir, tag string) []string {
	return []string{LibDirEnv + "=" + dir, TagEnv + "=" + tag}
}

// Segments returns the shared-memory segments of tag in /dev/shm.
func Segments(tag string) []string {
	m, _ := filepath.Glob(filepath.Join("/dev/shm", "gptui-standin-nccl."+tag+".*"))
	return m
}
