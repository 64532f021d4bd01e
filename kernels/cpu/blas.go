package cpu

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/ebitengine/purego"
)

// CBLAS enumerations (cblas.h).
const (
	cblasRowMajor = 101
	cblasNoTrans  = 111
	cblasTrans    = 112
)

// blasLib is a BLAS library loaded with dlopen.
type blasLib struct {
	kind string // "openblas", or "cblas" for another library
	path string // the file it was loaded from

	// cblasSgemm is cblas_sgemm with LP64 (32-bit int) dimensions.
	cblasSgemm func(order, transA, transB, m, n, k int32, alpha float32,
		a *float32, lda int32, b *float32, ldb int32, beta float32, c *float32, ldc int32)
	// setThreads is openblas_set_num_threads, or nil.
	setThreads func(n int32)
}

// sgemm calls cblas_sgemm. The caller has checked the arguments: the
// dimensions are positive and fit in int32, and the slices are long enough.
func (l *blasLib) sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	l.cblasSgemm(cblasRowMajor, cblasOp(transA), cblasOp(transB),
		int32(m), int32(n), int32(k), alpha,
		&a[0], int32(lda), &b[0], int32(ldb), beta, &c[0], int32(ldc))
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
	runtime.KeepAlive(c)
}

func cblasOp(trans bool) int32 {
	if trans {
		return cblasTrans
	}
	return cblasNoTrans
}

// openBLAS loads the library at path (a file name for the dynamic loader's
// search, or a path) and binds cblas_sgemm, and openblas_set_num_threads
// when the library has it.
func openBLAS(path string) (*blasLib, error) {
	shortSpin()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("dlopen: %w", err)
	}
	sym, err := purego.Dlsym(h, "cblas_sgemm")
	if err != nil {
		// The handle is useless without cblas_sgemm; a failed close leaves
		// only a mapped library behind, so its error is not worth reporting.
		_ = purego.Dlclose(h)
		return nil, fmt.Errorf("%s does not export cblas_sgemm: %w", path, err)
	}
	lib := &blasLib{kind: "cblas", path: path}
	purego.RegisterFunc(&lib.cblasSgemm, sym)
	if st, err := purego.Dlsym(h, "openblas_set_num_threads"); err == nil {
		lib.kind = "openblas"
		purego.RegisterFunc(&lib.setThreads, st)
	}
	if !strings.ContainsRune(path, '/') {
		if file, ok := mappedFile(sym); ok {
			lib.path = file
		}
	}
	return lib, nil
}

// findBLAS loads the first usable library among blasCandidates, only
// OpenBLAS when openblasOnly is set. When none loads it returns nil and a
// one-line explanation that ends with what to install.
func findBLAS(openblasOnly bool) (*blasLib, string) {
	cands := blasCandidates()
	var firstErr error
	for _, c := range cands {
		lib, err := openBLAS(c)
		if err == nil && (lib.kind == "openblas" || !openblasOnly) {
			return lib, ""
		}
		if err == nil {
			err = fmt.Errorf("%s is not OpenBLAS", c)
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return nil, fmt.Sprintf("no BLAS library found (%v; %d other locations tried); "+
		"install OpenBLAS (Debian/Ubuntu: apt install libopenblas0) for faster matrix multiplies on this CPU",
		firstErr, len(cands)-1)
}

// blasCandidates lists, most preferred first, the libraries findBLAS tries:
// OpenBLAS by soname, then at the places distributions install it (Debian's
// alternatives may leave libopenblas.so.0 off the loader's search path), then
// the system libblas, which serves only if it exports cblas_sgemm.
func blasCandidates() []string {
	var cands []string
	seen := make(map[string]bool)
	add := func(paths ...string) {
		for _, p := range paths {
			if p != "" && !seen[p] {
				seen[p] = true
				cands = append(cands, p)
			}
		}
	}
	glob := func(pattern string) {
		m, err := filepath.Glob(pattern)
		if err == nil { // the only error is a malformed pattern
			add(m...)
		}
	}
	switch runtime.GOOS {
	case "darwin":
		add("libopenblas.dylib",
			"/opt/homebrew/opt/openblas/lib/libopenblas.dylib",
			"/usr/local/opt/openblas/lib/libopenblas.dylib",
			"/System/Library/Frameworks/Accelerate.framework/Accelerate")
		return cands
	case "linux":
		add("libopenblas.so.0", "libopenblas.so")
		dirs := []string{"/usr/lib64", "/usr/local/lib", "/opt/OpenBLAS/lib"}
		if t := multiarchTriplet(); t != "" {
			d := "/usr/lib/" + t
			for _, v := range []string{"pthread", "openmp", "serial"} {
				add(d + "/openblas-" + v + "/libopenblas.so.0")
			}
			glob(d + "/openblas-*/libopenblas*.so*")
			dirs = append([]string{d}, dirs...)
		}
		for _, d := range dirs {
			glob(d + "/libopenblas*.so*")
		}
		add("libblas.so.3")
		return cands
	default:
		add("libopenblas.so.0", "libopenblas.so", "/usr/local/lib/libopenblas.so", "libblas.so.3")
		return cands
	}
}

// multiarchTriplet returns the Debian multiarch directory name for the
// running architecture, or "" when unknown.
func multiarchTriplet() string {
	return map[string]string{
		"amd64":   "x86_64-linux-gnu",
		"arm64":   "aarch64-linux-gnu",
		"386":     "i386-linux-gnu",
		"arm":     "arm-linux-gnueabihf",
		"ppc64le": "powerpc64le-linux-gnu",
		"riscv64": "riscv64-linux-gnu",
		"s390x":   "s390x-linux-gnu",
		"loong64": "loongarch64-linux-gnu",
	}[runtime.GOARCH]
}

// mappedFile returns the file that holds address addr in this process's
// memory map, so that a library loaded by soname can be reported by path.
// It reports false where /proc/self/maps is unavailable.
func mappedFile(addr uintptr) (string, bool) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return "", false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// start-end perms offset dev inode [path]
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || !strings.HasPrefix(fields[5], "/") {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if uint64(addr) >= start && uint64(addr) < end {
			return strings.Join(fields[5:], " "), true
		}
	}
	return "", false
}

// spinEnv is OpenBLAS's setting for how long its idle threads spin (2ⁿ
// cycles) before they sleep. The default, n = 28, keeps a core busy for
// about 0.1 s after every GEMM, which halves the speed of the Go kernels
// that run between GEMMs on a 2-core machine (measured: GELU 0.33 → 0.17 s
// per GPT-2 124M step). n = 4 makes them sleep at once.
const spinEnv = "OPENBLAS_THREAD_TIMEOUT"

// shortSpin sets OPENBLAS_THREAD_TIMEOUT=4 in the C environment, where
// OpenBLAS reads it when it loads, unless the user has set it. The C
// environment is not Go's: without cgo, os.Setenv does not reach it, so this
// calls libc's setenv through purego. Failures leave OpenBLAS's default.
func shortSpin() {
	if _, ok := os.LookupEnv(spinEnv); ok {
		return
	}
	libc, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return
	}
	sym, err := purego.Dlsym(libc, "setenv")
	if err != nil {
		return
	}
	var setenv func(name, value string, overwrite int32) int32
	purego.RegisterFunc(&setenv, sym)
	setenv(spinEnv, "4", 0)
}
