package engine

import (
	"math"
	"slices"

	"github.com/gptui/gptui/engine/data"
	"github.com/gptui/gptui/kernels"
)

func exp(x float64) float64 { return math.Exp(x) }

// hostFloats returns x, a buffer of be, where the host can read it: x
// itself on a backend that computes in Go memory, else a copy downloaded
// into *buf, which it grows as needed (the copy is valid until buf is used
// again). The host never reads a device's buffer in place
// ([kernels.Memory]).
func hostFloats(be kernels.Backend, x []float32, buf *[]float32) ([]float32, error) {
	if _, ok := be.(kernels.Memory); !ok {
		return x, nil
	}
	*buf = slices.Grow((*buf)[:0], len(x))[:len(x)]
	return *buf, kernels.Download(be, *buf, x)
}

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
