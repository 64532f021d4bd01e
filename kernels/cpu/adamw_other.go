//go:build !amd64

package cpu

// adamwVec does nothing where there is no vector version: the scalar loop
// updates every element.
func adamwVec(p, g, m, v []float32, k *[10]float32) int { return 0 }
