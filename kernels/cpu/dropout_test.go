package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gptui/gptui/kernels"
)

// TestDropoutVector: the vector kernel (dropApply) writes
// kernels.Dropout.Apply's bits — the same mask at every probability,
// stream offset (a wrap of the 64-bit index included), length and
// alignment, in place or not, on NaNs, infinities and negative zeros.
func TestDropoutVector(t *testing.T) {
	if dropVec(kernels.Dropout{P: 0.5}, make([]float32, 8), make([]float32, 8), 0) == 0 {
		t.Log("no vector dropout on this CPU: dropApply is Apply")
	}
	r := rand.New(rand.NewPCG(3, 5))
	for _, p := range []float32{1e-7, 0.1, 0.25, 0.5, 0.9, math.Nextafter32(1, 0), math.Nextafter32(0.1, 1)} {
		for _, first := range []uint64{0, 1, 1<<40 - 3, math.MaxUint64 - 5} {
			for _, n := range []int{0, 1, 7, 8, 9, 15, 16, 17, 40, 1001} {
				for _, inPlace := range []bool{false, true} {
					name := fmt.Sprintf("p%v first%d n%d inplace%v", p, first, n, inPlace)
					d := kernels.Dropout{P: p, Key: kernels.SiteKey(r.Uint64(), 7)}
					in := make([]float32, n+3)
					for i := range in {
						in[i] = float32(r.NormFloat64())
					}
					if n > 5 {
						in[1], in[2], in[3] = float32(math.NaN()), float32(math.Inf(-1)), float32(math.Copysign(0, -1))
					}
					in = in[3-n%3:][:n] // unaligned starts
					want := make([]float32, n)
					d.Apply(want, in, first)
					got := make([]float32, n)
					if inPlace {
						copy(got, in)
						dropApply(d, got, got, first)
					} else {
						dropApply(d, got, in, first)
					}
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("%s: element %d is %v, Apply's %v", name, i, got[i], want[i])
						}
					}
				}
			}
		}
	}
}

// TestKeepThreshold: keepThreshold restates Keep's float comparison on the
// hash's top 24 bits h, at and next to the threshold.
func TestKeepThreshold(t *testing.T) {
	for _, p := range []float32{1e-7, 0.1, 0.25, 0.5, 0.9, math.Nextafter32(1, 0), 1.0 / (1 << 24), math.Nextafter32(1.0/(1<<24), 1)} {
		th := keepThreshold(p)
		for _, h := range []uint64{th - 1, th, th + 1} {
			if h >= 1<<24 {
				continue
			}
			u := float32(h) * (1.0 / (1 << 24)) // Keep's u
			if (u >= p) != (h >= th) {
				t.Errorf("p %v: h %d: Keep says %v, the threshold %d says %v", p, h, u >= p, th, h >= th)
			}
		}
	}
}

// TestDropoutVectorAtThreshold: an element whose hash equals the
// threshold exactly (P set to its top 24 bits over 2²⁴, found by
// bisection on Keep) is kept by the vector kernel too: ≥, not >.
func TestDropoutVectorAtThreshold(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 13))
	for range 20 {
		d := kernels.Dropout{Key: r.Uint64()}
		i := r.Uint64()
		lo, hi := uint64(0), uint64(1<<24) // the largest h with Keep at P = h/2²⁴
		for hi-lo > 1 {
			mid := (lo + hi) / 2
			d.P = float32(mid) / (1 << 24)
			if d.Keep(i) {
				lo = mid
			} else {
				hi = mid
			}
		}
		if lo == 0 {
			continue
		}
		d.P = float32(lo) / (1 << 24)
		in := []float32{1, 1, 1, 1, 1, 1, 1, 1}
		out := make([]float32, 8)
		dropApply(d, out, in, i-3)
		if !d.Keep(i) || out[3] != d.Scale() {
			t.Errorf("key %#x element %d at P = %d/2²⁴: Keep %v, the kernel wrote %v", d.Key, i, lo, d.Keep(i), out[3])
		}
	}
}

// BenchmarkDropout: one thread over 1 Mi elements, the vector kernel
// (dropApply) and the scalar rule (Apply).
func BenchmarkDropout(b *testing.B) {
	d := kernels.Dropout{P: 0.1, Key: kernels.SiteKey(1, 2)}
	x, y := make([]float32, 1<<20), make([]float32, 1<<20)
	for _, k := range []struct {
		name string
		f    func()
	}{{"kernel", func() { dropApply(d, y, x, 5) }}, {"apply", func() { d.Apply(y, x, 5) }}} {
		b.Run(k.name, func(b *testing.B) {
			b.SetBytes(4 << 20)
			for b.Loop() {
				k.f()
			}
		})
	}
}

// TestDropoutShortOut: an out whose capacity is short of in's length
// panics before the vector kernel writes past it, as Apply does: the
// memory beyond out's capacity keeps its values.
func TestDropoutShortOut(t *testing.T) {
	backing := make([]float32, 16)
	for i := range backing {
		backing[i] = 7
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("no panic")
			}
		}()
		in := make([]float32, 16)
		for i := range in {
			in[i] = 1
		}
		dropApply(kernels.Dropout{P: 0.1, Key: 1}, backing[:8:8], in, 0)
	}()
	for i, v := range backing[8:] {
		if v != 7 {
			t.Fatalf("element %d past out's capacity was written: %v", 8+i, v)
		}
	}
}
