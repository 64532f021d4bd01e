package engine

import (
	"os"
	"syscall"
	"unsafe"
)

// mapFloats returns n zeroed float32s in their own anonymous mapping, whose
// pages release can give back to the system (sharding stage 3 frees the
// parameters it is not using).
func mapFloats(n int) []float32 {
	if n == 0 {
		return nil
	}
	b, err := syscall.Mmap(-1, 0, 4*n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return make([]float32, n)
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
}

// release gives back the memory pages lying wholly inside x (which must
// come from mapFloats); they read as zeros afterwards. Elements on pages
// shared with neighbours keep their values.
func release(x []float32) {
	if len(x) == 0 {
		return
	}
	page := uintptr(os.Getpagesize())
	start := uintptr(unsafe.Pointer(&x[0]))
	end := start + 4*uintptr(len(x))
	lo := (start + page - 1) &^ (page - 1)
	hi := end &^ (page - 1)
	if hi <= lo {
		return
	}
	all := unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x))
	syscall.Madvise(all[lo-start:hi-start], syscall.MADV_DONTNEED)
}
