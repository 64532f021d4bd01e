package deferred

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// arena is the memory of a sealed Backend: chunks of shared memory, each
// mapped twice — the host's view, whose addresses the buffers have,
// PROT_NONE so that a host read or write faults; and the device's view,
// readable and writable, where the double's kernels, copies and
// poisoning work, and a communicator through Backend.Alias. Chunks are
// allocated from in turn and never reused; a chunk is twice the size of
// the one before, and the arena is unmapped when its Backend is garbage.
type arena struct {
	mu     sync.Mutex
	chunks []chunk // the last one is allocated from
	used   int     // bytes of the last chunk handed out
}

// chunk is one memfd mapped twice, at host and at dev.
type chunk struct{ host, dev []byte }

const (
	firstChunk = 1 << 20 // bytes
	allocAlign = 64      // bytes, as a GPU allocator aligns at least
)

// seal gives b an arena, unmapped once b is unreachable.
func seal(b *Backend) {
	b.mem = new(arena)
	runtime.AddCleanup(b, (*arena).release, b.mem)
}

// alloc returns the host's address of n zeroed bytes, n > 0.
func (a *arena) alloc(n int) unsafe.Pointer {
	n = (n + allocAlign - 1) &^ (allocAlign - 1)
	a.mu.Lock()
	defer a.mu.Unlock()
	if k := len(a.chunks); k == 0 || a.used+n > len(a.chunks[k-1].host) {
		size := firstChunk
		if k > 0 {
			size = 2 * len(a.chunks[k-1].host)
		}
		page := unix.Getpagesize()
		c, err := a.mapChunk(max(size, (n+page-1)&^(page-1)))
		if err != nil {
			panic(fmt.Sprintf("deferred: mapping sealed memory: %v", err))
		}
		a.chunks = append(a.chunks, c)
		a.used = 0
	}
	p := unsafe.Pointer(&a.chunks[len(a.chunks)-1].host[a.used])
	a.used += n
	return p
}

// mapChunk maps size bytes of a new memfd twice.
func (a *arena) mapChunk(size int) (chunk, error) {
	fd, err := unix.MemfdCreate("gptui-deferred", unix.MFD_CLOEXEC)
	if err != nil {
		return chunk{}, err
	}
	defer unix.Close(fd) // the mappings keep it
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return chunk{}, err
	}
	dev, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return chunk{}, err
	}
	host, err := unix.Mmap(fd, 0, size, unix.PROT_NONE, unix.MAP_SHARED)
	if err != nil {
		unix.Munmap(dev)
		return chunk{}, err
	}
	return chunk{host: host, dev: dev}, nil
}

// dev returns the device's address of the host's address p, or p if p is
// not the arena's (nil arena: an unsealed Backend).
func (a *arena) dev(p unsafe.Pointer) unsafe.Pointer {
	if a == nil {
		return p
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.chunks {
		base := unsafe.Pointer(unsafe.SliceData(c.host))
		if off := uintptr(p) - uintptr(base); uintptr(p) >= uintptr(base) && off < uintptr(len(c.host)) {
			return unsafe.Add(unsafe.Pointer(unsafe.SliceData(c.dev)), off)
		}
	}
	return p
}

// release unmaps the arena.
func (a *arena) release() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.chunks {
		unix.Munmap(c.host)
		unix.Munmap(c.dev)
	}
	a.chunks = nil
}
