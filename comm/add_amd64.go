package comm

// addF32SSE adds src[0:n] into dst[0:n] (add_amd64.s).
//
//go:noescape
func addF32SSE(dst, src *float32, n int)

// addF32 adds src into dst element by element; len(src) must be at least
// len(dst).
func addF32(dst, src []float32) {
	if len(dst) == 0 {
		return
	}
	src = src[:len(dst)]
	addF32SSE(&dst[0], &src[0], len(dst))
}
