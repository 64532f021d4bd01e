// Package emu runs gptui's CUDA kernel sources on the CPU, so that the
// kernels of package cuda are tested on machines without a GPU.
//
// src/cuda_emu.h makes CUDA C compile as C++20 under g++ (threads, blocks, shared
// memory, __syncthreads, warp shuffles, atomics, bf16 and fp16 values, and
// the tensor-core and copy instructions the kernels use; see its comment), and
// src/driver.cpp replays a script of launches over host buffers. [Build]
// compiles the very source NVRTC gets (cuda.Source()) with them into one
// host binary; a [Machine] is a [cuda.Launcher] over that binary: it holds
// host copies of the buffers, records launches, and [Machine.Run] replays
// them in a child process and reads the buffers back.
//
// Typical test use (package cuda_test):
//
//	prog, err := emu.Build(ctx, t.TempDir(), cuda.Source(), emu.Options{CacheDir: emu.DefaultCacheDir()})
//	m := prog.NewMachine()
//	k, err := cuda.NewKernels(m, m.Lookup)
//	x := m.Float32s(input)              // a device pointer to a copy of input
//	err = k.Scale(0, x, len(input), 2)  // recorded, not run
//	err = m.Run(ctx)                    // runs every recorded launch
//	got := m.ReadFloat32s(x, len(input))
//
// [BuildLibrary] compiles the same sources into a shared library instead
// (src/library.cpp), which the stand-in libcuda.so.1 of internal/standin
// loads in place of a CUBIN: package cuda's whole Backend then runs its
// kernels here, launched as on a GPU.
//
// Building takes seconds, so a test package builds once (sync.Once), with
// Options.CacheDir set so that later runs of the tests take the program
// from the cache, and makes a Machine per test. Device pointers are fake addresses, (buffer+1)<<32
// plus a byte offset, so a Ptr plus an offset points into the same buffer
// and alignment is that of the offset (buffers are 256-byte aligned, as
// cuMemAlloc's are). Every kernel argument's Go type must match the kernel
// parameter's C type (int32 ↔ int, int64 ↔ long long, uint64 ↔ unsigned long
// long, float32 ↔ float, float64 ↔ double, Ptr ↔ any pointer), or Run fails
// naming the launch and the argument.
package emu

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	"github.com/gptui/gptui/kernels/cuda"
	"github.com/gptui/gptui/kernels/cuda/emu/filecache"
	"golang.org/x/sys/cpu"
)

//go:embed src/cuda_emu.h
var header []byte

//go:embed src/driver.cpp
var driver []byte

//go:embed src/library.cpp
var library []byte

// Options tune Build.
type Options struct {
	// Sanitize builds with AddressSanitizer and UBSan, so an out-of-bounds
	// access by a kernel fails the run instead of going unnoticed.
	Sanitize bool
	// Opt is the optimisation flag; empty means -O1.
	Opt string
	// CacheDir, when set, keeps each program built there under the SHA-256
	// of all that goes into it (g++'s version, the flags, the emulator's
	// sources and the kernels' source), and a Build with the same inputs
	// takes the program from there instead of compiling it again, as Go's
	// build cache does. [DefaultCacheDir] is the usual place.
	CacheDir string

	extra []string // BuildLibrary's flags
}

// contractFlags are g++'s flags that fuse a·b+c into one FMA as NVRTC does
// (its --fmad=true default, on every GPU since Fermi): where the host has
// FMA instructions the emulated kernels then round as the GPU's do, and a
// kernel that claims the CPU's bits must keep its arithmetic out of reach
// of the contraction (__fmul_rn and friends), as on the GPU. Without FMA
// on the host (an x86 CPU before Haswell) no contraction is possible, and
// the flags turn it off. The contraction pass of g++ runs with
// -fexpensive-optimizations, part of -O2, so it is named for -O1 too.
func contractFlags() []string {
	switch {
	case runtime.GOARCH == "arm64":
		return []string{"-ffp-contract=fast", "-fexpensive-optimizations"}
	case runtime.GOARCH == "amd64" && cpu.X86.HasFMA:
		return []string{"-ffp-contract=fast", "-fexpensive-optimizations", "-mfma"}
	}
	return []string{"-ffp-contract=off"}
}

// Contracts reports whether programs built here fuse multiplies and adds
// into FMAs as the GPU does (see contractFlags).
func Contracts() bool { return contractFlags()[0] == "-ffp-contract=fast" }

// DefaultCacheDir is gptui/emu under the user's cache directory, or "" (no
// cache) where there is none.
func DefaultCacheDir() string { return filecache.Dir("emu") }

// kernelRE matches a kernel's definition in preprocessed source.
var kernelRE = regexp.MustCompile(`extern\s+"C"\s+__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(`)

// externSharedRE matches a declaration of dynamic shared memory, which
// Build rewrites into a pointer to the launch's dynamic shared memory (the
// one CUDA construct a macro cannot turn into C++).
var externSharedRE = regexp.MustCompile(`extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?(\w+)\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?(\w+)\s*\[\s*\]\s*;`)

// Program is the kernel source compiled with the emulator.
type Program struct {
	bin   string
	names []string
	index map[string]int
}

// Compiler returns the path of g++, or an error saying it is missing.
func Compiler() (string, error) {
	p, err := exec.LookPath("g++")
	if err != nil {
		return "", fmt.Errorf("emu: g++ not found on PATH (install g++ 12 or later): %w", err)
	}
	return p, nil
}

// Build compiles source (the kernels, as NVRTC would get them) with the
// emulator into a host program in dir. The kernels are the source's
// `extern "C" __global__` functions, found after preprocessing (so kernels
// stamped out by macros count), numbered by Lookup in source order.
func Build(ctx context.Context, dir, source string, opt Options) (*Program, error) {
	gxx, args, cached, err := compileArgs(ctx, opt, driver, source)
	if err != nil {
		return nil, err
	}
	if cached != "" {
		if p, err := loadProgram(cached); err == nil {
			return p, nil
		}
	}
	names, err := prepare(ctx, gxx, dir, source, "driver.cpp", driver)
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(dir, "driver")
	cmd := exec.CommandContext(ctx, gxx, append(args, "-o", bin, filepath.Join(dir, "driver.cpp"))...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("emu: compiling the kernels: %w\n%s", err, out)
	}
	if cached != "" {
		storeProgram(cached, bin, names) // a cache: a failed store costs the next Build a compile
	}
	index := map[string]int{}
	for i, n := range names {
		index[n] = i
	}
	return &Program{bin: bin, names: names, index: index}, nil
}

// LibraryName is the file BuildLibrary writes.
const LibraryName = "libgptuiemu.so"

// BuildLibrary compiles source with the emulator into a shared library,
// dir/libgptuiemu.so (src/library.cpp says what it exports), and returns
// its path: the kernels the stand-in libcuda.so.1 of internal/standin runs
// when package cuda launches them, so that a whole Backend runs on the
// CPU. It is cached as Build's programs are.
func BuildLibrary(ctx context.Context, dir, source string, opt Options) (string, error) {
	hash := fmt.Sprintf("-DGPTUI_EMU_SOURCE_HASH=%#xULL", SourceHash(source))
	opt.extra = []string{"-fPIC", "-shared", hash}
	gxx, args, cached, err := compileArgs(ctx, opt, library, source)
	if err != nil {
		return "", err
	}
	if cached != "" {
		if p := filepath.Join(cached, LibraryName); fileExists(p) {
			return p, nil
		}
	}
	if _, err := prepare(ctx, gxx, dir, source, "library.cpp", library); err != nil {
		return "", err
	}
	lib := filepath.Join(dir, LibraryName)
	cmd := exec.CommandContext(ctx, gxx, append(args, "-o", lib, filepath.Join(dir, "library.cpp"))...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("emu: compiling the kernels' library: %w\n%s", err, out)
	}
	if cached != "" {
		_ = filecache.Store(cached, map[string]string{LibraryName: lib}) // a cache not written is only slower
		if p := filepath.Join(cached, LibraryName); fileExists(p) {
			return p, nil
		}
	}
	return lib, nil
}

// SourceHash is FNV-1a (64 bits) of source: what the stand-in libnvrtc
// writes into its images and the library built from source returns.
func SourceHash(source string) uint64 {
	h := fnv.New64a()
	io.WriteString(h, source)
	return h.Sum64()
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// compileArgs returns g++, its flags for opt, and the cache entry of a
// build of main (the emulator's driver or library) with source ("" without
// a cache).
func compileArgs(ctx context.Context, opt Options, main []byte, source string) (gxx string, args []string, cached string, err error) {
	gxx, err = Compiler()
	if err != nil {
		return "", nil, "", err
	}
	o := opt.Opt
	if o == "" {
		o = "-O1"
	}
	args = []string{"-std=c++20", o, "-pthread", "-Wall", "-Wno-unused-function", "-Wno-unused-variable"}
	args = append(args, contractFlags()...)
	if opt.Sanitize {
		args = append(args, "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer")
	}
	args = append(args, opt.extra...)
	if opt.CacheDir != "" {
		version, err := exec.CommandContext(ctx, gxx, "--version").Output()
		if err != nil {
			return "", nil, "", fmt.Errorf("emu: %s --version: %w", gxx, err)
		}
		cached = filepath.Join(opt.CacheDir, filecache.Key(version, strings.Join(args, " "), header, main, source))
	}
	return gxx, args, cached, nil
}

// prepare writes into dir what g++ compiles: the kernels (source with its
// dynamic shared memory rewritten), the emulator's header, main as
// mainName and the registry of the kernels, registry.inc (one
// EMU_ENTRY(name) a line, which main defines); it returns the kernels'
// names in source order.
func prepare(ctx context.Context, gxx, dir, source, mainName string, main []byte) ([]string, error) {
	source = externSharedRE.ReplaceAllString(source, "$1* $2 = ($1*)emu::dynamic_shared();")
	if err := os.WriteFile(filepath.Join(dir, "kernels.cu"), []byte(source), 0o644); err != nil {
		return nil, fmt.Errorf("emu: %w", err)
	}
	pre, err := exec.CommandContext(ctx, gxx, "-std=c++20", "-E", "-P", "-x", "c++", filepath.Join(dir, "kernels.cu")).Output()
	if err != nil {
		return nil, fmt.Errorf("emu: preprocessing the kernels: %w", err)
	}
	var names []string
	var reg strings.Builder
	seen := map[string]bool{}
	for _, m := range kernelRE.FindAllSubmatch(pre, -1) {
		n := string(m[1])
		if seen[n] {
			continue
		}
		seen[n] = true
		names = append(names, n)
		fmt.Fprintf(&reg, "EMU_ENTRY(%s)\n", n)
	}
	files := map[string][]byte{
		"cuda_emu.h":   header,
		mainName:       main,
		"registry.inc": []byte(reg.String()),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return nil, fmt.Errorf("emu: %w", err)
		}
	}
	return names, nil
}

// loadProgram returns the program stored in the cache entry dir: its
// binary, driver, and its kernels' names, one a line in names.
func loadProgram(dir string) (*Program, error) {
	b, err := os.ReadFile(filepath.Join(dir, "names"))
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(dir, "driver")
	if _, err := os.Stat(bin); err != nil {
		return nil, err
	}
	p := &Program{bin: bin, index: map[string]int{}}
	for _, n := range strings.Fields(string(b)) {
		p.index[n] = len(p.names)
		p.names = append(p.names, n)
	}
	return p, nil
}

// storeProgram stores bin and names as the cache entry dir.
func storeProgram(dir, bin string, names []string) {
	tmp, err := os.CreateTemp(filepath.Dir(bin), "names-")
	if err != nil {
		return
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(strings.Join(names, "\n") + "\n")
	if tmp.Close() != nil || err != nil {
		return
	}
	_ = filecache.Store(dir, map[string]string{"driver": bin, "names": tmp.Name()}) // a cache not written is only slower
}

// Names returns the kernels' names, in the order Lookup numbers them.
func (p *Program) Names() []string { return p.names }

// NewMachine returns an empty Machine running p.
func (p *Program) NewMachine() *Machine {
	return &Machine{p: p}
}

// Machine holds host copies of device buffers and the launches recorded
// since the last Run. It implements [cuda.Launcher]. It is not safe for
// concurrent use.
type Machine struct {
	// SharedLimit is the most dynamic shared memory a launch may ask for;
	// zero means 48 KiB, a GPU's limit without cuFuncSetAttribute.
	SharedLimit int

	p        *Program
	bufs     [][]byte
	launches []launch
}

type launch struct {
	fn          int
	grid, block cuda.Dim3
	shared      uint64
	kinds       []byte
	bits        []uint64
}

// Lookup returns the Function for a kernel name; it has the signature
// cuda.NewKernels takes.
func (m *Machine) Lookup(name string) (cuda.Function, error) {
	i, ok := m.p.index[name]
	if !ok {
		return 0, fmt.Errorf("emu: no kernel %q in the program", name)
	}
	return cuda.Function(i + 1), nil
}

// Alloc returns a pointer to n zero bytes.
func (m *Machine) Alloc(n int) cuda.Ptr {
	m.bufs = append(m.bufs, make([]byte, n))
	return cuda.Ptr(uint64(len(m.bufs)) << 32)
}

// Float32s returns a pointer to a copy of x.
func (m *Machine) Float32s(x []float32) cuda.Ptr {
	p := m.Alloc(4 * len(x))
	b := m.bufs[len(m.bufs)-1]
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return p
}

// Float64s returns a pointer to a copy of x.
func (m *Machine) Float64s(x []float64) cuda.Ptr {
	p := m.Alloc(8 * len(x))
	b := m.bufs[len(m.bufs)-1]
	for i, v := range x {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	}
	return p
}

// Int32s returns a pointer to a copy of x.
func (m *Machine) Int32s(x []int32) cuda.Ptr {
	p := m.Alloc(4 * len(x))
	b := m.bufs[len(m.bufs)-1]
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	}
	return p
}

// Uint16s returns a pointer to a copy of x (bf16 or fp16 bits).
func (m *Machine) Uint16s(x []uint16) cuda.Ptr {
	p := m.Alloc(2 * len(x))
	b := m.bufs[len(m.bufs)-1]
	for i, v := range x {
		binary.LittleEndian.PutUint16(b[2*i:], v)
	}
	return p
}

// Bytes returns the n bytes at p as of the last Run (or allocation); the
// slice aliases the machine's copy.
func (m *Machine) Bytes(p cuda.Ptr, n int) []byte {
	buf := int(uint64(p)>>32) - 1
	off := int(uint64(p) & 0xffffffff)
	if buf < 0 || buf >= len(m.bufs) || off+n > len(m.bufs[buf]) {
		panic(fmt.Sprintf("emu: %d bytes at %#x are outside every buffer", n, uint64(p)))
	}
	return m.bufs[buf][off : off+n]
}

// ReadFloat32s returns the n floats at p.
func (m *Machine) ReadFloat32s(p cuda.Ptr, n int) []float32 {
	b := m.Bytes(p, 4*n)
	x := make([]float32, n)
	for i := range x {
		x[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return x
}

// ReadFloat64s returns the n doubles at p.
func (m *Machine) ReadFloat64s(p cuda.Ptr, n int) []float64 {
	b := m.Bytes(p, 8*n)
	x := make([]float64, n)
	for i := range x {
		x[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return x
}

// ReadInt32s returns the n ints at p.
func (m *Machine) ReadInt32s(p cuda.Ptr, n int) []int32 {
	b := m.Bytes(p, 4*n)
	x := make([]int32, n)
	for i := range x {
		x[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return x
}

// ReadUint16s returns the n 16-bit values at p.
func (m *Machine) ReadUint16s(p cuda.Ptr, n int) []uint16 {
	b := m.Bytes(p, 2*n)
	x := make([]uint16, n)
	for i := range x {
		x[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return x
}

// Pending is the number of launches recorded since the last Run.
func (m *Machine) Pending() int { return len(m.launches) }

// Launch records a launch after checking what a GPU would refuse: an empty
// or oversized grid or block, too much dynamic shared memory, an argument
// of a type a kernel cannot take. The stream is ignored (launches run in
// order).
func (m *Machine) Launch(f cuda.Function, grid, block cuda.Dim3, shared int, s cuda.Stream, args ...any) error {
	fn := int(f) - 1
	if fn < 0 || fn >= len(m.p.names) {
		return fmt.Errorf("emu: launch of unknown function %d", f)
	}
	name := m.p.names[fn]
	nt := uint64(block.X) * uint64(block.Y) * uint64(block.Z)
	switch {
	case nt == 0 || nt > 1024 || block.Z > 64:
		return fmt.Errorf("emu: %s: block %v (1 to 1024 threads, z ≤ 64)", name, block)
	case grid.X == 0 || grid.Y == 0 || grid.Z == 0 || grid.X > math.MaxInt32 || grid.Y > 65535 || grid.Z > 65535:
		return fmt.Errorf("emu: %s: grid %v", name, grid)
	}
	limit := m.SharedLimit
	if limit == 0 {
		limit = 48 << 10
	}
	if shared < 0 || shared > limit {
		return fmt.Errorf("emu: %s: %d bytes of dynamic shared memory (limit %d)", name, shared, limit)
	}
	l := launch{fn: fn, grid: grid, block: block, shared: uint64(shared)}
	for i, a := range args {
		k, b, ok := cuda.ArgBits(a)
		if !ok {
			return fmt.Errorf("emu: %s: argument %d has Go type %T, which no kernel takes", name, i, a)
		}
		l.kinds = append(l.kinds, byte(k))
		l.bits = append(l.bits, b)
	}
	m.launches = append(m.launches, l)
	return nil
}

// Run replays the recorded launches in a child process over the machine's
// buffers and reads them back. The recorded launches are dropped, run or
// not.
func (m *Machine) Run(ctx context.Context) error {
	launches := m.launches
	m.launches = nil
	var w bytes.Buffer
	w.WriteString("EMU1")
	put := func(v any) { binary.Write(&w, binary.LittleEndian, v) }
	put(uint32(len(m.bufs)))
	for _, b := range m.bufs {
		put(uint64(len(b)))
		w.Write(b)
	}
	put(uint32(len(launches)))
	for _, l := range launches {
		put(uint32(l.fn))
		put([3]uint32{l.grid.X, l.grid.Y, l.grid.Z})
		put([3]uint32{l.block.X, l.block.Y, l.block.Z})
		put(l.shared)
		put(uint32(len(l.kinds)))
		for i, k := range l.kinds {
			put(k)
			put(l.bits[i])
		}
	}
	dir, err := os.MkdirTemp("", "gptui-emu-")
	if err != nil {
		return fmt.Errorf("emu: %w", err)
	}
	defer os.RemoveAll(dir)
	script, output := filepath.Join(dir, "script"), filepath.Join(dir, "output")
	if err := os.WriteFile(script, w.Bytes(), 0o644); err != nil {
		return fmt.Errorf("emu: %w", err)
	}
	cmd := exec.CommandContext(ctx, m.p.bin, script, output)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("emu: running %d launches: %w\n%s", len(launches), err, stderr.Bytes())
	}
	out, err := os.ReadFile(output)
	if err != nil {
		return fmt.Errorf("emu: %w", err)
	}
	r := bytes.NewReader(out)
	var n uint32
	if err := binary.Read(r, binary.LittleEndian, &n); err != nil || int(n) != len(m.bufs) {
		return errors.New("emu: the driver's output does not match the buffers")
	}
	for _, b := range m.bufs {
		var size uint64
		if err := binary.Read(r, binary.LittleEndian, &size); err != nil || size != uint64(len(b)) {
			return errors.New("emu: the driver's output does not match the buffers")
		}
		if _, err := io.ReadFull(r, b); err != nil {
			return fmt.Errorf("emu: reading the driver's output: %w", err)
		}
	}
	return nil
}
