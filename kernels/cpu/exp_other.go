//go:build !amd64

package cpu

import "math"

// expShiftVec does nothing where there is no vector version: the scalar
// loop does every element.
func expShiftVec(x []float32, m float32, s *[4]float64) int { return 0 }

// maxVec looks at nothing where there is no vector version.
func maxVec(x []float32) (float32, int) { return float32(math.Inf(-1)), 0 }

// scaleVec does nothing where there is no vector version.
func scaleVec(x []float32, s float32) int { return 0 }
