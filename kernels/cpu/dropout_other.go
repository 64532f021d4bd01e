//go:build !amd64

package cpu

// dropVecN is 0 where there is no vector kernel: kernels.Dropout.Apply
// does every element.
func dropVecN(n int) int { return 0 }

func dropVec(out, in []float32, n int, key, first, th uint64, scale float32) {
	panic("cpu: no vector dropout on this architecture")
}
