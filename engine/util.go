package engine

import (
	"math"
	"slices"

	"github.com/gptui/gptui/engine/data"
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

// widen returns 16-bit tokens as tokens of type T: toks itself for
// uint16, a copy for uint32 (the built-in corpus, read by a model whose
// vocabulary needs 32-bit shards).
func widen[T data.Token](toks []uint16) []T {
	if t, ok := any(toks).([]T); ok {
		return t
	}
	out := make([]T, len(toks))
	for i, v := range toks {
		out[i] = T(v)
	}
	return out
}
