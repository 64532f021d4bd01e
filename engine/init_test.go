package engine

import (
	"github.com/gptui/gptui/arch"
	"math"
	"slices"
	"testing"
)

// normals returns n standard normals of the generator: elements from, from+1,
// … of the tensor name under seed.
func normals(seed uint64, name string, from, n int) []float64 {
	buf := make([]float32, n)
	fillNormal(buf, initKey(seed, name), from, 1)
	z := make([]float64, n)
	for i, v := range buf {
		z[i] = float64(v)
	}
	return z
}

// correlation is Pearson's correlation of a and b.
func correlation(a, b []float64) float64 {
	n := float64(len(a))
	var ma, mb float64
	for i := range a {
		ma += a[i]
		mb += b[i]
	}
	ma, mb = ma/n, mb/n
	var sab, saa, sbb float64
	for i := range a {
		sab += (a[i] - ma) * (b[i] - mb)
		saa += (a[i] - ma) * (a[i] - ma)
		sbb += (b[i] - mb) * (b[i] - mb)
	}
	return sab / math.Sqrt(saa*sbb)
}

// TestInitGeneratorStatistics: the counter-based generator's values are
// standard normals (mean, deviation, skew, kurtosis and the mass below
// five quantiles within five standard errors of a sample of 2^18), and
// uncorrelated — the two values of a Box–Muller pair, neighbouring pairs,
// two tensors, two seeds, an index and its square — within five standard
// errors of zero.
func TestInitGeneratorStatistics(t *testing.T) {
	const n = 1 << 18
	se := 1 / math.Sqrt(n) // standard error of a mean of unit variance, and of a correlation near 0
	z := normals(1234, "qkvw", 0, n)
	moment := func(f func(x float64) float64) float64 {
		var s float64
		for _, x := range z {
			s += f(x)
		}
		return s / n
	}
	below := func(q float64) float64 { return moment(func(x float64) float64 { return b2f(x < q) }) }
	phi := func(q float64) float64 { return 0.5 * math.Erfc(-q/math.Sqrt2) }
	moments := []struct {
		name      string
		got, want float64
		tol       float64 // five standard errors
	}{
		{"mean", moment(func(x float64) float64 { return x }), 0, 5 * se},
		{"variance", moment(func(x float64) float64 { return x * x }), 1, 5 * math.Sqrt2 * se},
		{"skew", moment(func(x float64) float64 { return x * x * x }), 0, 5 * math.Sqrt(15) * se},
		{"kurtosis", moment(func(x float64) float64 { return x * x * x * x }), 3, 5 * math.Sqrt(96) * se},
		{"P(z < -1.96)", below(-1.96), phi(-1.96), 5 * math.Sqrt(phi(-1.96)*(1-phi(-1.96))) * se},
		{"P(z < -1)", below(-1), phi(-1), 5 * math.Sqrt(phi(-1)*(1-phi(-1))) * se},
		{"P(z < 0)", below(0), 0.5, 5 * 0.5 * se},
		{"P(z < 1)", below(1), phi(1), 5 * math.Sqrt(phi(1)*(1-phi(1))) * se},
		{"P(z < 3)", below(3), phi(3), 5 * math.Sqrt(phi(3)*(1-phi(3))) * se},
	}
	for _, c := range moments {
		if math.Abs(c.got-c.want) > c.tol {
			t.Errorf("%s: %.5f, want %.5f ± %.5f", c.name, c.got, c.want, c.tol)
		}
	}

	even, odd := make([]float64, n/2), make([]float64, n/2)
	for j := range n / 2 {
		even[j], odd[j] = z[2*j], z[2*j+1]
	}
	sq := func(x []float64) []float64 {
		y := make([]float64, len(x))
		for i, v := range x {
			y[i] = v * v
		}
		return y
	}
	idx := make([]float64, n)
	for i := range idx {
		idx[i] = float64(i)
	}
	pairs := []struct {
		name string
		a, b []float64
	}{
		{"a pair's two values", even, odd},
		{"a pair's two squares", sq(even), sq(odd)},
		{"neighbouring pairs", z[:n-2], z[2:]},
		{"neighbouring elements across pairs", odd[:n/2-1], even[1:]},
		{"two tensors, same indices", z, normals(1234, "fcw", 0, n)},
		{"wte and wpe, same indices", normals(1234, "wte", 0, n), normals(1234, "wpe", 0, n)},
		{"seeds 1234 and 1235", z, normals(1235, "qkvw", 0, n)},
		{"seeds 0 and 1", normals(0, "qkvw", 0, n), normals(1, "qkvw", 0, n)},
		{"index and value", idx, z},
		{"index and square", idx, sq(z)},
	}
	for _, c := range pairs {
		r := correlation(c.a, c.b)
		if math.Abs(r) > 5*math.Sqrt(2)*se {
			t.Errorf("%s: correlation %.5f, want 0 ± %.5f", c.name, r, 5*math.Sqrt(2)*se)
		}
	}

	// An element's value does not depend on where a fill starts.
	if a, b := normals(7, "wte", 0, 100)[37:], normals(7, "wte", 37, 63); !slices.Equal(a, b) {
		t.Errorf("elements 37… filled from 0 and from 37 differ")
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// TestInitDistribution: each tensor of a model starts as GPT-2's
// initialisation says — N(0, std) for the embeddings and qkv and fc,
// N(0, std/√(2L)) for the residual projections, LayerNorm weights 1,
// biases 0, the padded vocabulary rows 0 — and a different seed gives
// different weights.
func TestInitDistribution(t *testing.T) {
	cfg := ModelConfig{Shape: arch.Shape{MaxT: 64, V: 1000, Vp: 1024, L: 4, NH: 4, C: 64, F: 256}}
	const std = 0.02
	m, err := NewModel(nil, cfg, std, 42)
	if err != nil {
		t.Fatal(err)
	}
	resid := std / math.Sqrt(2*float64(cfg.L))
	for _, tc := range []struct {
		name string
		sd   float64 // 0: constant
		c    float32 // the constant
	}{
		{"wte", std, 0}, {"wpe", std, 0}, {"qkvw", std, 0}, {"fcw", std, 0},
		{"attprojw", resid, 0}, {"fcprojw", resid, 0},
		{"ln1w", 0, 1}, {"ln2w", 0, 1}, {"lnfw", 0, 1},
		{"ln1b", 0, 0}, {"ln2b", 0, 0}, {"lnfb", 0, 0}, {"qkvb", 0, 0}, {"attprojb", 0, 0}, {"fcb", 0, 0}, {"fcprojb", 0, 0},
	} {
		tn, _ := m.tensor(tc.name)
		p := m.Params[tn.Offset : tn.Offset+tn.Size]
		if tc.name == "wte" {
			if pad := p[cfg.V*cfg.C:]; slices.ContainsFunc(pad, func(v float32) bool { return v != 0 }) {
				t.Errorf("wte: padded rows are not 0")
			}
			p = p[:cfg.V*cfg.C]
		}
		if tc.sd == 0 {
			if i := slices.IndexFunc(p, func(v float32) bool { return v != tc.c }); i >= 0 {
				t.Errorf("%s[%d] = %g, want %g", tc.name, i, p[i], tc.c)
			}
			continue
		}
		var s, ss float64
		for _, v := range p {
			s += float64(v)
			ss += float64(v) * float64(v)
		}
		n := float64(len(p))
		mean, sd := s/n, math.Sqrt(ss/n-(s/n)*(s/n))
		if se := tc.sd / math.Sqrt(n); math.Abs(mean) > 5*se || math.Abs(sd-tc.sd) > 5*tc.sd/math.Sqrt(2*n) {
			t.Errorf("%s: mean %.3g deviation %.5f over %d elements, want 0 and %.5f", tc.name, mean, sd, len(p), tc.sd)
		}
	}
	other, err := NewModel(nil, cfg, std, 43)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Equal(m.Params, other.Params) {
		t.Errorf("seeds 42 and 43 give the same weights")
	}
}

// TestInitPartsAgree: under every split — tensor-parallel ranks, pipeline
// stages (interleaved too), both, and flat shards of the buffer, as
// sharding stage 3 fills them — each element a rank initialises has the
// value it has in the whole model.
func TestInitPartsAgree(t *testing.T) {
	cfg := ModelConfig{Shape: arch.Shape{MaxT: 32, V: 250, Vp: 256, L: 8, NH: 4, C: 32, F: 128}}
	const std, seed = 0.02, 99
	whole, err := NewModel(nil, cfg, std, seed)
	if err != nil {
		t.Fatal(err)
	}
	gts, _ := Tensors(cfg)
	// check compares element i of part's layout ts, in buf[i-lo], with the whole model.
	check := func(name string, ts []Tensor, lo, hi int, buf []float32) {
		t.Helper()
		last := ts[len(ts)-1]
		want := make([]float32, last.Offset+last.Size)
		for _, tn := range ts {
			g := gts[slices.IndexFunc(gts, func(g Tensor) bool { return g.Name == tn.Name })]
			for _, pc := range tn.Pieces {
				copyBlock(want[tn.Offset:tn.Offset+tn.Size], tn.Shape, pc.Local, whole.Params[g.Offset:g.Offset+g.Size], g.Shape, pc.Global, pc.Shape)
			}
		}
		for i := lo; i < hi; i++ {
			if buf[i-lo] != want[i] {
				t.Errorf("%s: element %d is %g, %g in the whole model", name, i, buf[i-lo], want[i])
				return
			}
		}
	}
	for _, tc := range []struct {
		name        string
		mp, pp, vpp int
	}{
		{"mp2", 2, 1, 1}, {"mp4", 4, 1, 1}, {"pp2", 1, 2, 1}, {"pp4", 1, 4, 1},
		{"pp2 interleaved vpp2", 1, 2, 2}, {"mp2 pp2", 2, 2, 1}, {"mp2 pp2 vpp2", 2, 2, 2},
	} {
		for s := range tc.pp {
			for r := range tc.mp {
				part := partAt(cfg, tc.mp, r, tc.pp, tc.vpp, s)
				m, err := NewModelPart(nil, cfg, part, std, seed)
				if err != nil {
					t.Fatal(err)
				}
				check(tc.name, m.Tensors, 0, len(m.Params), m.Params)
				// Flat shards of the part's buffer, as stage 3 fills them.
				n := len(m.Params)
				for _, S := range []int{3, 8} {
					chunk := (n + S - 1) / S
					for k := range S {
						lo, hi := min(k*chunk, n), min((k+1)*chunk, n)
						buf := make([]float32, hi-lo)
						if err := fillRange(m.Tensors, lo, hi, buf, initSource(cfg, std, seed)); err != nil {
							t.Fatal(err)
						}
						check(tc.name+" shard", m.Tensors, lo, hi, buf)
					}
				}
			}
		}
	}
}
