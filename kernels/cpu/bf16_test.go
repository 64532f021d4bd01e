package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// The bf16 GEMM is checked bit for bit against a scalar model of what the
// kernel computes: bf16Bits for the rounding while packing, dpbf16Ref for
// one VDPBF16PS lane, and bgemmRef for the kernel's order of accumulation.
// The model runs everywhere; the kernel is compared with it where the CPU
// has AVX512_BF16.

// dpbf16Ref is one fp32 lane of VDPBF16PS: acc plus the products of the
// bf16 pairs a and b (low half: even k, high half: odd k), as measured on
// an AMD EPYC (Zen 5) and as Intel documents it: the odd product is added
// first, then the even one, each addition rounded to nearest even (the
// products are exact in fp32, so each step is one fused multiply-add);
// denormal inputs (bf16 values and acc) read as zero and denormal results,
// the intermediate one included, are flushed to a zero of their sign.
func dpbf16Ref(acc float32, a, b uint32) float32 {
	acc = flushDenormal(acc)
	acc = flushDenormal(addExact(acc, bf16Value(a>>16), bf16Value(b>>16)))
	return flushDenormal(addExact(acc, bf16Value(a&0xffff), bf16Value(b&0xffff)))
}

// bf16Value is the fp32 value of bf16 bits h, a denormal read as zero.
func bf16Value(h uint32) float32 {
	return flushDenormal(math.Float32frombits(h << 16))
}

// flushDenormal returns ±0 for a denormal x, else x.
func flushDenormal(x float32) float32 {
	if u := math.Float32bits(x); u&0x7f800000 == 0 {
		return math.Float32frombits(u & 0x80000000)
	}
	return x
}

// addExact returns acc + x·y rounded once to fp32 (ties to even), as a
// fused multiply-add does. x·y is exact in float64; so is the float64 sum
// up to the error e that TwoSum recovers, which decides the one case where
// rounding the float64 sum to fp32 could go the wrong way: a sum exactly
// halfway between two fp32 values.
func addExact(acc, x, y float32) float32 {
	p := float64(x) * float64(y)
	a := float64(acc)
	s := a + p
	if math.IsInf(s, 0) || math.IsNaN(s) {
		return float32(s)
	}
	bb := s - a
	e := (a - (s - bb)) + (p - bb) // s + e = a + p exactly
	r := float32(s)
	if e == 0 || float64(r) == s {
		return r
	}
	lo, hi := r, r
	if float64(r) < s {
		hi = math.Nextafter32(r, float32(math.Inf(1)))
	} else {
		lo = math.Nextafter32(r, float32(math.Inf(-1)))
	}
	if (float64(lo)+float64(hi))/2 != s {
		return r // not a tie: e cannot move s across the midpoint
	}
	if e > 0 {
		return hi
	}
	return lo
}

// bgemmRef is the bf16 GEMM as the kernels compute it, one element at a
// time: op(A) and op(B) rounded by bf16Bits and paired along k (a zero
// high half past an odd k), each block of kc pairs accumulated from +0 in
// pair order with dpbf16Ref, then stored as the micro-kernel stores:
// C = alpha·acc + beta·C with two roundings (alpha·acc alone for beta 0),
// beta 1 after the first block.
func bgemmRef(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc, kc int) {
	opA := func(i, p int) float32 {
		if transA {
			return a[p*lda+i]
		}
		return a[i*lda+p]
	}
	opB := func(p, j int) float32 {
		if transB {
			return b[j*ldb+p]
		}
		return b[p*ldb+j]
	}
	pair := func(f func(int) float32, q int) uint32 {
		w := bf16Bits(f(2 * q))
		if 2*q+1 < k {
			w |= bf16Bits(f(2*q+1)) << 16
		}
		return w
	}
	pairs := (k + 1) / 2
	for i := range m {
		for j := range n {
			bet := beta
			for q0 := 0; q0 < pairs; q0 += kc {
				var acc float32
				for q := q0; q < min(q0+kc, pairs); q++ {
					acc = dpbf16Ref(acc, pair(func(p int) float32 { return opA(i, p) }, q), pair(func(p int) float32 { return opB(p, j) }, q))
				}
				t := float32(alpha * acc) // conversions: no fused multiply-add
				if bet != 0 {
					t += float32(bet * c[i*ldc+j])
				}
				c[i*ldc+j] = t
				bet = 1
			}
		}
	}
}

// TestBF16Bits: rounding to nearest even, denormals to signed zero, NaNs
// quiet, overflow to infinity, as VCVTNEPS2BF16 does on the EPYC these
// values were measured on.
func TestBF16Bits(t *testing.T) {
	tests := []struct{ in, want uint32 }{
		{0x3f800000, 0x3f80}, // 1
		{0x3f808000, 0x3f80}, // tie, even below
		{0x3f818000, 0x3f82}, // tie, even above
		{0x3f808001, 0x3f81}, // above the tie
		{0x3f807fff, 0x3f80}, // below the tie
		{0xbf818000, 0xbf82}, // negative tie
		{0x00400000, 0x0000}, // denormal
		{0x80018000, 0x8000}, // negative denormal
		{0x00800000, 0x0080}, // smallest normal
		{0x00807fff, 0x0080},
		{0x80000000, 0x8000}, // −0
		{0x7f7fffff, 0x7f80}, // rounds past the largest bf16
		{0x7f7f8000, 0x7f80},
		{0x7f800000, 0x7f80}, // +Inf
		{0xff800000, 0xff80}, // −Inf
		{0x7fa12345, 0x7fe1}, // signalling NaN, made quiet
		{0xffa12345, 0xffe1},
		{0x7f800001, 0x7fc0},
		{0x7fc00001, 0x7fc0},
	}
	for _, tt := range tests {
		if got := bf16Bits(math.Float32frombits(tt.in)); got != tt.want {
			t.Errorf("bf16Bits(%#08x) = %#04x, want %#04x", tt.in, got, tt.want)
		}
	}
}

// dpbf16Cases are single VDPBF16PS lanes measured on an AMD EPYC (Zen 5):
// acc, the pairs (low half even k, high half odd k) and the result.
var dpbf16Cases = []struct {
	name      string
	acc, a, b uint32
	want      uint32
}{
	// 1 + 2⁻²⁴ + 2⁻²⁴: each addition rounds (a single rounding of the sum would give 1+2⁻²³).
	{"two rounded adds", 0x3f800000, 0x3f803f80, 0x33803380, 0x3f800000},
	// even 2⁻²⁴, odd 1.5·2⁻²⁴: odd first gives 1+2⁻²²; even first would give 1+2⁻²³.
	{"odd product first", 0x3f800000, 0x3f803f80, 0x33c03380, 0x3f800002},
	{"odd product first, swapped", 0x3f800000, 0x3f803f80, 0x338033c0, 0x3f800001},
	// a denormal bf16 reads as zero: 2⁻¹²⁷·2¹⁰⁰ gives 0, not 2⁻²⁷.
	{"denormal input", 0x00000000, 0x00000040, 0x00007180, 0x00000000},
	// 2⁻⁷⁰·2⁻⁷⁰ = 2⁻¹⁴⁰ is denormal: flushed.
	{"denormal result", 0x00000000, 0x00001c80, 0x00001c80, 0x00000000},
	{"denormal result, negative", 0x00000000, 0x00009c80, 0x00001c80, 0x80000000},
	// 2⁻¹²⁶ − 1.5·2⁻¹²⁷ = 2⁻¹²⁸ after the odd product is flushed before
	// the even one (2⁻¹²⁶) is added: 2⁻¹²⁶, not 1.25·2⁻¹²⁶.
	{"denormal intermediate", 0x00800000, 0x80c00080, 0x3f003f80, 0x00800000},
	{"zeros keep −0", 0x80000000, 0x80008000, 0x00000000, 0x80000000},
	{"overflow then back", 0x3f800000, 0x7f007f00, 0xc0004000, 0xff800000},
	{"inf − inf", 0x3f800000, 0x7f807f80, 0xbf803f80, 0xffc00000},
}

// TestDPBF16Ref: the scalar model of VDPBF16PS gives what the instruction
// gave on an AMD EPYC for cases that tell the orders and flushes apart.
func TestDPBF16Ref(t *testing.T) {
	for _, tt := range dpbf16Cases {
		got := math.Float32bits(dpbf16Ref(math.Float32frombits(tt.acc), tt.a, tt.b))
		if got != tt.want && !(isNaN32(got) && isNaN32(tt.want)) { // NaN bits differ across architectures
			t.Errorf("%s: dpbf16Ref(%#08x, %#08x, %#08x) = %#08x, want %#08x", tt.name, tt.acc, tt.a, tt.b, got, tt.want)
		}
	}
}

// TestDPBF16Kernel runs dpbf16Cases through the bf16 micro-kernel where
// the CPU has it: a first pair step sets acc (acc·1 + 0·0, exact for these
// accs), the second is the case.
func TestDPBF16Kernel(t *testing.T) {
	kern, missing := bf16Kernel()
	if kern == nil {
		t.Skipf("this CPU lacks %s; TestDPBF16Ref checks the model", missing)
	}
	for _, tt := range dpbf16Cases {
		if bf16Bits(math.Float32frombits(tt.acc))<<16 != tt.acc || tt.acc == 0x80000000 {
			continue // acc must be a bf16 value other than −0 to be set by a first step
		}
		a := make([]uint32, 2*kern.mr)
		b := make([]uint32, 2*kern.nr)
		for r := range kern.mr {
			a[r], a[kern.mr+r] = tt.acc>>16, tt.a
		}
		for c := range kern.nr {
			b[c], b[kern.nr+c] = 0x3f80, tt.b // 1.0 in the low half
		}
		tile := make([]float32, kern.mr*kern.nr)
		kern.fn(2, &asF32(a)[0], &asF32(b)[0], &tile[0], kern.nr, 1, 0)
		for i, v := range tile {
			if got := math.Float32bits(v); got != tt.want && !(isNaN32(got) && isNaN32(tt.want)) {
				t.Errorf("%s: element %d = %#08x, want %#08x", tt.name, i, got, tt.want)
				break
			}
		}
	}
}

// TestBgemmRef: the model is a GEMM to bf16 accuracy (each input rounded
// to 8 bits: relative error per product ≤ 2⁻⁸, about 4e-3).
func TestBgemmRef(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	const m, n, k = 5, 7, 33
	a, b := newStored(r, m, k, 1, 0), newStored(r, k, n, 0, 0)
	prod, mag := refGemm(false, false, m, n, k, a, b)
	c := stored{m, n, n, make([]float32, m*n)}
	bgemmRef(false, false, m, n, k, 1, a.data, a.ld, b.data, b.ld, 0, c.data, c.ld, 4)
	for i := range c.data {
		if e := math.Abs(float64(c.data[i])-prod[i]) / mag[i]; !(e < 1e-2) {
			t.Fatalf("element %d: %v, want %v (relative error %.3g)", i, c.data[i], prod[i], e)
		}
	}
}

// TestBgemmBits compares the built-in bf16 GEMM with bgemmRef bit for bit
// on odd shapes, every transpose, alpha/beta cases and strides with
// padding, with one thread and three, where the CPU has AVX512_BF16.
func TestBgemmBits(t *testing.T) {
	kern, missing := bf16Kernel()
	if kern == nil {
		t.Skipf("this CPU lacks %s; TestDPBF16Ref and TestBgemmRef check the model", missing)
	}
	backends := map[string]*Backend{
		"1thread":  testBackend(t, config{blas: "go", threads: "1", bf16: true}),
		"3threads": testBackend(t, config{blas: "go", threads: "3", bf16: true}),
	}
	shapes := []struct{ m, n, k int }{
		{1, 1, 1}, {3, 5, 7}, {8, 48, 2}, {17, 50, 33}, {9, 97, 16},
		{64, 64, 64}, {130, 67, 513}, {257, 3, 17}, {2, 300, 1030},
	}
	scalars := []struct{ alpha, beta float32 }{{1, 0}, {1, 1}, {0.5, -2}, {-1.5, 0.25}}
	r := rand.New(rand.NewPCG(9, 10))
	for _, sh := range shapes {
		for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
			transA, transB := tr[0], tr[1]
			m, n, k := sh.m, sh.n, sh.k
			ar, ac, br, bc := m, k, k, n
			if transA {
				ar, ac = k, m
			}
			if transB {
				br, bc = n, k
			}
			extra := (m + n + k) % 3
			a := newStored(r, ar, ac, extra, padValue)
			b := newStored(r, br, bc, 2*extra, padValue)
			for _, sc := range scalars {
				c0 := newStored(r, m, n, extra, cPad)
				if sc.beta == 0 {
					for i := range m {
						for j := range n {
							c0.data[i*c0.ld+j] = float32(math.NaN())
						}
					}
				}
				want := slices.Clone(c0.data)
				bgemmRef(transA, transB, m, n, k, sc.alpha, a.data, a.ld, b.data, b.ld, sc.beta, want, c0.ld, kern.kc)
				for name, be := range backends {
					got := slices.Clone(c0.data)
					be.gemm(be.bf16, &gemmArgs{transA, transB, m, n, k, sc.alpha, sc.beta, a.data, a.ld, b.data, b.ld, got, c0.ld})
					for i := range got {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("%s %dx%dx%d tA=%v tB=%v a=%g b=%g: element %d (row %d, col %d) = %v (%#08x), model %v (%#08x)",
								name, m, n, k, transA, transB, sc.alpha, sc.beta, i, i/c0.ld, i%c0.ld, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
						}
					}
				}
			}
		}
	}
}

// TestBgemmBlocks: a k long enough for several blocks of pairs, odd, with
// beta 1, bit for bit.
func TestBgemmBlocks(t *testing.T) {
	kern, missing := bf16Kernel()
	if kern == nil {
		t.Skipf("this CPU lacks %s", missing)
	}
	be := testBackend(t, config{blas: "go", threads: "2", bf16: true})
	r := rand.New(rand.NewPCG(11, 12))
	for _, k := range []int{2*kern.kc + 1, 2*kern.kc*2 + 17} {
		t.Run(fmt.Sprint(k), func(t *testing.T) {
			const m, n = 19, 53
			a, b := newStored(r, m, k, 0, 0), newStored(r, n, k, 0, 0)
			c := newStored(r, m, n, 0, 0)
			want := slices.Clone(c.data)
			bgemmRef(false, true, m, n, k, 1, a.data, k, b.data, k, 1, want, n, kern.kc)
			be.matmulGemm(false, true, m, n, k, a.data, k, b.data, k, 1, c.data, n)
			for i := range want {
				if math.Float32bits(c.data[i]) != math.Float32bits(want[i]) {
					t.Fatalf("element %d = %v, model %v", i, c.data[i], want[i])
				}
			}
		})
	}
}

// isNaN32 reports whether u are the bits of a float32 NaN.
func isNaN32(u uint32) bool { return u&0x7fffffff > 0x7f800000 }

// TestBF16PackBits: the bf16 packs (VCVTNEPS2BF16 where the CPU has it,
// bf16Bits otherwise) round every float32 as bf16Bits does — random bit
// patterns, so denormals, NaNs, infinities and ties among them — in both
// layouts, with a ragged edge of rows, columns and an odd k.
func TestBF16PackBits(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	special := []uint32{0x00000001, 0x807fffff, 0x7f800001, 0xffc00000, 0x7f800000, 0x3f808000, 0x3f818000, 0x7f7fffff, 0x00800000}
	const rows, k, ld = 45, 37, 40 // 45 = 5·8 + 5 strip rows, k odd
	x := make([]float32, rows*ld)
	for i := range x {
		u := r.Uint32()
		if i%7 == 0 {
			u = special[(i/7)%len(special)]
		}
		x[i] = math.Float32frombits(u)
	}
	const w, p0 = 48, 1 // pairs from the second one on
	kc := (k+1)/2 - p0
	pair := func(lo float32, hiOK bool, hi float32) uint32 {
		v := bf16Bits(lo)
		if hiOK {
			v |= bf16Bits(hi) << 16
		}
		return v
	}
	// Pairs along rows of x: row j is strip column j.
	d := make([]uint32, kc*w)
	packPairsRows(d, w, x, ld, p0, kc, k, 0, rows)
	for q := range kc {
		for j := range w {
			want := uint32(0)
			if j < rows {
				p := 2 * (p0 + q)
				want = pair(x[j*ld+p], p+1 < k, x[j*ld+min(p+1, k-1)])
			}
			if d[q*w+j] != want {
				t.Fatalf("packPairsRows: step %d column %d = %#08x, want %#08x", q, j, d[q*w+j], want)
			}
		}
	}
	// Pairs down the columns of x: the first k rows, columns 0…ld-1.
	d = make([]uint32, kc*w)
	packPairsCols(d, w, x, ld, p0, kc, k, 0, ld)
	for q := range kc {
		for j := range w {
			want := uint32(0)
			if j < ld {
				p := 2 * (p0 + q)
				want = pair(x[p*ld+j], p+1 < k, x[min(p+1, k-1)*ld+j])
			}
			if d[q*w+j] != want {
				t.Fatalf("packPairsCols: step %d column %d = %#08x, want %#08x", q, j, d[q*w+j], want)
			}
		}
	}
}
