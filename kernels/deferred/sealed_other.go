//go:build !linux

package deferred

import "unsafe"

// arena is the memory of a sealed Backend, which needs Linux (memfd,
// mmap): elsewhere NewSealed's buffers are Go memory, as New's,
// and Sealed reports false.
type arena struct{}

func seal(b *Backend) {}

func (a *arena) alloc(n int) unsafe.Pointer          { panic("deferred: no sealed memory on this system") }
func (a *arena) dev(p unsafe.Pointer) unsafe.Pointer { return p }
