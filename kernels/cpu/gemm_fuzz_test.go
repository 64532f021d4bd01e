package cpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// FuzzSgemm checks every built-in kernel this CPU has, with one and two
// threads, against the float64 reference on fuzzed shapes, transposes,
// strides and scalars, and the bf16 kernel (where the CPU has it) against
// bgemmRef bit for bit. Run with
//
//	go test ./kernels/cpu -run XXX -fuzz FuzzSgemm -fuzztime 60s
func FuzzSgemm(f *testing.F) {
	f.Add(uint16(1), uint16(1), uint16(1), uint8(0), uint8(0), uint8(0), uint64(1))
	f.Add(uint16(17), uint16(50), uint16(33), uint8(3), uint8(5), uint8(1), uint64(2))
	f.Add(uint16(9), uint16(97), uint16(300), uint8(1), uint8(2), uint8(2), uint64(3))
	f.Add(uint16(130), uint16(3), uint16(2), uint8(2), uint8(7), uint8(3), uint64(4))
	kernels := fp32Kernels()
	type backend struct {
		name string
		be   *Backend
	}
	var bs []backend
	for _, k := range kernels {
		for _, th := range []string{"1", "2"} {
			bs = append(bs, backend{k.name + "/" + th, testBackend(f, config{blas: "go", kernel: k.name, threads: th})})
		}
	}
	var bf16 *Backend
	if k, _ := bf16Kernel(); k != nil {
		bf16 = testBackend(f, config{blas: "go", threads: "2", bf16: true})
	}
	scalars := []struct{ alpha, beta float32 }{{1, 0}, {1, 1}, {0.5, -2}, {-1.5, 0.25}, {2, 0}, {0, 3}}
	f.Fuzz(func(t *testing.T, m16, n16, k16 uint16, flags, pads, sc uint8, seed uint64) {
		// Shapes up to 200 in each dimension (a k past 2·kc for three
		// blocks), kept small enough that the reference stays fast.
		m, n, k := int(m16%200)+1, int(n16%200)+1, int(k16%600)+1
		if m*n*k > 1<<21 {
			k = max(1, (1<<21)/(m*n))
		}
		transA, transB := flags&1 != 0, flags&2 != 0
		s := scalars[int(sc)%len(scalars)]
		r := rand.New(rand.NewPCG(seed, uint64(m*n*k)))
		ar, ac, br, bc := m, k, k, n
		if transA {
			ar, ac = k, m
		}
		if transB {
			br, bc = n, k
		}
		a := newStored(r, ar, ac, int(pads&3), padValue)
		b := newStored(r, br, bc, int(pads>>2&7), padValue)
		c0 := newStored(r, m, n, int(pads>>5), cPad)
		if s.beta == 0 {
			for i := range m {
				for j := range n {
					c0.data[i*c0.ld+j] = float32(math.NaN())
				}
			}
		}
		prod, mag := refGemm(transA, transB, m, n, k, a, b)
		for _, p := range bs {
			c := stored{m, n, c0.ld, slices.Clone(c0.data)}
			p.be.Sgemm(transA, transB, m, n, k, s.alpha, a.data, a.ld, b.data, b.ld, s.beta, c.data, c.ld)
			checkGemm(t, c, c0, prod, mag, s.alpha, s.beta)
			if t.Failed() {
				t.Fatalf("%s: %dx%dx%d tA=%v tB=%v lda=%d ldb=%d ldc=%d alpha=%g beta=%g", p.name, m, n, k, transA, transB, a.ld, b.ld, c.ld, s.alpha, s.beta)
			}
		}
		if bf16 == nil || s.alpha == 0 {
			return
		}
		want := slices.Clone(c0.data)
		bgemmRef(transA, transB, m, n, k, s.alpha, a.data, a.ld, b.data, b.ld, s.beta, want, c0.ld, bf16.bf16.kc)
		got := slices.Clone(c0.data)
		bf16.gemm(bf16.bf16, &gemmArgs{transA, transB, m, n, k, s.alpha, s.beta, a.data, a.ld, b.data, b.ld, got, c0.ld})
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("bf16 %dx%dx%d tA=%v tB=%v alpha=%g beta=%g: element %d = %v, model %v", m, n, k, transA, transB, s.alpha, s.beta, i, got[i], want[i])
			}
		}
	})
}
