//go:build !amd64

package cpu

import "github.com/gptui/gptui/kernels"

// dropVec does nothing where there is no vector kernel: Apply does every
// element.
func dropVec(d kernels.Dropout, out, in []float32, first uint64) int { return 0 }
