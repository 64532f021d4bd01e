package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gptui/gptui/kernels"
)

// The ring attention kernels against GQAForward and GQABackward of the
// whole sequence: every rank of the ring is simulated in turn, its rows
// gathered from the whole sequence's in its sequence-major layout.

// ringRows returns, for each of rank r's 2·B·c rows, the row of the whole
// (B,T) batch it holds: row b·2c+half·c+t holds position
// ringChunk(r, half, cp)·c+t of sequence b.
func ringRows(B, T, cp, r int) []int {
	c := T / (2 * cp)
	idx := make([]int, 0, 2*B*c)
	for bb := 0; bb < B; bb++ {
		for half := 0; half < 2; half++ {
			for t := 0; t < c; t++ {
				idx = append(idx, bb*T+ringChunk(r, half, cp)*c+t)
			}
		}
	}
	return idx
}

// gatherRows returns the rows idx of x, rows of width w.
func gatherRows(x []float32, w int, idx []int) []float32 {
	y := make([]float32, 0, len(idx)*w)
	for _, i := range idx {
		y = append(y, x[i*w:(i+1)*w]...)
	}
	return y
}

func maxAbsDiff(a, b []float32) float64 {
	var m float64
	for i := range a {
		m = max(m, math.Abs(float64(a[i])-float64(b[i])))
	}
	if len(a) != len(b) {
		return math.Inf(1)
	}
	return m
}

// ringRun holds each rank's out, lse and dqkv after runRing.
type ringRun struct {
	out, lse, dqkv [][]float32
}

// runRing simulates the ring of cp ranks on qkv (B,T,(NH+2·NKV)·hd): the
// forward pass and, from dout (B,T,NH·hd), the backward pass, as the
// engine runs them on each rank.
func runRing(t *testing.T, be *Backend, qkv, dout []float32, B, T, NH, NKV, hd, cp int) ringRun {
	t.Helper()
	ld, C, ckv := (NH+2*NKV)*hd, NH*hd, 2*NKV*hd
	c := T / (2 * cp)
	rows := 2 * B * c
	qkvR, doutR, kv := make([][]float32, cp), make([][]float32, cp), make([][]float32, cp)
	for r := range cp {
		idx := ringRows(B, T, cp, r)
		qkvR[r], doutR[r] = gatherRows(qkv, ld, idx), gatherRows(dout, C, idx)
		kv[r] = make([]float32, rows*ckv)
		be.RingKV(kv[r], qkvR[r], rows, NH, NKV, hd)
	}
	var run ringRun
	for qr := range cp {
		out, stats, lse := make([]float32, rows*C), make([]float32, rows*NH*2), make([]float32, rows*NH)
		for s := range cp {
			kr := (qr - s + cp) % cp
			be.RingAttentionForward(out, stats, qkvR[qr], kv[kr], B, c, NH, NKV, hd, cp, qr, kr, s == 0)
		}
		be.RingAttentionFinish(out, lse, stats, rows, NH, hd)
		run.out, run.lse = append(run.out, out), append(run.lse, lse)
	}
	// Backward: dkv travels with its block; each step every rank adds its
	// queries' share into the block it holds.
	delta, dkv := make([][]float32, cp), make([][]float32, cp)
	const sentinel = 7 // in dqkv's key/value parts: Backward must not touch them
	for r := range cp {
		d := make([]float32, rows*ld)
		for i := range rows {
			for j := NH * hd; j < ld; j++ {
				d[i*ld+j] = sentinel
			}
		}
		run.dqkv = append(run.dqkv, d)
		delta[r], dkv[r] = make([]float32, rows*NH), make([]float32, rows*ckv)
		be.RingAttentionDelta(delta[r], doutR[r], run.out[r], rows, NH, hd)
	}
	for s := range cp {
		for qr := range cp {
			kr := (qr - s + cp) % cp
			be.RingAttentionBackward(run.dqkv[qr], dkv[kr], doutR[qr], qkvR[qr], kv[kr], run.lse[qr], delta[qr], B, c, NH, NKV, hd, cp, qr, kr)
		}
	}
	for r := range cp {
		for i := range rows {
			for j := NH * hd; j < ld; j++ {
				if v := run.dqkv[r][i*ld+j]; v != sentinel {
					t.Fatalf("rank %d: RingAttentionBackward wrote dqkv's key/value part (row %d, channel %d: %g)", r, i, j, v)
				}
			}
		}
		be.RingKVGrad(run.dqkv[r], dkv[r], rows, NH, NKV, hd)
	}
	return run
}

func TestRingAttention(t *testing.T) {
	type shape struct{ NH, NKV, hd int }
	type tcase struct {
		shape
		cp, T int
	}
	var cases []tcase
	for _, cp := range []int{1, 2, 4} {
		for _, s := range []shape{{4, 4, 8}, {4, 2, 8}, {4, 1, 16}} {
			cases = append(cases, tcase{s, cp, 32})
		}
	}
	cases = append(cases, tcase{shape{4, 2, 8}, 4, 64}, tcase{shape{4, 1, 16}, 2, 64})
	const B, tol = 2, 2e-5
	be := New()
	be.poisonScratch = true // nothing reads a working buffer before writing it
	for _, tc := range cases {
		NH, NKV, hd, cp, T := tc.NH, tc.NKV, tc.hd, tc.cp, tc.T
		t.Run(fmt.Sprintf("cp%d_NH%d_NKV%d_hd%d_T%d", cp, NH, NKV, hd, T), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(cp*1000+T), uint64(NH*100+NKV*10+hd)))
			ld, C := (NH+2*NKV)*hd, NH*hd
			qkv, dout := randn(r, B*T*ld, 1), randn(r, B*T*C, 1)
			out, att := make([]float32, B*T*C), make([]float32, B*NH*T*T)
			be.GQAForward(out, att, qkv, B, T, NH, NKV, hd, kernels.Dropout{}, 0)
			dqkv := make([]float32, B*T*ld)
			be.GQABackward(dqkv, dout, out, qkv, att, B, T, NH, NKV, hd, kernels.Dropout{}, 0)

			// The ranks' rows are a permutation of the batch's.
			seen := make([]bool, B*T)
			for rk := range cp {
				for _, i := range ringRows(B, T, cp, rk) {
					if seen[i] {
						t.Fatalf("row %d held twice", i)
					}
					seen[i] = true
				}
			}
			if slices.Contains(seen, false) {
				t.Fatal("a row held by no rank")
			}

			run := runRing(t, be, qkv, dout, B, T, NH, NKV, hd, cp)
			var dOut, dGrad float64
			for rk := range cp {
				idx := ringRows(B, T, cp, rk)
				dOut = max(dOut, maxAbsDiff(run.out[rk], gatherRows(out, C, idx)))
				dGrad = max(dGrad, maxAbsDiff(run.dqkv[rk], gatherRows(dqkv, ld, idx)))
			}
			t.Logf("max |Δ| out %.3g, dqkv %.3g", dOut, dGrad)
			if !(dOut <= tol) || !(dGrad <= tol) {
				t.Errorf("max |Δ| out %.3g, dqkv %.3g, want ≤ %g", dOut, dGrad, tol)
			}
		})
	}
}

// TestRingAttentionLSE: lse is log Σ exp of the scores of each query row,
// from float64 scores of the whole sequence.
func TestRingAttentionLSE(t *testing.T) {
	const B, T, NH, NKV, hd, cp = 2, 32, 4, 2, 8, 2
	be := New()
	r := rand.New(rand.NewPCG(5, 6))
	ld, C, G := (NH+2*NKV)*hd, NH*hd, NH/NKV
	qkv, dout := randn(r, B*T*ld, 1), randn(r, B*T*C, 1)
	run := runRing(t, be, qkv, dout, B, T, NH, NKV, hd, cp)
	var worst float64
	for rk := range cp {
		for i, row := range ringRows(B, T, cp, rk) {
			bb, p := row/T, row%T
			for h := 0; h < NH; h++ {
				q := qkv[row*ld+h*hd : row*ld+h*hd+hd]
				s := make([]float64, p+1)
				for j := range s {
					k := qkv[(bb*T+j)*ld+NH*hd+h/G*hd:]
					for x, v := range q {
						s[j] += float64(v) * float64(k[x])
					}
					s[j] /= math.Sqrt(hd)
				}
				m := slices.Max(s)
				var sum float64
				for _, v := range s {
					sum += math.Exp(v - m)
				}
				want := m + math.Log(sum)
				got := float64(run.lse[rk][i*NH+h])
				worst = max(worst, math.Abs(got-want))
				if math.Abs(got-want) > 1e-5*max(1, math.Abs(want)) {
					t.Fatalf("rank %d row %d (b %d, position %d) head %d: lse %g, want %g", rk, i, bb, p, h, got, want)
				}
			}
		}
	}
	t.Logf("max |Δ| lse %.3g", worst)
}

// TestRingPairs: over the blocks of every rank, each query chunk meets
// each key chunk not after it exactly once, and no other.
func TestRingPairs(t *testing.T) {
	for cp := 1; cp <= 5; cp++ {
		for qr := range cp {
			met := map[[2]int]int{}
			for kr := range cp {
				for _, p := range ringPairs(cp, qr, kr) {
					qc, kc := ringChunk(qr, p.qh, cp), ringChunk(kr, p.kh, cp)
					if kc > qc || p.diag != (kc == qc) {
						t.Fatalf("cp %d: rank %d meets rank %d's chunk %d with chunk %d (diag %v)", cp, qr, kr, kc, qc, p.diag)
					}
					met[[2]int{qc, kc}]++
				}
			}
			for qh := 0; qh < 2; qh++ {
				qc := ringChunk(qr, qh, cp)
				for kc := 0; kc <= qc; kc++ {
					if met[[2]int{qc, kc}] != 1 {
						t.Fatalf("cp %d rank %d: chunk %d meets chunk %d %d times", cp, qr, qc, kc, met[[2]int{qc, kc}])
					}
				}
			}
		}
	}
}

// TestRingAttentionFuture: a key/value block wholly in the future of a query
// chunk leaves that chunk's out and stats as they were, to the bit, while
// first still initialises them.
func TestRingAttentionFuture(t *testing.T) {
	const B, T, NH, NKV, hd, cp = 2, 32, 4, 2, 8, 4
	const c = T / (2 * cp)
	const rows = 2 * B * c
	be := New()
	r := rand.New(rand.NewPCG(7, 8))
	ld, C, ckv := (NH+2*NKV)*hd, NH*hd, 2*NKV*hd
	qkv := randn(r, B*T*ld, 1)
	qr := 0 // chunk 0 (half 0) is in the past of every other rank's chunks
	qkvR := gatherRows(qkv, ld, ringRows(B, T, cp, qr))
	kvOf := func(kr int) []float32 {
		kv := make([]float32, rows*ckv)
		be.RingKV(kv, gatherRows(qkv, ld, ringRows(B, T, cp, kr)), rows, NH, NKV, hd)
		return kv
	}
	// half h of sequence bb: rows ringRow0(bb, h, c) … +c, of x's w-wide rows
	halfOf := func(x []float32, w, bb, h int) []float32 {
		r0 := ringRow0(bb, h, c)
		return x[r0*w : (r0+c)*w]
	}
	out, stats := randn(r, rows*C, 1), randn(r, rows*NH*2, 1)
	be.RingAttentionForward(out, stats, qkvR, kvOf(qr), B, c, NH, NKV, hd, cp, qr, qr, false)
	for kr := 1; kr < cp; kr++ {
		out0, stats0 := slices.Clone(out), slices.Clone(stats)
		be.RingAttentionForward(out, stats, qkvR, kvOf(kr), B, c, NH, NKV, hd, cp, qr, kr, false)
		for bb := range B {
			if !slices.Equal(halfOf(out, C, bb, 0), halfOf(out0, C, bb, 0)) || !slices.Equal(halfOf(stats, NH*2, bb, 0), halfOf(stats0, NH*2, bb, 0)) {
				t.Errorf("block of rank %d, wholly in the future of rank %d's chunk %d, changed it (sequence %d)", kr, qr, qr, bb)
			}
			if slices.Equal(halfOf(out, C, bb, 1), halfOf(out0, C, bb, 1)) {
				t.Errorf("block of rank %d left rank %d's chunk %d, in its past, unchanged (sequence %d)", kr, qr, ringChunk(qr, 1, cp), bb)
			}
		}
	}
	// first initialises rows the block does not reach.
	be.RingAttentionForward(out, stats, qkvR, kvOf(1), B, c, NH, NKV, hd, cp, qr, 1, true)
	for bb := range B {
		for i, v := range halfOf(out, C, bb, 0) {
			if v != 0 {
				t.Fatalf("first: sequence %d, out[%d] of its chunk %d = %g, want 0", bb, i, qr, v)
			}
		}
		st := halfOf(stats, NH*2, bb, 0)
		for i := range c * NH {
			if !math.IsInf(float64(st[2*i]), -1) || st[2*i+1] != 0 {
				t.Fatalf("first: sequence %d, stats of row·head %d of its chunk %d = (%g, %g), want (−Inf, 0)", bb, i, qr, st[2*i], st[2*i+1])
			}
		}
	}
}
