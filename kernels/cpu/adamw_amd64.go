package cpu

// adamwSSE runs the AdamW loop on n elements, n a multiple of 4
// (adamw_amd64.s).
//
//go:noescape
func adamwSSE(pp, gg, mm, vv *float32, n int, k *[10]float32)

// adamwVec updates the first len(p) &^ 3 elements with SSE and returns how
// many it did.
func adamwVec(p, g, m, v []float32, k *[10]float32) int {
	n := len(p) &^ 3
	if n == 0 {
		return 0
	}
	g, m, v = g[:n], m[:n], v[:n]
	adamwSSE(&p[0], &g[0], &m[0], &v[0], n, k)
	return n
}
