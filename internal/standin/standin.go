// Package standin builds, for tests, the stand-in libcuda.so.1,
// libnccl.so.2, libcublas.so.12, libcublasLt.so.12 and libnvrtc.so.12 of
// gptui's GPU path on machines without GPUs: C sources (c/cuda.c,
// c/nccl.c, c/cublas.c, c/nvrtc.c) compiled with gcc into a test's
// temporary directory, which the code under test loads through the same
// purego path as NVIDIA's libraries when GPTUI_CUDA_LIBDIR names that
// directory.
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
	"sync/atomic"
	"testing"
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

// Build compiles the stand-ins with gcc into a new temporary directory of
// t and returns it: dir/libcuda.so.1, dir/libnccl.so.2,
// dir/libcublas.so.12, dir/libcublasLt.so.12 and dir/libnvrtc.so.12.
// Without gcc it skips t.
func Build(t testing.TB) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("the stand-in libcuda.so.1 and libnccl.so.2 need gcc, which is not installed (.ci/run installs it)")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"standin.h", "cuda.c", "nccl.c", "cublas.c", "nvrtc.c"} {
		b, err := sources.ReadFile("c/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, lib := range []struct{ soname, src, define string }{
		{"libcuda.so.1", "cuda.c", ""},
		{"libnccl.so.2", "nccl.c", ""},
		// cublas.c is cuBLAS, and with STANDIN_CUBLASLT cuBLASLt.
		{"libcublas.so.12", "cublas.c", ""},
		{"libcublasLt.so.12", "cublas.c", "-DSTANDIN_CUBLASLT"},
		{"libnvrtc.so.12", "nvrtc.c", ""},
	} {
		// No -ffast-math: the sums must be IEEE float32 additions in the
		// order the C says, as the TCP ring's are.
		args := []string{"-std=gnu11", "-O2", "-Wall", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden"}
		if lib.define != "" {
			args = append(args, lib.define)
		}
		args = append(args, "-Wl,-soname,"+lib.soname, "-o", filepath.Join(dir, lib.soname), filepath.Join(src, lib.src), "-ldl", "-lrt", "-lm")
		cmd := exec.Command(gcc, args...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("compiling the stand-in %s: %v\n%s", lib.soname, err, out)
		}
	}
	return dir
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
