package cuda

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// nvrtcResult values (nvrtc.h, enum nvrtcResult).
const (
	nvrtcSuccess = 0 // NVRTC_SUCCESS = 0
)

// nvrtcAPI is libnvrtc's functions; each binding's declaration (nvrtc.h,
// CUDA 12/13) is beside it. nvrtcProgram is a pointer.
type nvrtcAPI struct {
	// nvrtcResult nvrtcVersion(int *major, int *minor);
	version func(major, minor *int32) int32
	// const char *nvrtcGetErrorString(nvrtcResult result);
	getErrorString func(r int32) string
	// nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name,
	//   int numHeaders, const char * const *headers, const char * const *includeNames);
	createProgram func(prog *uintptr, src, name uintptr, numHeaders int32, headers, includeNames uintptr) int32
	// nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog);
	destroyProgram func(prog *uintptr) int32
	// nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions, const char * const *options);
	compileProgram func(prog uintptr, numOptions int32, options uintptr) int32
	// nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t *logSizeRet);
	getProgramLogSize func(prog uintptr, n *uint64) int32
	// nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char *log);
	getProgramLog func(prog uintptr, log *byte) int32
	// nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t *cubinSizeRet);
	getCUBINSize func(prog uintptr, n *uint64) int32
	// nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char *cubin);
	getCUBIN func(prog uintptr, cubin *byte) int32
	// nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t *ptxSizeRet);
	getPTXSize func(prog uintptr, n *uint64) int32
	// nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char *ptx);
	getPTX func(prog uintptr, ptx *byte) int32
}

// Compiler is NVRTC, loaded. It is safe for concurrent use.
type Compiler struct {
	api          nvrtcAPI
	path         string
	major, minor int
}

// LoadNVRTC finds NVRTC (the newest libnvrtc.so.N on the search path of
// [Find], its builtins loaded first from its own folder) and loads it.
func LoadNVRTC() (*Compiler, error) {
	h, err := load(LibNVRTC)
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	c := &Compiler{path: h.path}
	a := &c.api
	for _, b := range []struct {
		fn   any
		name string
	}{
		{&a.version, "nvrtcVersion"},
		{&a.getErrorString, "nvrtcGetErrorString"},
		{&a.createProgram, "nvrtcCreateProgram"},
		{&a.destroyProgram, "nvrtcDestroyProgram"},
		{&a.compileProgram, "nvrtcCompileProgram"},
		{&a.getProgramLogSize, "nvrtcGetProgramLogSize"},
		{&a.getProgramLog, "nvrtcGetProgramLog"},
		{&a.getCUBINSize, "nvrtcGetCUBINSize"},
		{&a.getCUBIN, "nvrtcGetCUBIN"},
		{&a.getPTXSize, "nvrtcGetPTXSize"},
		{&a.getPTX, "nvrtcGetPTX"},
	} {
		if err := h.sym(b.fn, b.name); err != nil {
			return nil, fmt.Errorf("cuda: %w", err)
		}
	}
	var major, minor int32
	if err := c.check("nvrtcVersion", a.version(&major, &minor)); err != nil {
		return nil, fmt.Errorf("cuda: %s: %w", h.path, err)
	}
	c.major, c.minor = int(major), int(minor)
	return c, nil
}

// check turns an nvrtcResult into nil or an *Error.
func (c *Compiler) check(op string, r int32) error {
	if r == nvrtcSuccess {
		return nil
	}
	name := c.api.getErrorString(r)
	return &Error{Op: op, Code: int(r), Name: name}
}

// Version returns NVRTC's version, such as 13, 0.
func (c *Compiler) Version() (major, minor int) { return c.major, c.minor }

// Path returns where NVRTC was loaded from.
func (c *Compiler) Path() string { return c.path }

// ArchFlag returns the NVRTC option that compiles CUBIN for a device of
// compute capability major.minor: "--gpu-architecture=sm_90".
func ArchFlag(major, minor int) string {
	return fmt.Sprintf("--gpu-architecture=sm_%d%d", major, minor)
}

// Compile compiles CUDA C++ source src (name is its file name in
// messages) with NVRTC options opts. Give a real architecture
// (ArchFlag: --gpu-architecture=sm_XY) to get CUBIN (nvrtcGetCUBIN); with
// a virtual one (compute_XY) the image is PTX, which Device.Load also
// takes. log is NVRTC's output, warnings included; on a failed compile
// err wraps an *Error named NVRTC_ERROR_COMPILATION and log says why.
func (c *Compiler) Compile(src, name string, opts []string) (image []byte, log string, err error) {
	// The source and name live outside the Go heap until the program is
	// destroyed, in case NVRTC keeps pointers to them.
	text, _, err := cStrings([]string{src, name})
	if err != nil {
		return nil, "", err
	}
	defer text.free()
	srcp, namep := text.word(0), text.word(1)
	var prog uintptr
	if err := c.check("nvrtcCreateProgram", c.api.createProgram(&prog, srcp, namep, 0, 0, 0)); err != nil {
		return nil, "", fmt.Errorf("cuda: compiling %s: %w", name, err)
	}
	defer c.api.destroyProgram(&prog)

	m, optv, err := cStrings(opts)
	if err != nil {
		return nil, "", err
	}
	cerr := c.check("nvrtcCompileProgram", c.api.compileProgram(prog, int32(len(opts)), optv))
	m.free()

	var n uint64
	if c.api.getProgramLogSize(prog, &n) == nvrtcSuccess && n > 1 {
		buf := make([]byte, n)
		if c.api.getProgramLog(prog, &buf[0]) == nvrtcSuccess {
			log = strings.TrimRight(string(bytes.TrimRight(buf, "\x00")), "\n")
		}
	}
	if cerr != nil {
		return nil, log, fmt.Errorf("cuda: compiling %s: %w", name, cerr)
	}

	n = 0
	if err := c.check("nvrtcGetCUBINSize", c.api.getCUBINSize(prog, &n)); err == nil && n > 0 {
		image = make([]byte, n)
		if err := c.check("nvrtcGetCUBIN", c.api.getCUBIN(prog, &image[0])); err != nil {
			return nil, log, fmt.Errorf("cuda: compiling %s: %w", name, err)
		}
		return image, log, nil
	}
	// A virtual architecture: no CUBIN, the PTX is the image.
	if err := c.check("nvrtcGetPTXSize", c.api.getPTXSize(prog, &n)); err != nil {
		return nil, log, fmt.Errorf("cuda: compiling %s: %w", name, err)
	}
	if n == 0 {
		return nil, log, fmt.Errorf("cuda: compiling %s: NVRTC produced neither CUBIN nor PTX", name)
	}
	image = make([]byte, n)
	if err := c.check("nvrtcGetPTX", c.api.getPTX(prog, &image[0])); err != nil {
		return nil, log, fmt.Errorf("cuda: compiling %s: %w", name, err)
	}
	return image, log, nil
}

// CompileError is a compile that failed, with the compiler's log.
type CompileError struct {
	Name string // the source's name
	Log  string // the compiler's output
	Err  error
}

// Error gives the cause and the first lines of the log.
func (e *CompileError) Error() string {
	log := e.Log
	lines := strings.SplitN(log, "\n", 11)
	if len(lines) > 10 {
		log = strings.Join(lines[:10], "\n") + "\n…"
	}
	if log == "" {
		return e.Err.Error()
	}
	return e.Err.Error() + "\n" + log
}

// Unwrap returns the cause.
func (e *CompileError) Unwrap() error { return e.Err }

// Cache keeps compiled images on disk, keyed by the SHA-256 of the
// source, its name, the options and Version, so a kernel is compiled once
// per machine, architecture and compiler. Entries are written to a
// temporary file and renamed into place, so readers (other processes
// included) see whole files or none; an entry that is corrupt or cannot
// be read is compiled again, never fatal. Concurrent Gets of one key in
// a process compile once. A Cache must not be copied after first use.
type Cache struct {
	// Dir holds the entries; DefaultCacheDir() when empty.
	Dir string
	// Compile compiles a source, as Compiler.Compile does.
	Compile func(src, name string, opts []string) ([]byte, string, error)
	// Version names the compiler (and anything else that changes the
	// output), such as "nvrtc 13.0"; it is part of the key.
	Version string

	mu       sync.Mutex
	inflight map[string]*cacheCall
}

type cacheCall struct {
	done  chan struct{}
	image []byte
	err   error
}

// NewCache returns a cache in dir (DefaultCacheDir() when "") that
// compiles with c. Its key names c's version and where c was loaded from,
// so that the images of the tests' stand-in NVRTC (of NVRTC's version,
// but no CUBIN) never meet a GPU's driver.
func (c *Compiler) NewCache(dir string) *Cache {
	return &Cache{Dir: dir, Compile: c.Compile, Version: fmt.Sprintf("nvrtc %d.%d %s", c.major, c.minor, c.path)}
}

// cacheMagic starts every entry, followed by the image's SHA-256.
const cacheMagic = "GPTUICU1"

// Key returns the hex SHA-256 an entry is stored under.
func (c *Cache) Key(src, name string, opts []string) string {
	h := sha256.New()
	field := func(s string) {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field("gptui cuda cache 1")
	field(src)
	field(name)
	field(fmt.Sprint(len(opts)))
	for _, o := range opts {
		field(o)
	}
	field(c.Version)
	return hex.EncodeToString(h.Sum(nil))
}

func (c *Cache) dir() string {
	if c.Dir != "" {
		return c.Dir
	}
	return DefaultCacheDir()
}

// Path returns the file an entry is stored in.
func (c *Cache) Path(src, name string, opts []string) string {
	return filepath.Join(c.dir(), c.Key(src, name, opts)+".bin")
}

// Get returns the compiled image of src, from the cache when it holds a
// sound entry (hit is then true), else compiled and stored. A Get that
// waited for another Get's compile of the same key reports a hit too.
// A failed compile returns a *CompileError with the log; a failed write
// of the entry is not an error (the image is still returned).
func (c *Cache) Get(src, name string, opts []string) (image []byte, hit bool, err error) {
	if c.Compile == nil {
		return nil, false, errors.New("cuda: Cache.Compile is nil")
	}
	key := c.Key(src, name, opts)
	path := filepath.Join(c.dir(), key+".bin")

	c.mu.Lock()
	if call, ok := c.inflight[key]; ok {
		c.mu.Unlock()
		<-call.done
		return call.image, call.err == nil, call.err
	}
	call := &cacheCall{done: make(chan struct{})}
	if c.inflight == nil {
		c.inflight = map[string]*cacheCall{}
	}
	c.inflight[key] = call
	c.mu.Unlock()
	defer func() {
		call.image, call.err = image, err
		c.mu.Lock()
		delete(c.inflight, key)
		c.mu.Unlock()
		close(call.done)
	}()

	if img, ok := readEntry(path); ok {
		return img, true, nil
	}
	img, log, err := c.Compile(src, name, opts)
	if err != nil {
		return nil, false, &CompileError{Name: name, Log: log, Err: err}
	}
	if len(img) == 0 {
		return nil, false, &CompileError{Name: name, Log: log, Err: errors.New("cuda: the compiler returned an empty image")}
	}
	_ = writeEntry(path, img)
	return img, false, nil
}

// readEntry reads and checks an entry; ok is false when it is missing,
// unreadable, truncated or does not match its checksum.
func readEntry(path string) ([]byte, bool) {
	b, err := os.ReadFile(path)
	if err != nil || len(b) < len(cacheMagic)+sha256.Size+1 || string(b[:len(cacheMagic)]) != cacheMagic {
		return nil, false
	}
	sum := b[len(cacheMagic) : len(cacheMagic)+sha256.Size]
	img := b[len(cacheMagic)+sha256.Size:]
	if got := sha256.Sum256(img); !bytes.Equal(got[:], sum) {
		return nil, false
	}
	return img, true
}

// writeEntry stores img at path atomically: a temporary file in the same
// folder, renamed into place.
func writeEntry(path string, img []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return err
	}
	sum := sha256.Sum256(img)
	_, err = f.Write(append(append([]byte(cacheMagic), sum[:]...), img...))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// DefaultCacheDir is where compiled kernels are kept: $GPTUI_CACHE_DIR,
// else $XDG_CACHE_HOME/gptui/cuda, else ~/.cache/gptui/cuda, else
// os.TempDir()/gptui-cuda.
func DefaultCacheDir() string {
	return cacheDirFrom(os.Getenv, os.TempDir())
}

func cacheDirFrom(getenv func(string) string, tmp string) string {
	if d := getenv("GPTUI_CACHE_DIR"); d != "" {
		return d
	}
	if d := getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "gptui", "cuda")
	}
	if h := getenv("HOME"); h != "" {
		return filepath.Join(h, ".cache", "gptui", "cuda")
	}
	return filepath.Join(tmp, "gptui-cuda")
}
