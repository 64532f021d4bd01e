//go:build !linux

package kernels

import "unsafe"

// adviseHuge asks for huge pages on Linux only.
func adviseHuge(p unsafe.Pointer, bytes uintptr) {}
