package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"syscall"
	"unsafe"
)

// maxArgBytes bounds one launch's packed arguments: the 4 KiB every CUDA
// version accepts for kernel parameters.
const maxArgBytes = 4096

// maxArgs bounds the number of kernel arguments.
const maxArgs = 256

// packedArgs is the argument values of one launch laid out as the kernel
// reads them: each value at an offset aligned to its own size.
type packedArgs struct {
	buf     []byte // the values
	offsets []int  // where each argument starts in buf
}

// ArgKind is the type of a kernel argument, as ArgBits reads it.
type ArgKind byte

// The kinds of kernel argument, in the order the emulator numbers them.
const (
	ArgPtr ArgKind = iota
	ArgInt32
	ArgUint32
	ArgInt64
	ArgUint64
	ArgFloat32
	ArgFloat64
)

// Size is the argument's size in bytes.
func (k ArgKind) Size() int {
	switch k {
	case ArgInt32, ArgUint32, ArgFloat32:
		return 4
	}
	return 8
}

// ArgBits reads a kernel argument — a Ptr, int32, uint32, int64, uint64,
// float32 or float64 — as its kind and its bits (zero-extended); ok is
// false for any other type. The backend packs arguments by it and the
// emulator records them by it.
func ArgBits(a any) (kind ArgKind, bits uint64, ok bool) {
	switch v := a.(type) {
	case Ptr:
		return ArgPtr, uint64(v), true
	case int32:
		return ArgInt32, uint64(uint32(v)), true
	case uint32:
		return ArgUint32, uint64(v), true
	case int64:
		return ArgInt64, uint64(v), true
	case uint64:
		return ArgUint64, v, true
	case float32:
		return ArgFloat32, uint64(math.Float32bits(v)), true
	case float64:
		return ArgFloat64, math.Float64bits(v), true
	}
	return 0, 0, false
}

// packArgs lays out kernel arguments. Each is a Ptr, int32, uint32,
// int64, uint64, float32 or float64, stored in the machine's byte order at the next
// offset that is a multiple of its size, as the C ABI aligns a kernel's
// parameters; anything else is an error naming the argument.
func packArgs(args []any) (packedArgs, error) {
	if len(args) > maxArgs {
		return packedArgs{}, fmt.Errorf("cuda: %d kernel arguments, at most %d", len(args), maxArgs)
	}
	p := packedArgs{offsets: make([]int, len(args))}
	for i, a := range args {
		kind, bits, ok := ArgBits(a)
		if !ok {
			return packedArgs{}, fmt.Errorf("cuda: kernel argument %d is a %T; use Ptr, int32, uint32, int64, uint64, float32 or float64", i, a)
		}
		size := kind.Size()
		off := (len(p.buf) + size - 1) / size * size
		if off+size > maxArgBytes {
			return packedArgs{}, fmt.Errorf("cuda: kernel arguments exceed %d bytes at argument %d", maxArgBytes, i)
		}
		for len(p.buf) < off+size {
			p.buf = append(p.buf, 0)
		}
		if size == 4 {
			binary.NativeEndian.PutUint32(p.buf[off:], uint32(bits))
		} else {
			binary.NativeEndian.PutUint64(p.buf[off:], bits)
		}
		p.offsets[i] = off
	}
	return p, nil
}

// argArena is memory outside the Go heap where a launch's kernelParams
// (an array of pointers, one to each argument value) and the values are
// built: C never sees a Go pointer, and the GC never sees C's.
// cuLaunchKernel copies the arguments before it returns, so one arena
// serves every launch of a device, one at a time.
type argArena struct {
	mu  sync.Mutex
	mem []byte // mmap'd: maxArgs pointers, then maxArgBytes of values
}

// newArgArena maps the arena.
func newArgArena() (*argArena, error) {
	mem, err := syscall.Mmap(-1, 0, maxArgs*8+maxArgBytes, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("cuda: mapping the kernel argument arena: %w", err)
	}
	return &argArena{mem: mem}, nil
}

// close unmaps the arena.
func (a *argArena) close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mem == nil {
		return nil
	}
	err := syscall.Munmap(a.mem)
	a.mem = nil
	return err
}

// fill writes p into the arena, with the caller holding a.mu, and returns
// the address of the kernelParams array (0 when there are no arguments).
func (a *argArena) fill(p packedArgs) uintptr {
	if len(p.offsets) == 0 {
		return 0
	}
	base := uintptr(unsafe.Pointer(&a.mem[0]))
	vals := a.mem[maxArgs*8:]
	copy(vals, p.buf)
	for i, off := range p.offsets {
		binary.NativeEndian.PutUint64(a.mem[i*8:], uint64(base+uintptr(maxArgs*8+off)))
	}
	return base
}

// cmem is a block of memory outside the Go heap, for arrays C reads that
// hold pointers (NVRTC's option strings).
type cmem struct{ b []byte }

// newCmem maps n bytes (at least one page).
func newCmem(n int) (*cmem, error) {
	if n < 1 {
		n = 1
	}
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("cuda: mapping %d bytes: %w", n, err)
	}
	return &cmem{b: b}, nil
}

func (c *cmem) addr(off int) uintptr { return uintptr(unsafe.Pointer(&c.b[off])) }

// word returns the i'th pointer-sized word of the block.
func (c *cmem) word(i int) uintptr { return uintptr(binary.NativeEndian.Uint64(c.b[i*8:])) }

func (c *cmem) free() { _ = syscall.Munmap(c.b) }

// cStrings copies strs into C-side memory as NUL-terminated strings
// followed by an array of pointers to them, and returns the memory and
// the array's address (0 for no strings).
func cStrings(strs []string) (*cmem, uintptr, error) {
	n := len(strs) * 8
	for _, s := range strs {
		n += len(s) + 1
	}
	m, err := newCmem(n)
	if err != nil {
		return nil, 0, err
	}
	if len(strs) == 0 {
		return m, 0, nil
	}
	off := len(strs) * 8
	for i, s := range strs {
		copy(m.b[off:], s)
		m.b[off+len(s)] = 0
		binary.NativeEndian.PutUint64(m.b[i*8:], uint64(m.addr(off)))
		off += len(s) + 1
	}
	return m, m.addr(0), nil
}
