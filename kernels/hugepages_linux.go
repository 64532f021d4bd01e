package kernels

import (
	"syscall"
	"unsafe"
)

// hugeMin is the smallest buffer adviseHuge asks huge pages for.
const hugeMin = 8 << 20

// adviseHuge asks Linux for transparent huge pages (madvise
// MADV_HUGEPAGE) over the 2 MiB pages wholly inside x, when x is at least
// hugeMin bytes, before its first touch: where the kernel's setting is
// "madvise" (Debian's and Ubuntu's default) each 2 MiB then costs one page
// fault rather than 512, and the GEMMs that read it fewer TLB misses.
// Where huge pages are off, or the call fails, nothing changes.
func adviseHuge(p unsafe.Pointer, bytes uintptr) {
	if bytes < hugeMin {
		return
	}
	const huge = 2 << 20
	lo := (uintptr(p) + huge - 1) &^ (huge - 1)
	hi := (uintptr(p) + bytes) &^ (huge - 1)
	if hi <= lo {
		return
	}
	syscall.Syscall(syscall.SYS_MADVISE, lo, hi-lo, 14 /* MADV_HUGEPAGE */)
}
