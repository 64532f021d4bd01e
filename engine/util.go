package engine

import (
	"math"
	"slices"
)

func exp(x float64) float64 { return math.Exp(x) }

func sortStrings(s []string) { slices.Sort(s) }

// median of xs (0 for none); xs is not modified.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
