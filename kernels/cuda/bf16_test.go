package cuda_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gptui/gptui/half"
	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/kernels/cuda"
)

// bfArg is an argument of a bf16 kernel case: its initial values, and
// whether it may hold activations (a cuda.Buf: float32 or bfloat16).
type bfArg struct {
	x       []float32
	act     bool
	scratch bool // the GPU's working memory, not compared
}

// bf16Case is a kernel that takes activations, run on the CPU backend under
// bf16 (kernels.Activations) and under the emulator on the same buffers.
type bf16Case struct {
	name  string
	args  []bfArg
	cpu   func(b kernels.Backend, x [][]float32)
	gpu   func(k *cuda.Kernels, x []cuda.Buf) error
	exact bool // the CPU's bits; otherwise within one bfloat16 step where either rounds
}

// TestKernelsBF16 runs each kernel that takes activations with them in
// bfloat16 (cuda.BF16Ptr) against kernels/cpu under bf16, whose kernels
// round what they store into kernels.Activations: all of its activation
// arguments bfloat16, the first one float32 and the others bfloat16, and
// the first one bfloat16 and the others float32 — so each argument's bit
// of the kernel's mask is read. Elementwise kernels store the CPU's bits;
// the others (reductions, and products a GPU may fuse) are within one
// bfloat16 step of them.
func TestKernelsBF16(t *testing.T) {
	cb, err := cpu.Open(cpu.Options{BF16: true})
	if err != nil {
		t.Skipf("the CPU reference of bf16: %v", err)
	}
	r := rand.New(rand.NewPCG(7, 11))
	const n = 1037 // odd: no float4 path, a tail
	const B, T, C = 2, 5, 24
	toks := make([]int32, B*T)
	for i := range toks {
		toks[i] = int32(r.IntN(40))
	}
	wte, wpe := randn(r, 30*C, 1), randn(r, T*C, 1)
	d := kernels.Dropout{P: 0.25, Key: kernels.SiteKey(42, 3, 1, 5, 2)}
	const heads, hd, Cr = 2, 8, 20 // RoPE: rows of 20 channels, two heads of 8 rotated, 4 copied
	table := make([]float32, (T+3)*hd)
	kernels.RoPE{Theta: 10000}.Table(table, T+3, hd)
	const N, F = 7, 12
	cases := []bf16Case{
		{"EncoderShardForward", []bfArg{{x: make([]float32, B*T*C), act: true}}, func(b kernels.Backend, x [][]float32) {
			b.EncoderShardForward(x[0], toks, wte, 10, wpe, B, T, C)
		}, func(k *cuda.Kernels, x []cuda.Buf) error { return nil }, true},
		{"EncoderShardBackward", []bfArg{{x: randn(r, B*T*C, 1), act: true}, {x: make([]float32, 30*C), act: false}, {x: make([]float32, T*C), act: false}}, func(b kernels.Backend, x [][]float32) {
			b.EncoderShardBackward(x[1], 10, x[2], x[0], toks, B, T, C)
		}, nil, false},
		{"GeluForward", []bfArg{{x: make([]float32, n), act: true}, {x: randn(r, n, 2), act: true}}, func(b kernels.Backend, x [][]float32) { b.GeluForward(x[0], x[1]) },
			func(k *cuda.Kernels, x []cuda.Buf) error { return k.GeluForward(0, x[0], x[1], n) }, true},
		{"GeluBackward", []bfArg{{x: make([]float32, n), act: true}, {x: randn(r, n, 2), act: true}, {x: randn(r, n, 2), act: true}, {x: randn(r, n, 1), act: true}},
			func(b kernels.Backend, x [][]float32) { b.GeluBackward(x[0], x[1], x[2], x[3]) },
			func(k *cuda.Kernels, x []cuda.Buf) error { return k.GeluBackward(0, x[0], x[1], x[2], x[3], n) }, true},
		{"ResidualForward", []bfArg{{x: make([]float32, n), act: true}, {x: randn(r, n, 1), act: true}, {x: randn(r, n, 1), act: true}},
			func(b kernels.Backend, x [][]float32) { b.ResidualForward(x[0], x[1], x[2]) },
			func(k *cuda.Kernels, x []cuda.Buf) error { return k.ResidualForward(0, x[0], x[1], x[2], n) }, true},
		{"Scale", []bfArg{{x: randn(r, n, 1), act: true}}, func(b kernels.Backend, x [][]float32) { b.Scale(x[0], 0.37) },
			func(k *cuda.Kernels, x []cuda.Buf) error { return k.Scale(0, x[0], n, 0.37) }, true},
		{"DropoutForward", []bfArg{{x: make([]float32, n), act: true}, {x: randn(r, n, 1), act: true}}, func(b kernels.Backend, x [][]float32) { b.DropoutForward(x[0], x[1], d, 99) },
			func(k *cuda.Kernels, x []cuda.Buf) error { return k.DropoutForward(0, x[0], x[1], n, d.P, d.Key, 99) }, true},
		{"SwiGLUForward", []bfArg{{x: make([]float32, N*F), act: true}, {x: randn(r, N*2*F, 2), act: true}}, func(b kernels.Backend, x [][]float32) { b.SwiGLUForward(x[0], x[1], N, F) },
			func(k *cuda.Kernels, x []cuda.Buf) error { return k.SwiGLUForward(0, x[0], x[1], N, F) }, false},
		{"SwiGLUBackward", []bfArg{{x: make([]float32, N*2*F), act: true}, {x: randn(r, N*2*F, 2), act: true}, {x: randn(r, N*F, 1), act: true}},
			func(b kernels.Backend, x [][]float32) { b.SwiGLUBackward(x[0], x[1], x[2], N, F) },
			func(k *cuda.Kernels, x []cuda.Buf) error { return k.SwiGLUBackward(0, x[0], x[1], x[2], N, F) }, false},
		{"RoPEForward", []bfArg{{x: make([]float32, B*T*Cr), act: true}, {x: randn(r, B*T*Cr, 1), act: true}}, func(b kernels.Backend, x [][]float32) {
			b.RoPEForward(x[0], x[1], table, B, T, Cr, heads, hd, 3)
		}, nil, false},
		{"RoPEBackward", []bfArg{{x: make([]float32, B*T*Cr), act: true}, {x: randn(r, B*T*Cr, 1), act: true}}, func(b kernels.Backend, x [][]float32) {
			b.RoPEBackward(x[0], x[1], table, B, T, Cr, heads, hd, 3)
		}, nil, false},
	}
	// The norms: rows of C, statistics from the CPU on the rounded input.
	const Nn, Cn = 6, 40
	lnIn := randn(r, Nn*Cn, 2)
	kernels.RoundBF16(lnIn)
	lnw, lnb := randn(r, Cn, 1), randn(r, Cn, 1)
	mean, rstd, rrstd := make([]float32, Nn), make([]float32, Nn), make([]float32, Nn)
	cb.LayerNormForward(make([]float32, Nn*Cn), mean, rstd, lnIn, lnw, lnb, Nn, Cn)
	cb.RMSNormForward(make([]float32, Nn*Cn), rrstd, lnIn, lnw, Nn, Cn, 1e-5)
	f32 := func(x []float32) bfArg { return bfArg{x: slices.Clone(x)} }
	act := func(x []float32) bfArg { return bfArg{x: slices.Clone(x), act: true} }
	zero := func(n int) []float32 { return make([]float32, n) }
	cases = append(cases,
		bf16Case{"LayerNormForward", []bfArg{act(zero(Nn * Cn)), f32(zero(Nn)), f32(zero(Nn)), act(lnIn), f32(lnw), f32(lnb)},
			func(b kernels.Backend, x [][]float32) { b.LayerNormForward(x[0], x[1], x[2], x[3], x[4], x[5], Nn, Cn) },
			func(k *cuda.Kernels, x []cuda.Buf) error {
				return k.LayerNormForward(0, x[0], asPtr(x[1]), asPtr(x[2]), x[3], asPtr(x[4]), asPtr(x[5]), Nn, Cn)
			}, false},
		bf16Case{"LayerNormBackward", []bfArg{act(randn(r, Nn*Cn, 1)), f32(zero(Cn)), f32(zero(Cn)), act(randn(r, Nn*Cn, 1)), act(lnIn), f32(lnw), f32(mean), f32(rstd)},
			func(b kernels.Backend, x [][]float32) {
				b.LayerNormBackward(x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], Nn, Cn)
			},
			func(k *cuda.Kernels, x []cuda.Buf) error {
				return k.LayerNormBackward(0, x[0], asPtr(x[1]), asPtr(x[2]), x[3], x[4], asPtr(x[5]), asPtr(x[6]), asPtr(x[7]), Nn, Cn)
			}, false},
		bf16Case{"RMSNormForward", []bfArg{act(zero(Nn * Cn)), f32(zero(Nn)), act(lnIn), f32(lnw)},
			func(b kernels.Backend, x [][]float32) { b.RMSNormForward(x[0], x[1], x[2], x[3], Nn, Cn, 1e-5) },
			func(k *cuda.Kernels, x []cuda.Buf) error {
				return k.RMSNormForward(0, x[0], asPtr(x[1]), x[2], asPtr(x[3]), Nn, Cn, 1e-5)
			}, false},
		bf16Case{"RMSNormBackward", []bfArg{act(randn(r, Nn*Cn, 1)), f32(zero(Cn)), act(randn(r, Nn*Cn, 1)), act(lnIn), f32(lnw), f32(rrstd)},
			func(b kernels.Backend, x [][]float32) { b.RMSNormBackward(x[0], x[1], x[2], x[3], x[4], x[5], Nn, Cn) },
			func(k *cuda.Kernels, x []cuda.Buf) error {
				return k.RMSNormBackward(0, x[0], asPtr(x[1]), x[2], x[3], asPtr(x[4]), asPtr(x[5]), Nn, Cn)
			}, false},
		bf16Case{"ResidualLayerNormForward", []bfArg{act(zero(Nn * Cn)), act(zero(Nn * Cn)), f32(zero(Nn)), f32(zero(Nn)), act(randn(r, Nn*Cn, 1)), act(randn(r, Nn*Cn, 1)), f32(lnw), f32(lnb)},
			func(b kernels.Backend, x [][]float32) {
				b.ResidualLayerNormForward(x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], Nn, Cn)
			},
			func(k *cuda.Kernels, x []cuda.Buf) error {
				return k.ResidualLayerNormForward(0, x[0], x[1], asPtr(x[2]), asPtr(x[3]), x[4], x[5], asPtr(x[6]), asPtr(x[7]), Nn, Cn)
			}, false},
		bf16Case{"ResidualRMSNormForward", []bfArg{act(zero(Nn * Cn)), act(zero(Nn * Cn)), f32(zero(Nn)), act(randn(r, Nn*Cn, 1)), act(randn(r, Nn*Cn, 1)), f32(lnw)},
			func(b kernels.Backend, x [][]float32) {
				b.ResidualRMSNormForward(x[0], x[1], x[2], x[3], x[4], x[5], Nn, Cn, 1e-5)
			},
			func(k *cuda.Kernels, x []cuda.Buf) error {
				return k.ResidualRMSNormForward(0, x[0], x[1], asPtr(x[2]), x[3], x[4], asPtr(x[5]), Nn, Cn, 1e-5)
			}, false},
	)
	// The classifier: logits (Nc,ldc), the first Vc columns real.
	const Nc, Vc, ldc = 5, 37, 40
	tgt := make([]int32, Nc)
	for i := range tgt {
		tgt[i] = int32(r.IntN(Vc))
	}
	var gtgt cuda.Ptr
	logits := randn(r, Nc*ldc, 3)
	cases = append(cases,
		bf16Case{"CrossEntropy", []bfArg{f32(zero(Nc)), act(logits)},
			func(b kernels.Backend, x [][]float32) { b.CrossEntropy(x[0], x[1], tgt, Nc, Vc, ldc, 0.5, true) },
			func(k *cuda.Kernels, x []cuda.Buf) error {
				return k.CrossEntropy(0, asPtr(x[0]), x[1], gtgt, Nc, Vc, ldc, 0.5, true)
			}, false},
		bf16Case{"ClassifierMax+Exp+Finish", []bfArg{f32(zero(Nc)), f32(zero(Nc)), act(logits), {x: zero(4 * Nc), scratch: true}},
			func(b kernels.Backend, x [][]float32) {
				stats := make([]float64, 2*Nc)
				b.ClassifierMax(x[1], x[2], Nc, Vc, ldc)
				b.ClassifierExp(stats, x[2], tgt, x[1], Nc, Vc, ldc, 0)
				b.ClassifierFinish(x[0], x[2], tgt, x[1], stats, Nc, Vc, ldc, 0, 0.5, true)
			},
			func(k *cuda.Kernels, x []cuda.Buf) error {
				return errors.Join(k.ClassifierMax(0, asPtr(x[1]), x[2], Nc, Vc, ldc),
					k.ClassifierExp(0, asPtr(x[3]), x[2], gtgt, asPtr(x[1]), Nc, Vc, ldc, 0),
					k.ClassifierFinish(0, asPtr(x[0]), x[2], gtgt, asPtr(x[1]), asPtr(x[3]), Nc, Vc, ldc, 0, 0.5, true))
			}, false},
	)
	// The bias gradient of a GEMM whose dout is bfloat16.
	const No, OCb = 300, 40 // more rows than one block's 256
	cases = append(cases, bf16Case{"BiasBackward", []bfArg{act(randn(r, No*OCb, 1)), f32(randn(r, OCb, 1))},
		func(b kernels.Backend, x [][]float32) {
			// kernels/cpu's MatmulBackward sums dbias; with no dinp and a
			// zero inp its dw stays 0.
			b.MatmulBackward(nil, make([]float32, OCb), x[1], x[0], make([]float32, No), make([]float32, OCb), No, 1, OCb)
		},
		func(k *cuda.Kernels, x []cuda.Buf) error { return k.BiasBackward(0, asPtr(x[1]), x[0], No, OCb) }, false})
	// Decoding one position against a float32 key/value cache: q and out
	// bfloat16.
	const Bd, maxT, NHd, NKVd, hdd, pos = 2, 9, 4, 2, 16, 6
	kc, vc := randn(r, Bd*maxT*NKVd*hdd, 1), randn(r, Bd*maxT*NKVd*hdd, 1)
	var gkc, gvc cuda.Ptr
	cases = append(cases, bf16Case{"GQADecode", []bfArg{act(zero(Bd * NHd * hdd)), act(randn(r, Bd*NHd*hdd, 1))},
		func(b kernels.Backend, x [][]float32) { b.GQADecode(x[0], x[1], kc, vc, Bd, pos, maxT, NHd, NKVd, hdd) },
		func(k *cuda.Kernels, x []cuda.Buf) error {
			return k.GQADecode(0, x[0], x[1], gkc, gvc, Bd, pos, maxT, NHd, NKVd, hdd)
		}, false})
	// The cases whose GPU call needs device copies of float32 operands.
	var gwte, gwpe, gtok, gtable cuda.Ptr
	for i := range cases {
		c := &cases[i]
		switch c.name {
		case "EncoderShardForward":
			c.gpu = func(k *cuda.Kernels, x []cuda.Buf) error {
				return k.EncoderShardForward(0, x[0], gtok, gwte, 10, 30, gwpe, B, T, C)
			}
		case "EncoderShardBackward":
			c.gpu = func(k *cuda.Kernels, x []cuda.Buf) error {
				p1, _ := x[1].(cuda.Ptr)
				p2, _ := x[2].(cuda.Ptr)
				return k.EncoderShardBackward(0, p1, 10, 30, p2, x[0], gtok, B, T, C)
			}
		case "RoPEForward":
			c.gpu = func(k *cuda.Kernels, x []cuda.Buf) error {
				return k.RoPEForward(0, x[0], x[1], gtable, B, T, Cr, heads, hd, 3)
			}
		case "RoPEBackward":
			c.gpu = func(k *cuda.Kernels, x []cuda.Buf) error {
				return k.RoPEBackward(0, x[0], x[1], gtable, B, T, Cr, heads, hd, 3)
			}
		}
	}
	for _, c := range cases {
		acts := 0
		for _, a := range c.args {
			if a.act {
				acts++
			}
		}
		variants := [][]bool{}
		all := func(first, rest bool) []bool {
			v, k := make([]bool, len(c.args)), 0
			for i, a := range c.args {
				if a.act {
					v[i] = rest
					if k == 0 {
						v[i] = first
					}
					k++
				}
			}
			return v
		}
		variants = append(variants, all(true, true))
		if acts > 1 {
			variants = append(variants, all(false, true), all(true, false))
		}
		for _, bf := range variants {
			t.Run(fmt.Sprintf("%s/%v", c.name, bf), func(t *testing.T) {
				m, k := machine(t)
				gwte, gwpe, gtok, gtable, gtgt = m.Float32s(wte), m.Float32s(wpe), m.Int32s(toks), m.Float32s(table), m.Int32s(tgt)
				gkc, gvc = m.Float32s(kc), m.Float32s(vc)
				host := make([][]float32, len(c.args))
				dev := make([]cuda.Buf, len(c.args))
				for i, a := range c.args {
					x := slices.Clone(a.x)
					if bf[i] {
						kernels.RoundBF16(x)
						host[i] = cb.Activations(len(x))
						copy(host[i], x)
						dev[i] = cuda.BF16Ptr(m.Uint16s(toBF16(x)))
					} else {
						host[i] = x
						dev[i] = m.Float32s(slices.Clone(x))
					}
				}
				c.cpu(cb, host)
				must(t, c.gpu(k, dev))
				run(t, m)
				for i, a := range c.args {
					want := host[i]
					var got []float32
					if p, ok := dev[i].(cuda.BF16Ptr); ok {
						got = fromBF16(m.ReadUint16s(cuda.Ptr(p), len(want)))
					} else {
						got = m.ReadFloat32s(dev[i].(cuda.Ptr), len(want))
					}
					name := fmt.Sprintf("argument %d", i)
					if a.scratch {
						continue
					}
					if !a.act {
						checkClose(t, name, got, want, 1e-5) // float32 sums (atomics): the order differs
						continue
					}
					switch {
					case c.exact:
						checkExact(t, name, got, want)
					case bf[i]:
						checkWithinBF16Step(t, name, got, want)
					default:
						checkClose(t, name, got, want, 1e-5) // the fp32 kernels' tolerance
					}
				}
			})
		}
	}
}

// asPtr is a float32 argument of a case (never a BF16Ptr).
func asPtr(b cuda.Buf) cuda.Ptr { return b.(cuda.Ptr) }

func toBF16(x []float32) []uint16 {
	h := make([]uint16, len(x))
	for i, v := range x {
		h[i] = half.F32ToBF16(v)
	}
	return h
}

func fromBF16(h []uint16) []float32 {
	x := make([]float32, len(h))
	for i, v := range h {
		x[i] = half.BF16ToF32(v)
	}
	return x
}

// checkWithinBF16Step: every element of got within one bfloat16 step (2⁻⁷
// of its magnitude, or of the tensor's root mean square where that is
// larger: an element near zero after cancellation carries the rounding of
// the terms that cancelled) of want's, as a float32 result a few ulps from
// the CPU's lands on the neighbouring bfloat16 now and then — at most 5% of
// the elements differ.
func checkWithinBF16Step(t *testing.T, name string, got, want []float32) {
	t.Helper()
	var ss float64
	for _, w := range want {
		ss += float64(w) * float64(w)
	}
	rms := math.Sqrt(ss / float64(max(len(want), 1)))
	diff := 0
	for i, w := range want {
		if got[i] == w {
			continue
		}
		diff++
		if d := math.Abs(float64(got[i] - w)); !(d <= max(math.Abs(float64(w)), rms)/128) {
			t.Errorf("%s[%d] = %v, want %v: more than one bfloat16 step apart", name, i, got[i], w)
			return
		}
	}
	t.Logf("%s: %d of %d elements differ from the CPU's by a bfloat16 step", name, diff, len(want))
	if diff > len(want)/20 {
		t.Errorf("%s: %d of %d elements differ from the CPU's", name, diff, len(want))
	}
}

// TestAttentionBF16 runs the tiled attention kernels, forward and
// backward, with bfloat16 activations against kernels/cpu's GQAForward and
// GQABackward under bf16: grouped heads, a T that leaves partial tiles, a
// head size with its own kernel and one for the generic kernel, dropout;
// all of qkv, out, dout and dqkv bfloat16, and out and dout float32 beside
// bfloat16 qkv and dqkv. dq accumulates in a float32 buffer and is stored
// into dqkv once, rounded, as the CPU rounds it once.
func TestAttentionBF16(t *testing.T) {
	cb, err := cpu.Open(cpu.Options{BF16: true})
	if err != nil {
		t.Skipf("the CPU reference of bf16: %v", err)
	}
	for _, tc := range []struct {
		B, T, NH, NKV, hs int
		p                 float32
		outBF             bool
	}{
		{2, 70, 4, 2, 32, 0, true},
		{1, 45, 2, 1, 24, 0.2, true},
		{2, 70, 4, 2, 32, 0, false},
	} {
		t.Run(fmt.Sprintf("T%dNH%dNKV%dhs%dp%v/out-bf16-%v", tc.T, tc.NH, tc.NKV, tc.hs, tc.p, tc.outBF), func(t *testing.T) {
			B, T, NH, NKV, hs := tc.B, tc.T, tc.NH, tc.NKV, tc.hs
			r := rand.New(rand.NewPCG(uint64(T), uint64(hs)))
			ld, C := (NH+2*NKV)*hs, NH*hs
			d := kernels.Dropout{P: tc.p, Key: kernels.SiteKey(9, 1, 2, 3)}
			const off = 77
			qkv, dout := randn(r, B*T*ld, 1), randn(r, B*T*C, 1)
			kernels.RoundBF16(qkv)
			if tc.outBF {
				kernels.RoundBF16(dout)
			}
			// The CPU under bf16.
			act := func(x []float32, bf bool) []float32 {
				if !bf {
					return slices.Clone(x)
				}
				y := cb.Activations(len(x))
				copy(y, x)
				return y
			}
			cq, cout, cdout, cdqkv := act(qkv, true), act(make([]float32, B*T*C), tc.outBF), act(dout, tc.outBF), act(make([]float32, B*T*ld), true)
			att := make([]float32, B*NH*T*T)
			cb.GQAForward(cout, att, cq, B, T, NH, NKV, hs, d, off)
			cb.GQABackward(cdqkv, cdout, cout, cq, att, B, T, NH, NKV, hs, d, off)
			// The emulator, with an H100's shared memory (the 64×64 tiles).
			m, k := attMachine(t)
			dev := func(x []float32, bf bool) cuda.Buf {
				if bf {
					return cuda.BF16Ptr(m.Uint16s(toBF16(x)))
				}
				return m.Float32s(x)
			}
			read := func(b cuda.Buf, n int) []float32 {
				if p, ok := b.(cuda.BF16Ptr); ok {
					return fromBF16(m.ReadUint16s(cuda.Ptr(p), n))
				}
				return m.ReadFloat32s(b.(cuda.Ptr), n)
			}
			gq, gout, gdout, gdqkv := dev(qkv, true), dev(make([]float32, B*T*C), tc.outBF), dev(dout, tc.outBF), dev(make([]float32, B*T*ld), true)
			glse, gdq := m.Alloc(4*B*NH*T), m.Alloc(4*B*T*C)
			must(t, k.GQAForward(0, gout, glse, gq, B, T, NH, NKV, hs, d.P, d.Key, 0, 0, off))
			must(t, k.GQABackward(0, gdqkv, gdout, gout, gq, glse, gdq, B, T, NH, NKV, hs, d.P, d.Key, 0, 0, off))
			if err := k.GQABackward(0, gdqkv, gdout, gout, gq, glse, 0, B, T, NH, NKV, hs, d.P, d.Key, 0, 0, off); err == nil {
				t.Error("GQABackward into bfloat16 dqkv without a dq buffer: no error")
			}
			run(t, m)
			if tc.outBF {
				checkWithinBF16Step(t, "out", read(gout, B*T*C), cout)
			} else {
				checkClose(t, "out", read(gout, B*T*C), cout, 1e-5)
			}
			checkWithinBF16Step(t, "dqkv", read(gdqkv, B*T*ld), cdqkv)
		})
	}
}

// TestBiasStore: a GEMM's float32 product plus its bias, stored into
// bfloat16 activations, is the sum with the bias rounded to bfloat16,
// rounded once (kernels.RoundBF16), and into float32 the sum itself, in
// place too.
func TestBiasStore(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const N, OC = 37, 29
	in, bias := randn(r, N*OC, 2), randn(r, OC, 1)
	want := make([]float32, N*OC)
	for i := range want {
		want[i] = in[i] + bias[i%OC]
	}
	// Into bfloat16, the bias is read as a bfloat16 too, as cuBLASLt's
	// bias epilogue and kernels/cpu read it.
	hbias := slices.Clone(bias)
	kernels.RoundBF16(hbias)
	rounded := make([]float32, N*OC)
	for i := range rounded {
		rounded[i] = in[i] + hbias[i%OC]
	}
	kernels.RoundBF16(rounded)
	m, k := machine(t)
	gin, gbias := m.Float32s(in), m.Float32s(bias)
	gout := cuda.BF16Ptr(m.Alloc(2 * N * OC))
	inplace := m.Float32s(in)
	must(t, k.BiasStore(0, gout, gin, gbias, N, OC))
	must(t, k.BiasStore(0, inplace, inplace, gbias, N, OC))
	run(t, m)
	if got := fromBF16(m.ReadUint16s(cuda.Ptr(gout), N*OC)); !slices.Equal(got, rounded) {
		t.Errorf("bfloat16 out: %v…, want %v…", got[:4], rounded[:4])
	}
	if got := m.ReadFloat32s(inplace, N*OC); !slices.Equal(got, want) {
		t.Errorf("float32 out in place: %v…, want %v…", got[:4], want[:4])
	}
}

// TestBiasGeluStore: a GEMM's float32 product plus its bias, and GELU of
// that sum, stored as cuBLASLt's GELU_AUX_BIAS epilogue stores them: into
// bfloat16 activations the sum (its bias read as a bfloat16) and GELU of
// the unrounded sum, each rounded once, as kernels/cpu's
// MatmulGeluForward; into float32 the sum and its GELU themselves.
func TestBiasGeluStore(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const N, OC = 37, 29
	in, bias := randn(r, N*OC, 2), randn(r, OC, 1)
	sum := func(b []float32) (pre, out []float32) {
		pre, out = make([]float32, N*OC), make([]float32, N*OC)
		for i := range pre {
			pre[i] = in[i] + b[i%OC]
		}
		cpuBackend.GeluForward(out, pre)
		return pre, out
	}
	pre32, out32 := sum(bias)
	hbias := slices.Clone(bias)
	kernels.RoundBF16(hbias)
	pre16, out16 := sum(hbias)
	kernels.RoundBF16(pre16)
	kernels.RoundBF16(out16)
	m, k := machine(t)
	gin, gbias := m.Float32s(in), m.Float32s(bias)
	gpre, gout := cuda.BF16Ptr(m.Alloc(2*N*OC)), cuda.BF16Ptr(m.Alloc(2*N*OC))
	fpre, fout := m.Alloc(4*N*OC), m.Alloc(4*N*OC)
	must(t, k.BiasGeluStore(0, gout, gpre, gin, gbias, N, OC))
	must(t, k.BiasGeluStore(0, fout, fpre, gin, gbias, N, OC))
	run(t, m)
	if got := fromBF16(m.ReadUint16s(cuda.Ptr(gpre), N*OC)); !slices.Equal(got, pre16) {
		t.Errorf("bfloat16 pre: %v…, want %v…", got[:4], pre16[:4])
	}
	if got := fromBF16(m.ReadUint16s(cuda.Ptr(gout), N*OC)); !slices.Equal(got, out16) {
		t.Errorf("bfloat16 out: %v…, want %v…", got[:4], out16[:4])
	}
	if got := m.ReadFloat32s(fpre, N*OC); !slices.Equal(got, pre32) {
		t.Errorf("float32 pre: %v…, want %v…", got[:4], pre32[:4])
	}
	if got := m.ReadFloat32s(fout, N*OC); !slices.Equal(got, out32) {
		t.Errorf("float32 out: %v…, want %v…", got[:4], out32[:4])
	}
}
