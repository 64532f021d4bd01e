//go:build !linux

package engine

// mapFloats returns n zeroed float32s.
func mapFloats(n int) []float32 { return make([]float32, n) }

// release does nothing where pages cannot be given back one by one.
func release(x []float32) {}
