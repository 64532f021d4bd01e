package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/ebitengine/purego"
)

// Library names one of the shared libraries the GPU backend loads.
type Library int

// The libraries, each found by [Find].
const (
	LibCUDA     Library = iota // libcuda.so.1, the driver API; comes with the NVIDIA driver
	LibNVRTC                   // libnvrtc.so.N, the run-time compiler
	LibCUBLAS                  // libcublas.so.N
	LibCUBLASLt                // libcublasLt.so.N, loaded before libcublas from the same folder
	LibNCCL                    // libnccl.so.2
)

// LibDirEnv names the environment variable that, when set, is searched
// first for every library: a folder, or a list of folders separated by ':'.
const LibDirEnv = "GPTUI_CUDA_LIBDIR"

// libInfo is what discovery knows of one library.
type libInfo struct {
	base    string   // "libnvrtc.so"
	sonames []string // for the system loader, newest first
	wheels  []string // lib folders of the nvidia-* Python wheels, relative to site-packages
	install string   // what to tell a user who lacks it
	// wheel is the PyPI package of a library built for one CUDA major
	// version (its soname's N); "" for those the driver's CUDA version
	// does not constrain (the driver itself, NCCL).
	wheel string
}

// libs is indexed by Library. The wheel layouts are those of the PyPI
// packages: CUDA 13's toolkit wheels share nvidia/cu13/lib, CUDA 12's
// have one folder per component (nvidia/cuda_nvrtc/lib, nvidia/cublas/lib),
// and NCCL's is nvidia/nccl/lib.
var libs = [...]libInfo{
	LibCUDA: {
		base:    "libcuda.so",
		sonames: []string{"libcuda.so.1"},
		install: "install the NVIDIA driver",
	},
	LibNVRTC: {
		base:    "libnvrtc.so",
		sonames: []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2"},
		wheels:  []string{"nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"},
		install: "install the CUDA toolkit or the nvidia-cuda-nvrtc wheel",
		wheel:   "nvidia-cuda-nvrtc",
	},
	LibCUBLAS: {
		base:    "libcublas.so",
		sonames: []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so.11"},
		wheels:  []string{"nvidia/cu13/lib", "nvidia/cublas/lib"},
		install: "install the CUDA toolkit or the nvidia-cublas wheel",
		wheel:   "nvidia-cublas",
	},
	LibCUBLASLt: {
		base:    "libcublasLt.so",
		sonames: []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11"},
		wheels:  []string{"nvidia/cu13/lib", "nvidia/cublas/lib"},
		install: "install the CUDA toolkit or the nvidia-cublas wheel",
		wheel:   "nvidia-cublas",
	},
	LibNCCL: {
		base:    "libnccl.so",
		sonames: []string{"libnccl.so.2"},
		wheels:  []string{"nvidia/nccl/lib"},
		install: "install NCCL (libnccl2) or the nvidia-nccl wheel",
	},
}

// String returns the library's unversioned file name, such as "libnvrtc.so".
func (l Library) String() string {
	if l < 0 || int(l) >= len(libs) {
		return "Library(" + strconv.Itoa(int(l)) + ")"
	}
	return libs[l].base
}

// driverDirs are where distributions, containers (the NVIDIA container
// toolkit) and WSL put the driver's libcuda.so.1. The CUDA toolkit's
// lib64/stubs/libcuda.so is never used: it only links, it does not run.
var driverDirs = []string{
	"/usr/lib/x86_64-linux-gnu",
	"/usr/lib/aarch64-linux-gnu",
	"/usr/lib64",
	"/usr/lib",
	"/usr/local/nvidia/lib64",
	"/usr/local/nvidia/lib",
	"/usr/lib/wsl/lib",
}

// Env is what library discovery reads of its surroundings; tests give it
// fake environments and folder trees.
type Env struct {
	// Getenv reads an environment variable (os.Getenv when nil).
	Getenv func(string) string
	// Root is prepended to every fixed system folder (/usr/local/cuda,
	// /usr/lib/python3*, the driver folders); "" for the real system.
	Root string
	// System reports whether the dynamic loader finds a bare soname on
	// its own search path (ld.so.cache, RUNPATH, the default folders).
	// Nil means it finds nothing, as in tests.
	System func(soname string) bool
	// Driver returns the CUDA version the driver supports, as
	// cuDriverGetVersion reports it: 1000·major + 10·minor (12040 for
	// CUDA 12.4). NVRTC, cuBLAS and cuBLASLt built for a newer CUDA major
	// version than the driver's are passed over. Nil, or an error, means
	// the version is unknown and none is passed over.
	Driver func() (int, error)
}

// SystemEnv is the real process environment, with the installed driver's
// CUDA version ([DriverVersion]).
func SystemEnv() Env {
	return Env{Getenv: os.Getenv, System: loaderFinds, Driver: DriverVersion}
}

// DriverVersion returns the CUDA version the installed driver supports
// (cuDriverGetVersion: 1000·major + 10·minor, 12040 for CUDA 12.4). It
// loads libcuda.so.1 but does not initialise it, so it answers on a
// machine whose driver sees no GPU. Its error is [Find]'s one line when
// the driver is not installed.
func DriverVersion() (int, error) {
	h, err := load(LibCUDA)
	if err != nil {
		return 0, fmt.Errorf("cuda: %w", err)
	}
	var get func(v *int32) int32
	if err := h.sym(&get, "cuDriverGetVersion"); err != nil {
		return 0, fmt.Errorf("cuda: %w", err)
	}
	var v int32
	if r := get(&v); r != cudaSuccess {
		return 0, fmt.Errorf("cuda: %s: cuDriverGetVersion: error %d", h.path, r)
	}
	return int(v), nil
}

// driver returns e.Driver's CUDA version, or why it is unknown (no
// Driver, its error, or a version that is not positive).
func (e Env) driver() (int, error) {
	if e.Driver == nil {
		return 0, errors.New("no driver version given")
	}
	v, err := e.Driver()
	if err == nil && v <= 0 {
		err = fmt.Errorf("the driver reports CUDA version %d", v)
	}
	return v, err
}

func (e Env) getenv(k string) string {
	if e.Getenv == nil {
		return os.Getenv(k)
	}
	return e.Getenv(k)
}

// loaderFinds reports whether dlopen finds soname on the loader's own path.
func loaderFinds(soname string) bool {
	h, err := purego.Dlopen(soname, purego.RTLD_LAZY|purego.RTLD_LOCAL)
	if err != nil {
		return false
	}
	_ = purego.Dlclose(h)
	return true
}

// ErrNotFound is matched (with errors.Is) by the error of a library that
// is nowhere to be found.
var ErrNotFound = errors.New("library not found")

// NotFoundError says which library was looked for where.
type NotFoundError struct {
	Lib   Library
	Tried []string // the folders searched, in order, then the loader's path
}

// Error is one line: what, where, and what to do.
func (e *NotFoundError) Error() string {
	return fmt.Sprintf("%s not found (looked in %s); %s, or set %s",
		e.Lib, strings.Join(e.Tried, ", "), libs[e.Lib].install, LibDirEnv)
}

// Is makes errors.Is(err, ErrNotFound) true.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// loaderPath is how the system loader's own search shows in Tried.
const loaderPath = "the dynamic loader's path"

// searchDirs returns the folders to search for lib, in order, without
// duplicates.
func searchDirs(lib Library, env Env) []string {
	dirs, _ := search(lib, env)
	return dirs
}

// tried lists where Find looked for lib, for an error: the folders named
// by the environment and the toolkit's, the Python wheels' folders that
// exist (or a note that none do), and the loader's own path.
func tried(lib Library, env Env) []string {
	dirs, wheel := search(lib, env)
	var out []string
	wheels := 0
	for _, d := range dirs {
		if wheel[d] {
			if st, err := os.Stat(d); err != nil || !st.IsDir() {
				continue
			}
			wheels++
		}
		out = append(out, d)
	}
	if len(libs[lib].wheels) > 0 && wheels == 0 {
		out = append(out, "no "+strings.Join(libs[lib].wheels, " or ")+" in any Python site-packages")
	}
	return append(out, loaderPath)
}

// search returns the folders to search for lib, in order, without
// duplicates, and which of them are Python wheels' folders (which
// usually do not exist). Site-packages patterns (python3*) are expanded,
// newest Python first.
func search(lib Library, env Env) (dirs []string, wheel map[string]bool) {
	wheel = map[string]bool{}
	add := func(d ...string) {
		for _, x := range d {
			if x != "" {
				dirs = append(dirs, filepath.Clean(x))
			}
		}
	}
	pathList := func(v string) {
		for _, d := range filepath.SplitList(v) {
			add(d)
		}
	}
	sys := func(p string) string { return filepath.Join(env.Root, p) }

	pathList(env.getenv(LibDirEnv))
	pathList(env.getenv("LD_LIBRARY_PATH"))
	if lib == LibCUDA {
		for _, d := range driverDirs {
			add(sys(d))
		}
		return dedup(dirs), wheel
	}
	for _, v := range []string{"CUDA_HOME", "CUDA_PATH"} {
		if h := env.getenv(v); h != "" {
			add(filepath.Join(h, "lib64"), filepath.Join(h, "lib"))
		}
	}
	add(sys("/usr/local/cuda/lib64"))

	var sites []string
	if v := env.getenv("VIRTUAL_ENV"); v != "" {
		sites = append(sites, filepath.Join(v, "lib/python3*/site-packages"))
	}
	if v := env.getenv("CONDA_PREFIX"); v != "" {
		sites = append(sites, filepath.Join(v, "lib/python3*/site-packages"))
	}
	home := env.getenv("HOME")
	if home != "" {
		sites = append(sites, filepath.Join(home, ".local/lib/python3*/site-packages"))
	}
	pyenv := env.getenv("PYENV_ROOT")
	if pyenv == "" && home != "" {
		pyenv = filepath.Join(home, ".pyenv")
	}
	if pyenv != "" {
		sites = append(sites, filepath.Join(pyenv, "versions/*/lib/python3*/site-packages"))
	}
	// The site-packages of every other Python on PATH: a virtualenv that
	// is used but not activated (its bin folder on PATH, VIRTUAL_ENV
	// unset), such as a machine image's PyTorch environment
	// (/opt/torch/.venv), holds the nvidia-* wheels there. The system's
	// own prefixes come next, in their usual order.
	system := map[string]bool{sys("/usr"): true, sys("/usr/local"): true, sys("/opt/conda"): true, sys("/"): true}
	for _, bin := range filepath.SplitList(env.getenv("PATH")) {
		if bin == "" || !hasPython(bin) {
			continue
		}
		prefix := filepath.Dir(filepath.Clean(bin))
		if !system[prefix] {
			sites = append(sites, filepath.Join(prefix, "lib/python3*/site-packages"), filepath.Join(prefix, "lib/python3*/dist-packages"))
		}
	}
	sites = append(sites,
		sys("/opt/conda/lib/python3*/site-packages"),
		sys("/usr/local/lib/python3*/dist-packages"),
		sys("/usr/local/lib/python3*/site-packages"),
		sys("/usr/lib/python3*/dist-packages"),
		sys("/usr/lib/python3*/site-packages"),
	)
	for _, site := range sites {
		for _, w := range libs[lib].wheels {
			for _, d := range expandPython(filepath.Join(site, w)) {
				wheel[filepath.Clean(d)] = true
				add(d)
			}
		}
	}
	// conda's own CUDA packages put the libraries in $CONDA_PREFIX/lib.
	if v := env.getenv("CONDA_PREFIX"); v != "" {
		add(filepath.Join(v, "lib"))
	}
	return dedup(dirs), wheel
}

// hasPython reports whether the folder bin holds a python3 or python
// program (a file or a link to one).
func hasPython(bin string) bool {
	for _, name := range []string{"python3", "python"} {
		if isFile(filepath.Join(bin, name)) {
			return true
		}
	}
	return false
}

// expandPython returns the folders matching pattern (a site-packages
// pattern with python3* in it, and maybe versions/*), newest Python first.
func expandPython(pattern string) []string {
	m, _ := filepath.Glob(pattern)
	slices.SortStableFunc(m, func(a, b string) int { return slices.Compare(pyVersion(b), pyVersion(a)) })
	return m
}

// pyVersion extracts [3, 12] from a path holding "python3.12".
func pyVersion(p string) []int {
	for _, el := range strings.Split(p, string(filepath.Separator)) {
		if v, ok := strings.CutPrefix(el, "python"); ok {
			if nums, ok := parseVersion(v); ok {
				return nums
			}
		}
	}
	return nil
}

func dedup(s []string) []string {
	seen := make(map[string]bool, len(s))
	out := s[:0]
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// parseVersion parses "13" or "11.2" into its numbers.
func parseVersion(s string) ([]int, bool) {
	if s == "" {
		return nil, false
	}
	var nums []int
	for _, f := range strings.Split(s, ".") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, false
		}
		nums = append(nums, n)
	}
	return nums, true
}

// inDir lists the files for lib in dir, newest soname version first:
// name.so.MAJOR or name.so.MAJOR.MINOR (not the full release numbers,
// which are the same file under a longer name), then the unversioned
// name.so a development install adds.
func inDir(lib Library, dir string) []string {
	base := libs[lib].base
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	type cand struct {
		name string
		v    []int
	}
	var cs []cand
	plain := false
	for _, e := range ents {
		name := e.Name()
		if name == base {
			plain = true
			continue
		}
		suffix, ok := strings.CutPrefix(name, base+".")
		if !ok {
			continue
		}
		v, ok := parseVersion(suffix)
		if !ok || len(v) > 2 {
			continue
		}
		if lib == LibCUDA && v[0] != 1 || lib == LibNCCL && v[0] != 2 {
			continue
		}
		cs = append(cs, cand{name, v})
	}
	sort.SliceStable(cs, func(i, j int) bool {
		if cs[i].v[0] != cs[j].v[0] {
			return cs[i].v[0] > cs[j].v[0]
		}
		return len(cs[i].v) < len(cs[j].v) // libnvrtc.so.12 before libnvrtc.so.12.4
	})
	var out []string
	for _, c := range cs {
		out = append(out, filepath.Join(dir, c.name))
	}
	if plain && lib != LibCUDA { // libcuda.so without a version may be the stub
		out = append(out, filepath.Join(dir, base))
	}
	return out
}

// isFile reports whether p is a regular file or a link to one.
func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// allCandidates lists every place lib may be loaded from, in the order
// it is tried, whatever the driver supports: files in the search folders
// that exist (absolute paths) and bare sonames for the system loader's
// own search. The driver's libcuda.so.1 is asked of the loader first,
// after only the folders of GPTUI_CUDA_LIBDIR (a driver library named
// there on purpose: a forward-compatibility libcuda, the tests' stand-in);
// the others last.
func allCandidates(lib Library, env Env) []string {
	var out []string
	dirs := searchDirs(lib, env)
	if lib == LibCUDA {
		named := map[string]bool{}
		for _, d := range filepath.SplitList(env.getenv(LibDirEnv)) {
			if d != "" {
				named[filepath.Clean(d)] = true
			}
		}
		for len(dirs) > 0 && named[dirs[0]] {
			out = append(out, inDir(lib, dirs[0])...)
			dirs = dirs[1:]
		}
		out = append(out, libs[lib].sonames...)
	}
	for _, d := range dirs {
		out = append(out, inDir(lib, d)...)
	}
	if lib != LibCUDA {
		out = append(out, libs[lib].sonames...)
	}
	return out
}

// Candidates lists every place lib may be loaded from, in the order it is
// tried: files in the search folders that exist (absolute paths) and bare
// sonames for the system loader's own search. The driver's libcuda.so.1
// is asked of the loader first, after only the folders of
// GPTUI_CUDA_LIBDIR; the others last. NVRTC, cuBLAS and
// cuBLASLt built for a newer CUDA major version than env's driver
// supports are left out (see [Choose]).
func Candidates(lib Library, env Env) []string {
	var out []string
	for _, c := range makePlan(lib, env).cands {
		if !c.newer {
			out = append(out, c.path)
		}
	}
	return out
}

// Find returns where lib would be loaded from: the first file of
// [Candidates], or a bare soname the system loader finds. where lists
// the folders searched, in order (the Python wheels' folders only when
// they exist). When nothing is found the error is a *NotFoundError, one
// line naming the library, where it looked and what to do; when only
// builds for a newer CUDA than the driver's are, a *MismatchError.
func Find(lib Library, env Env) (path string, where []string, err error) {
	c, err := Choose(lib, env)
	return c.Path, c.Where, err
}

// Choice is where a library is loaded from and why: the candidate
// [Choose] or [LoadChoice] picked, and those passed over before it.
type Choice struct {
	Lib Library
	// Path is the file (an absolute path), or the bare soname the system
	// loader finds; "" when nothing fits.
	Path string
	// CUDA is the CUDA major version Path is built for (the N of its
	// soname libnvrtc.so.N); 0 when its name does not say, and for the
	// driver and NCCL, which the driver's version does not constrain.
	CUDA int
	// Driver is the CUDA version the driver supports (12040 for 12.4),
	// read for NVRTC, cuBLAS and cuBLASLt; 0 when unknown, and DriverErr
	// then says why.
	Driver    int
	DriverErr error
	// Reason says why Path was chosen.
	Reason string
	// Skipped lists the candidates passed over before Path, each with
	// why: "/usr/local/cuda/lib64/libnvrtc.so.13 skipped: needs a CUDA 13
	// driver, the driver supports 12.4".
	Skipped []string
	// Where lists the folders searched, in order (see [Find]).
	Where []string
}

// ErrMismatch is matched (with errors.Is) by the error of a library found
// only in builds for a newer CUDA than the driver supports.
var ErrMismatch = errors.New("library built for a newer CUDA than the driver supports")

// MismatchError says that lib was found, but only built for a newer CUDA
// major version than the driver supports.
type MismatchError struct {
	Lib    Library
	Found  string // the first such file, or bare soname
	CUDA   int    // the CUDA major version it is built for
	Driver int    // the driver's CUDA version: 12040 for 12.4
}

// Error is one line: the library, the version found, the driver's, and
// what to do.
func (e *MismatchError) Error() string {
	dm := e.Driver / 1000
	return fmt.Sprintf("%s: only %s (CUDA %d) found, but the driver supports CUDA %s; install a CUDA %d build (the toolkit, or the %s wheel for CUDA %d) or a driver for CUDA %d, or set %s",
		e.Lib, e.Found, e.CUDA, cudaVersion(e.Driver), dm, libs[e.Lib].wheel, dm, e.CUDA, LibDirEnv)
}

// Is makes errors.Is(err, ErrMismatch) true.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// cudaVersion formats a CUDA version as cuDriverGetVersion gives it
// (12040) as "12.4".
func cudaVersion(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

// byCUDA reports whether lib is built for one CUDA major version, which
// the driver must support: NVRTC, cuBLAS and cuBLASLt, not the driver
// itself or NCCL.
func byCUDA(lib Library) bool { return libs[lib].wheel != "" }

// soCUDA returns the CUDA major version a file or soname is built for:
// the N of name.so.N[.M…], or, for an unversioned file that is a
// symbolic link (a development install's libnvrtc.so), its target's; 0
// when neither says.
func soCUDA(p string) int {
	m := sonameMajor(p)
	if m == "" && filepath.IsAbs(p) {
		if t, err := filepath.EvalSymlinks(p); err == nil {
			m = sonameMajor(t)
		}
	}
	n, err := strconv.Atoi(m)
	if err != nil {
		return 0
	}
	return n
}

// cand is one place a library may be loaded from.
type cand struct {
	path  string // an absolute file, or a bare soname for the system loader
	cuda  int    // the CUDA major version it is built for; 0 unknown or unconstrained
	newer bool   // built for a newer CUDA major version than the driver supports
}

// plan is every candidate of a library in the order tried, each marked
// with whether the driver supports it.
type plan struct {
	lib       Library
	driver    int   // the driver's CUDA version; 0 unknown
	driverErr error // why it is unknown
	cands     []cand
}

// makePlan lists lib's candidates ([allCandidates]) and, for a library
// built for one CUDA version, reads the driver's (env.Driver) and marks
// those built for a newer major version.
func makePlan(lib Library, env Env) plan {
	p := plan{lib: lib}
	if byCUDA(lib) {
		if p.driver, p.driverErr = env.driver(); p.driverErr != nil {
			p.driver = 0
		}
	}
	for _, path := range allCandidates(lib, env) {
		c := cand{path: path}
		if byCUDA(lib) {
			c.cuda = soCUDA(path)
		}
		c.newer = p.driver > 0 && c.cuda > p.driver/1000
		p.cands = append(p.cands, c)
	}
	return p
}

// choice is a Choice with the plan's library and driver, nothing chosen.
func (p plan) choice() Choice {
	return Choice{Lib: p.lib, Driver: p.driver, DriverErr: p.driverErr}
}

// skipped is why c, built for a newer CUDA, is passed over.
func (p plan) skipped(c cand) string {
	return fmt.Sprintf("%s skipped: needs a CUDA %d driver, the driver supports %s", c.path, c.cuda, cudaVersion(p.driver))
}

// chose fills ch's Path, CUDA and Reason for candidate c.
func (p plan) chose(ch *Choice, c cand) {
	ch.Path, ch.CUDA = c.path, c.cuda
	where := "the newest in the first folder that has one"
	if !filepath.IsAbs(c.path) {
		where = "the newest soname the system loader finds"
	}
	switch {
	case !byCUDA(p.lib):
		ch.Reason = where
	case p.driver == 0:
		ch.Reason = where + "; the driver's CUDA version is unknown, so no version was ruled out"
	case c.cuda == 0:
		ch.Reason = fmt.Sprintf("%s; its name gives no CUDA version, so the driver's (CUDA %s) cannot rule it out", where, cudaVersion(p.driver))
	default:
		ch.Reason = fmt.Sprintf("built for CUDA %d, which the driver (CUDA %s) supports; %s", c.cuda, cudaVersion(p.driver), where)
	}
}

// mismatch is the error of a library found only as c and later builds
// the driver does not support.
func (p plan) mismatch(c cand) error {
	return &MismatchError{Lib: p.lib, Found: c.path, CUDA: c.cuda, Driver: p.driver}
}

// present reports whether candidate path exists: a file, or a bare
// soname the system loader finds (env.System).
func present(path string, env Env) bool {
	if filepath.IsAbs(path) {
		return isFile(path)
	}
	return env.System != nil && env.System(path)
}

// Choose picks where lib would be loaded from, without loading it, and
// says why: in the search order of [Find], the first candidate that
// exists, passing over NVRTC, cuBLAS and cuBLASLt built for a newer CUDA
// major version than env's driver supports (a folder holding
// libnvrtc.so.13 and libnvrtc.so.12 gives 12 with a CUDA 12.x driver, 13
// with CUDA 13). Nothing found is a *NotFoundError; only builds the driver
// does not support, a *MismatchError naming the library, the version
// found and the driver's.
func Choose(lib Library, env Env) (Choice, error) {
	p := makePlan(lib, env)
	ch := p.choice()
	ch.Where = tried(lib, env)
	var newer []cand
	for _, c := range p.cands {
		if !present(c.path, env) {
			continue
		}
		if c.newer {
			ch.Skipped = append(ch.Skipped, p.skipped(c))
			newer = append(newer, c)
			continue
		}
		p.chose(&ch, c)
		return ch, nil
	}
	if len(newer) > 0 {
		return ch, p.mismatch(newer[0])
	}
	return ch, &NotFoundError{Lib: lib, Tried: ch.Where}
}

// sonameMajor returns the N of a path or soname ending in .so.N[.M],
// or "" for an unversioned name.
func sonameMajor(p string) string {
	i := strings.LastIndex(p, ".so.")
	if i < 0 {
		return ""
	}
	v := p[i+len(".so."):]
	if j := strings.IndexByte(v, '.'); j >= 0 {
		v = v[:j]
	}
	return v
}

// companion returns where lib's companion library (libcublasLt for
// libcublas) of the same major version is, given where lib was found:
// the same folder, or the bare soname when lib came from the loader.
func companion(found string, other Library) string {
	name := libs[other].base
	if m := sonameMajor(found); m != "" {
		name += "." + m
	}
	if filepath.IsAbs(found) {
		return filepath.Join(filepath.Dir(found), name)
	}
	return name
}

// nvrtcBuiltins returns the libnvrtc-builtins.so.N.M files beside the
// NVRTC found at path, newest first, for the major version of path.
// NVRTC dlopens its builtins by soname when it compiles; loading them
// first (RTLD_GLOBAL) from the same folder lets a wheel's NVRTC work
// when its folder is not on LD_LIBRARY_PATH and the wheel's RUNPATH is
// missing (as in nvidia-cuda-nvrtc 13.0.48).
func nvrtcBuiltins(path string) []string {
	if !filepath.IsAbs(path) {
		return nil
	}
	dir := filepath.Dir(path)
	prefix := "libnvrtc-builtins.so."
	if m := sonameMajor(path); m != "" {
		prefix += m + "."
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	type cand struct {
		name string
		v    []int
	}
	var cs []cand
	for _, e := range ents {
		suffix, ok := strings.CutPrefix(e.Name(), "libnvrtc-builtins.so.")
		if !ok || !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		if v, ok := parseVersion(suffix); ok && len(v) == 2 {
			cs = append(cs, cand{e.Name(), v})
		}
	}
	slices.SortStableFunc(cs, func(a, b cand) int { return slices.Compare(b.v, a.v) })
	var out []string
	for _, c := range cs {
		out = append(out, filepath.Join(dir, c.name))
	}
	return out
}

// handle is a loaded library.
type handle struct {
	lib    Library
	path   string // as dlopened: a file, or a bare soname
	h      uintptr
	choice Choice // why this file (guarded by loadMu)
}

// sym binds the C function named by the first of names the library
// exports to fn, a pointer to a Go func variable.
func (h *handle) sym(fn any, names ...string) error {
	var last error
	for _, n := range names {
		p, err := purego.Dlsym(h.h, n)
		if err == nil && p != 0 {
			purego.RegisterFunc(fn, p)
			return nil
		}
		last = err
	}
	return fmt.Errorf("%s (%s) has no %s: %v", h.lib, h.path, names[0], last)
}

// optSym is sym for functions older or newer libraries lack; it reports
// whether one was bound.
func (h *handle) optSym(fn any, names ...string) bool {
	return h.sym(fn, names...) == nil
}

// loaded caches loads per process: dlopen keeps libraries mapped anyway,
// and loading once keeps their paths consistent. Keyed by Library.
var (
	loadMu sync.Mutex
	loaded = map[Library]*handle{}
)

// load finds and dlopens lib (once per process), with the companions it
// needs loaded first. It tries each candidate in turn, so a broken copy
// (wrong architecture, missing dependency) does not hide a good one, and
// passes over NVRTC, cuBLAS and cuBLASLt built for a newer CUDA than the
// driver supports (see [Choose]); the error names every copy that failed
// and why, the newer build found when nothing else was, or where it
// looked.
func load(lib Library) (*handle, error) {
	loadMu.Lock()
	h, ok := loaded[lib]
	loadMu.Unlock()
	if ok {
		return h, nil
	}
	env := SystemEnv()
	// Before taking loadMu: reading the driver's version loads libcuda.so.1.
	p := makePlan(lib, env)
	loadMu.Lock()
	defer loadMu.Unlock()
	if h, ok := loaded[lib]; ok {
		return h, nil
	}
	ch := p.choice()
	var failed []string
	for _, c := range p.cands {
		abs := filepath.IsAbs(c.path)
		if abs && !isFile(c.path) {
			continue
		}
		if c.newer {
			if abs { // a bare soname is asked of the loader only when nothing else loads
				ch.Skipped = append(ch.Skipped, p.skipped(c))
			}
			continue
		}
		if err := loadCompanions(p, c.path); err != nil {
			if abs { // a bare soname is usually just absent
				failed = append(failed, err.Error())
				ch.Skipped = append(ch.Skipped, c.path+" skipped: "+strings.TrimPrefix(oneLine(err.Error()), c.path+" "))
			}
			continue
		}
		h, err := purego.Dlopen(c.path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			if abs {
				failed = append(failed, fmt.Sprintf("%s: %v", c.path, err))
				ch.Skipped = append(ch.Skipped, c.path+" skipped: not loadable: "+oneLine(err.Error()))
			}
			continue
		}
		p.chose(&ch, c)
		hd := &handle{lib: lib, path: c.path, h: h, choice: ch}
		loaded[lib] = hd
		return hd, nil
	}
	var newer []string
	for _, c := range p.cands {
		if c.newer && present(c.path, env) {
			newer = append(newer, p.skipped(c))
			if len(failed) == 0 {
				return nil, p.mismatch(c)
			}
		}
	}
	if len(failed) > 0 {
		also := ""
		if len(newer) > 0 {
			also = " (" + strings.Join(newer, "; ") + ")"
		}
		return nil, fmt.Errorf("%s: found but not loadable: %s%s; %s, or set %s",
			lib, strings.Join(failed, "; "), also, libs[lib].install, LibDirEnv)
	}
	return nil, &NotFoundError{Lib: lib, Tried: tried(lib, env)}
}

// oneLine joins the lines of s (a dlerror message may hold several).
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// loadCompanions loads, RTLD_GLOBAL, what p's library at path needs from
// its own folder before it is opened: cuBLASLt for cuBLAS, the builtins
// for NVRTC.
func loadCompanions(p plan, path string) error {
	switch p.lib {
	case LibCUBLAS:
		lt := companion(path, LibCUBLASLt)
		h, err := purego.Dlopen(lt, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			return fmt.Errorf("%s needs %s: %v", path, lt, err)
		}
		ch := p.choice()
		ch.Lib, ch.Path, ch.CUDA = LibCUBLASLt, lt, soCUDA(lt)
		ch.Reason = "loaded with " + path + ", from the same folder"
		loaded[LibCUBLASLt] = &handle{lib: LibCUBLASLt, path: lt, h: h, choice: ch}
	case LibNVRTC:
		// Best effort: when this fails NVRTC may still find its builtins
		// itself, and if not its compile error names them.
		for _, b := range nvrtcBuiltins(path) {
			if _, err := purego.Dlopen(b, purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
				break
			}
		}
	}
	return nil
}

// Load finds and loads lib as the backend does (once per process, with
// what it needs from its own folder loaded first: cuBLASLt for cuBLAS,
// the builtins for NVRTC) and returns the file it came from: the path
// dlopen took, or, for a bare soname the system loader resolved, the file
// this process has mapped for it where /proc/self/maps tells. Its error
// is [Find]'s one line, or says which copies were found but not loadable.
func Load(lib Library) (string, error) {
	ch, err := LoadChoice(lib)
	return ch.Path, err
}

// LoadChoice is [Load] with the reasons: the file lib came from (Path),
// the CUDA version it is built for and the driver's, why it was chosen
// and why the candidates before it were not ([Choice]). Nothing the
// driver supports, where a newer build was found, is a *MismatchError:
// one line naming the library, the version found and the driver's.
func LoadChoice(lib Library) (Choice, error) {
	if lib < 0 || int(lib) >= len(libs) {
		return Choice{}, fmt.Errorf("cuda: no library %v", lib)
	}
	if lib == LibCUBLASLt {
		// From cuBLAS's folder, as the backend loads it; where cuBLAS is
		// missing, wherever cuBLASLt alone is found.
		_, _ = load(LibCUBLAS)
	}
	h, err := load(lib)
	if err != nil {
		return Choice{Lib: lib}, fmt.Errorf("cuda: %w", err)
	}
	loadMu.Lock()
	ch := h.choice
	loadMu.Unlock()
	ch.Lib, ch.Path = lib, h.path
	if !filepath.IsAbs(h.path) {
		maps, _ := os.ReadFile("/proc/self/maps")
		ch.Path = mappedFile(string(maps), lib, h.path)
	}
	return ch, nil
}

// mappedFile returns the file in maps (the text of /proc/self/maps) that
// is lib (its name starts with lib's base name, libcuda.so for libcuda.so.1),
// or soname when none is.
func mappedFile(maps string, lib Library, soname string) string {
	for _, line := range strings.Split(maps, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !filepath.IsAbs(f[5]) {
			continue
		}
		if strings.HasPrefix(filepath.Base(f[5]), libs[lib].base) {
			return f[5]
		}
	}
	return soname
}
