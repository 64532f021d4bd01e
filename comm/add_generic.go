//go:build !amd64

package comm

// addF32 adds src into dst element by element; len(src) must be at least
// len(dst).
func addF32(dst, src []float32) { addF32Go(dst, src) }
