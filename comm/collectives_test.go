package comm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gptui/gptui/half"
)

// exactValue is member r's element i in the tests that compare exactly: a
// multiple of 1/4 below 3 in magnitude, so that sums over a few members are
// exact in any order.
func exactValue(r, i int) float32 { return float32((i*7+r*13)%17-8) * 0.25 }

func exactInput(r, n int) []float32 {
	b := make([]float32, n)
	for i := range b {
		b[i] = exactValue(r, i)
	}
	return b
}

// randomInput is member r's buffer of random values (seeded by r and n).
func randomInput(r, n int) []float32 {
	rng := rand.New(rand.NewPCG(uint64(r), uint64(n)))
	b := make([]float32, n)
	for i := range b {
		b[i] = float32(rng.NormFloat64())
	}
	return b
}

// firstDiff returns the first index where got and want differ (bitwise),
// or -1.
func firstDiff(got, want []float32) int {
	if len(got) != len(want) {
		return 0
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return i
		}
	}
	return -1
}

// collectiveCase is one collective checked against a plain reference on
// every member of a group.
type collectiveCase struct {
	name string
	// run performs the collective as member r of s on elements of length n
	// and returns its output.
	run func(ctx context.Context, g *Group, r, s, n int) ([]float32, error)
	// want is member r's expected output.
	want func(r, s, n int) []float32
}

var collectiveCases = []collectiveCase{
	{
		name: "AllReduce",
		run: func(ctx context.Context, g *Group, r, s, n int) ([]float32, error) {
			b := exactInput(r, n)
			return b, g.AllReduce(ctx, b)
		},
		want: func(r, s, n int) []float32 {
			w := make([]float32, n)
			for q := range s {
				addF32Go(w, exactInput(q, n))
			}
			return w
		},
	},
	{
		name: "ReduceScatter",
		run: func(ctx context.Context, g *Group, r, s, n int) ([]float32, error) {
			out := make([]float32, n)
			return out, g.ReduceScatter(ctx, exactInput(r, s*n), out)
		},
		want: func(r, s, n int) []float32 {
			w := make([]float32, n)
			for q := range s {
				addF32Go(w, exactInput(q, s*n)[r*n:])
			}
			return w
		},
	},
	{
		name: "ReduceScatterInPlace", // out is this member's part of in
		run: func(ctx context.Context, g *Group, r, s, n int) ([]float32, error) {
			in := exactInput(r, s*n)
			out := in[r*n : (r+1)*n]
			return out, g.ReduceScatter(ctx, in, out)
		},
		want: func(r, s, n int) []float32 {
			w := make([]float32, n)
			for q := range s {
				addF32Go(w, exactInput(q, s*n)[r*n:])
			}
			return w
		},
	},
	{
		name: "AllGather",
		run: func(ctx context.Context, g *Group, r, s, n int) ([]float32, error) {
			out := make([]float32, s*n)
			return out, g.AllGather(ctx, exactInput(r, n), out)
		},
		want: func(r, s, n int) []float32 {
			var w []float32
			for q := range s {
				w = append(w, exactInput(q, n)...)
			}
			return w
		},
	},
	{
		name: "AllGatherInPlace", // in is this member's part of out
		run: func(ctx context.Context, g *Group, r, s, n int) ([]float32, error) {
			out := make([]float32, s*n)
			copy(out[r*n:], exactInput(r, n))
			return out, g.AllGather(ctx, out[r*n:(r+1)*n], out)
		},
		want: func(r, s, n int) []float32 {
			var w []float32
			for q := range s {
				w = append(w, exactInput(q, n)...)
			}
			return w
		},
	},
	{
		name: "BroadcastFirst",
		run: func(ctx context.Context, g *Group, r, s, n int) ([]float32, error) {
			b := exactInput(r, n)
			return b, g.Broadcast(ctx, b, 0)
		},
		want: func(r, s, n int) []float32 { return exactInput(0, n) },
	},
	{
		name: "BroadcastLast",
		run: func(ctx context.Context, g *Group, r, s, n int) ([]float32, error) {
			b := exactInput(r, n)
			return b, g.Broadcast(ctx, b, s-1)
		},
		want: func(r, s, n int) []float32 { return exactInput(s-1, n) },
	},
	{
		name: "SendRecvRing", // everyone sends to the next member at once
		run: func(ctx context.Context, g *Group, r, s, n int) ([]float32, error) {
			b := exactInput(r, n)
			if s == 1 {
				return b, nil
			}
			if err := g.Send(ctx, b, (r+1)%s); err != nil {
				return nil, err
			}
			got := make([]float32, n)
			return got, g.Recv(ctx, got, (r+s-1)%s)
		},
		want: func(r, s, n int) []float32 { return exactInput((r+s-1)%s, n) },
	},
	{
		name: "AllReduce64",
		run: func(ctx context.Context, g *Group, r, s, n int) ([]float32, error) {
			b := make([]float64, n)
			for i := range b {
				b[i] = float64(exactValue(r, i)) / 3 // not exact: checks the order
			}
			if err := g.AllReduce64(ctx, b); err != nil {
				return nil, err
			}
			out := make([]float32, 2*n) // the bits of b, to compare exactly
			for i, v := range b {
				u := math.Float64bits(v)
				out[2*i], out[2*i+1] = math.Float32frombits(uint32(u)), math.Float32frombits(uint32(u>>32))
			}
			return out, nil
		},
		want: func(r, s, n int) []float32 {
			out := make([]float32, 2*n)
			for i := range n {
				var v float64
				for q := range s { // rank order
					v += float64(exactValue(q, i)) / 3
				}
				u := math.Float64bits(v)
				out[2*i], out[2*i+1] = math.Float32frombits(uint32(u)), math.Float32frombits(uint32(u>>32))
			}
			return out
		},
	},
}

// TestCollectives checks every collective on worlds of 1 to 4 ranks (one
// goroutine and one World per rank, over loopback TCP) against a plain
// reference, for lengths that are empty, tiny, not divisible by the group
// size and large, with the default 1 MiB pieces and with 40-byte pieces
// (many frames per chunk even for short buffers).
func TestCollectives(t *testing.T) {
	t.Parallel() // alongside the tests that wait on timeouts
	ctx := context.Background()
	// The default chunk (1 MiB) over 4 MiB and more: several chunks a
	// member's segment; -short takes 400 kB, a chunk or less (the 40-byte
	// chunks take the many-chunk paths).
	big := 1<<20 + 3
	if testing.Short() {
		big = 100_003
	}
	for _, tc := range []struct {
		chunk   int
		lengths []int
	}{
		{0, []int{0, 1, 7, 13, big}},
		{40, []int{0, 1, 7, 13, 101, 333}},
	} {
		for s := 1; s <= 4; s++ {
			t.Run(fmt.Sprintf("chunk=%d/size=%d", tc.chunk, s), func(t *testing.T) {
				ws := connectWorlds(t, s, func(c *Config) { c.chunkBytes = tc.chunk })
				gs := groups(t, ws, allRanks(s))
				for _, n := range tc.lengths {
					for _, cc := range collectiveCases {
						if cc.name == "AllReduce64" && n > 1000 {
							continue // meant for scalars
						}
						t.Run(fmt.Sprintf("%s/n=%d", cc.name, n), func(t *testing.T) {
							outs := make([][]float32, s)
							mustAll(t, s, func(r int) (err error) {
								outs[r], err = cc.run(ctx, gs[r], r, s, n)
								return err
							})
							for r := range s {
								if i := firstDiff(outs[r], cc.want(r, s, n)); i >= 0 {
									t.Fatalf("member %d: element %d differs from the reference (len %d, want %d)",
										r, i, len(outs[r]), len(cc.want(r, s, n)))
								}
							}
						})
					}
				}
			})
		}
	}
}

// TestAllReduceBits checks, on random data, that every member ends with the
// same bits, that a repeated all-reduce gives the same bits again, and that
// the sum is close to a float64 reference.
func TestAllReduceBits(t *testing.T) {
	ctx := context.Background()
	for _, s := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("size=%d", s), func(t *testing.T) {
			ws := connectWorlds(t, s, func(c *Config) { c.chunkBytes = 4 << 10 })
			gs := groups(t, ws, allRanks(s))
			const n = 100_003
			var first []float32
			for run := range 2 {
				bufs := make([][]float32, s)
				for r := range s {
					bufs[r] = randomInput(r, n)
				}
				mustAll(t, s, func(r int) error { return gs[r].AllReduce(ctx, bufs[r]) })
				for r := 1; r < s; r++ {
					if i := firstDiff(bufs[r], bufs[0]); i >= 0 {
						t.Fatalf("run %d: member %d differs from member 0 at %d", run, r, i)
					}
				}
				if run == 0 {
					first = bufs[0]
				} else if i := firstDiff(bufs[0], first); i >= 0 {
					t.Fatalf("the second run differs from the first at %d", i)
				}
			}
			ins := make([][]float32, s)
			for r := range s {
				ins[r] = randomInput(r, n)
			}
			for i := range n {
				var want float64
				for r := range s {
					want += float64(ins[r][i])
				}
				if d := math.Abs(float64(first[i]) - want); d > 1e-6*float64(s)*(1+math.Abs(want)) {
					t.Fatalf("element %d: %v, want %v", i, first[i], want)
				}
			}
		})
	}
}

// TestAllReduceBF16: the bfloat16 all-reduce of 2, 3 and 4 members, in
// pieces small enough that the buffer streams, gives every member the
// same bits, and those of adding each chunk along the ring — chunk c from
// member c+1 round to member c — rounding each sum to bfloat16, as NCCL's
// bfloat16 ring does; a member issuing AllReduce against another's
// AllReduceBF16 is a mismatch.
func TestAllReduceBF16(t *testing.T) {
	ctx := context.Background()
	bf16 := func(v float32) float32 { return half.BF16ToF32(half.F32ToBF16(v)) }
	input := func(r, n int) []float32 {
		b := randomInput(r, n)
		for i, v := range b {
			b[i] = bf16(v)
		}
		return b
	}
	for _, s := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("size=%d", s), func(t *testing.T) {
			ws := connectWorlds(t, s, func(c *Config) { c.chunkBytes = 4 << 10 })
			gs := groups(t, ws, allRanks(s))
			const n = 10_007
			bufs := make([][]float32, s)
			for r := range s {
				bufs[r] = input(r, n)
			}
			mustAll(t, s, func(r int) error { return gs[r].AllReduceBF16Async(bufs[r]).Wait(ctx) })
			for r := 1; r < s; r++ {
				if i := firstDiff(bufs[r], bufs[0]); i >= 0 {
					t.Fatalf("member %d differs from member 0 at %d", r, i)
				}
			}
			ins := make([][]float32, s)
			for r := range s {
				ins[r] = input(r, n)
			}
			rounded := 0
			for c := range s {
				for i := c * n / s; i < (c+1)*n/s; i++ {
					sum := ins[(c+1)%s][i]
					for k := 2; k <= s; k++ {
						sum = bf16(sum + ins[(c+k)%s][i])
					}
					if bufs[0][i] != sum {
						t.Fatalf("element %d (chunk %d): %v, want %v", i, c, bufs[0][i], sum)
					}
					var exact float32
					for r := range s {
						exact += ins[r][i]
					}
					if exact != sum {
						rounded++
					}
				}
			}
			if rounded == 0 {
				t.Error("no sum was rounded: the test does not tell bfloat16 sums from float32 ones")
			}
		})
	}
	t.Run("mismatch", func(t *testing.T) {
		ws := connectWorlds(t, 2, func(c *Config) { c.Timeout = 10 * time.Second })
		gs := groups(t, ws, allRanks(2))
		errs := onAll(2, func(r int) error {
			if r == 0 {
				return gs[r].AllReduce(ctx, make([]float32, 10))
			}
			return gs[r].AllReduceBF16Async(make([]float32, 10)).Wait(ctx)
		})
		if !errors.Is(errors.Join(errs...), ErrMismatch) {
			t.Errorf("AllReduce against AllReduceBF16: %v, want ErrMismatch", errs)
		}
	})
}

// TestSubgroups splits a world of 4 into pairs in two ways, plus a group
// created twice for the same members, and uses them all at once: each
// member issues its groups' operations in a different interleaving.
func TestSubgroups(t *testing.T) {
	ctx := context.Background()
	ws := connectWorlds(t, 4, nil)
	const n, rounds = 50_001, 5
	type mine struct{ pair, cross, world, world2 *Group }
	gs := make([]mine, 4)
	for r, w := range ws {
		pair := []int{r &^ 1, r | 1}   // {0,1}, {2,3}
		cross := []int{r & 1, r&1 + 2} // {0,2}, {1,3}
		var err error
		if gs[r].pair, err = w.Group(pair); err != nil {
			t.Fatal(err)
		}
		if gs[r].cross, err = w.Group(cross); err != nil {
			t.Fatal(err)
		}
		if gs[r].world, err = w.Group(allRanks(4)); err != nil {
			t.Fatal(err)
		}
		if gs[r].world2, err = w.Group(allRanks(4)); err != nil {
			t.Fatal(err)
		}
	}
	if got := gs[2].cross.Ranks(); !slices.Equal(got, []int{0, 2}) || gs[2].cross.Rank() != 1 || gs[2].cross.Size() != 2 {
		t.Fatalf("rank 2's cross group: ranks %v, rank %d", got, gs[2].cross.Rank())
	}
	val := func(r, round, kind int) []float32 {
		b := exactInput(r+10*kind, n)
		b[0] = float32(round)
		return b
	}
	outs := make([][rounds][4][]float32, 4)
	mustAll(t, 4, func(r int) error {
		g := gs[r]
		var reqs []Request
		for round := range rounds {
			p, c, w2 := val(r, round, 0), val(r, round, 1), val(r, round, 3)
			outs[r][round][0], outs[r][round][1], outs[r][round][3] = p, c, w2
			if r%2 == 0 {
				reqs = append(reqs, g.pair.AllReduceAsync(p), g.cross.AllReduceAsync(c))
			} else {
				reqs = append(reqs, g.cross.AllReduceAsync(c), g.pair.AllReduceAsync(p))
			}
			reqs = append(reqs, g.world2.AllReduceAsync(w2))
			w := val(r, round, 2)
			outs[r][round][2] = w
			if err := g.world.AllReduce(ctx, w); err != nil {
				return err
			}
		}
		for _, q := range reqs {
			if err := q.Wait(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	for r := range 4 {
		members := [4][]int{{r &^ 1, r | 1}, {r & 1, r&1 + 2}, allRanks(4), allRanks(4)}
		for round := range rounds {
			for kind, m := range members {
				want := make([]float32, n)
				for _, q := range m {
					addF32Go(want, val(q, round, kind))
				}
				if i := firstDiff(outs[r][round][kind], want); i >= 0 {
					t.Fatalf("rank %d, round %d, group %v: element %d differs", r, round, m, i)
				}
			}
		}
	}
}

// TestAsyncOrder issues asynchronous and blocking operations mixed on one
// group: they complete in issue order, with the right results.
func TestAsyncOrder(t *testing.T) {
	ctx := context.Background()
	const s, n = 3, 30_001
	ws := connectWorlds(t, s, func(c *Config) { c.chunkBytes = 64 << 10 })
	gs := groups(t, ws, allRanks(s))
	done, cancel := context.WithCancel(ctx)
	cancel() // Wait with an ended context reports only operations already done
	type result struct{ ar, rsOut, ag1, ag2, ar2 []float32 }
	res := make([]result, s)
	mustAll(t, s, func(r int) error {
		g := gs[r]
		x := &res[r]
		x.ar = exactInput(r, n)
		q1 := g.AllReduceAsync(x.ar)
		x.rsOut = make([]float32, n)
		q2 := g.ReduceScatterAsync(exactInput(r+5, s*n), x.rsOut)
		x.ag1 = make([]float32, s*n)
		if err := g.AllGather(ctx, exactInput(r+7, n), x.ag1); err != nil {
			return err
		}
		for i, q := range []Request{q1, q2} {
			if err := q.Wait(done); err != nil {
				return fmt.Errorf("request %d issued before a blocking AllGather is not done after it: %w", i, err)
			}
		}
		x.ag2 = make([]float32, s*n)
		q3 := g.AllGatherAsync(exactInput(r+9, n), x.ag2)
		x.ar2 = exactInput(r+11, n)
		if err := g.AllReduce(ctx, x.ar2); err != nil {
			return err
		}
		return q3.Wait(done)
	})
	for r := range s {
		wantAR, wantRS, wantAR2 := make([]float32, n), make([]float32, n), make([]float32, n)
		var wantAG1, wantAG2 []float32
		for q := range s {
			addF32Go(wantAR, exactInput(q, n))
			addF32Go(wantRS, exactInput(q+5, s*n)[r*n:])
			addF32Go(wantAR2, exactInput(q+11, n))
			wantAG1 = append(wantAG1, exactInput(q+7, n)...)
			wantAG2 = append(wantAG2, exactInput(q+9, n)...)
		}
		x := res[r]
		for _, c := range []struct {
			name      string
			got, want []float32
		}{{"AllReduceAsync", x.ar, wantAR}, {"ReduceScatterAsync", x.rsOut, wantRS}, {"AllGather", x.ag1, wantAG1},
			{"AllGatherAsync", x.ag2, wantAG2}, {"AllReduce", x.ar2, wantAR2}} {
			if i := firstDiff(c.got, c.want); i >= 0 {
				t.Errorf("member %d: %s differs at %d", r, c.name, i)
			}
		}
	}
}

// TestTraffic checks the bytes an all-reduce moves against the analytic
// volume 2(s−1)/s·n per member: exactly in total, and per member within the
// rounding of the chunks (one element each for two chunks).
func TestTraffic(t *testing.T) {
	ctx := context.Background()
	for _, s := range []int{2, 3, 4} {
		ws := connectWorlds(t, s, nil)
		for _, n := range []int{12, 1000, 1<<20 + 1} {
			t.Run(fmt.Sprintf("size=%d/n=%d", s, n), func(t *testing.T) {
				gs := groups(t, ws, allRanks(s))
				mustAll(t, s, func(r int) error { return gs[r].AllReduce(ctx, make([]float32, n)) })
				ideal := 2 * float64(s-1) / float64(s) * 4 * float64(n)
				var sent, recvd int64
				for r, g := range gs {
					tr := g.Traffic()
					sent += tr.SentBytes
					recvd += tr.RecvBytes
					if math.Abs(float64(tr.SentBytes)-ideal) > 8 || math.Abs(float64(tr.RecvBytes)-ideal) > 8 {
						t.Errorf("member %d: %+v, want %.1f ± 8 each way", r, tr, ideal)
					}
				}
				if want := int64(2 * (s - 1) * 4 * n); sent != want || recvd != want {
					t.Errorf("all members sent %d and received %d bytes, want %d", sent, recvd, want)
				}
			})
		}
	}
}

// TestBarrier checks that no member leaves the barrier before the last one
// has entered it.
func TestBarrier(t *testing.T) {
	for _, s := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("size=%d", s), func(t *testing.T) {
			ws := connectWorlds(t, s, nil)
			gs := groups(t, ws, allRanks(s))
			enter, leave := make([]time.Time, s), make([]time.Time, s)
			mustAll(t, s, func(r int) error {
				time.Sleep(time.Duration((r*7)%s) * 30 * time.Millisecond)
				enter[r] = time.Now()
				err := gs[r].Barrier(context.Background())
				leave[r] = time.Now()
				return err
			})
			last := slices.MaxFunc(enter, time.Time.Compare)
			for r, l := range leave {
				if l.Before(last) {
					t.Errorf("member %d left %v before the last member entered", r, last.Sub(l))
				}
			}
		})
	}
}

// TestSendRecv checks point-to-point transfers: several messages between
// one pair in order, empty messages, and both members sending first.
func TestSendRecv(t *testing.T) {
	ctx := context.Background()
	ws := connectWorlds(t, 3, func(c *Config) { c.chunkBytes = 1 << 10 })
	gs := groups(t, ws, allRanks(3))
	got := make([][]float32, 4)
	mustAll(t, 3, func(r int) error {
		g := gs[r]
		switch r {
		case 0:
			for _, n := range []int{5000, 0, 3} {
				if err := g.Send(ctx, exactInput(n, n), 1); err != nil {
					return err
				}
			}
			return g.Send(ctx, exactInput(9, 777), 2)
		case 1:
			for i, n := range []int{5000, 0, 3} {
				got[i] = make([]float32, n)
				if err := g.Recv(ctx, got[i], 0); err != nil {
					return err
				}
			}
			return nil
		default:
			got[3] = make([]float32, 777)
			return g.Recv(ctx, got[3], 0)
		}
	})
	for i, n := range []int{5000, 0, 3} {
		if d := firstDiff(got[i], exactInput(n, n)); d >= 0 {
			t.Errorf("message %d (%d elements) differs at %d", i, n, d)
		}
	}
	if d := firstDiff(got[3], exactInput(9, 777)); d >= 0 {
		t.Errorf("rank 2's message differs at %d", d)
	}
}

// TestExchange: every member exchanges with both neighbours of a ring at
// once, sending one way and receiving the other, with buffers of many
// chunks; on two members both neighbours are one member. Then two sends
// and two receives between the same pair in one Exchange, matched in the
// order listed.
func TestExchange(t *testing.T) {
	ctx := context.Background()
	for _, size := range []int{2, 3} {
		ws := connectWorlds(t, size, func(c *Config) { c.chunkBytes = 1 << 10 })
		gs := groups(t, ws, allRanks(size))
		const n = 3000
		fwd, bwd := make([][]float32, size), make([][]float32, size)
		mustAll(t, size, func(r int) error {
			next, prev := (r+1)%size, (r+size-1)%size
			fwd[r], bwd[r] = make([]float32, n), make([]float32, n+r)
			// Forward to next, receiving from prev; then backward.
			if err := gs[r].Exchange(ctx, []Transfer{{next, exactInput(r, n)}}, []Transfer{{prev, fwd[r]}}); err != nil {
				return err
			}
			return gs[r].Exchange(ctx, []Transfer{{prev, exactInput(10+r, n+prev)}}, []Transfer{{next, bwd[r]}})
		})
		for r := range size {
			prev, next := (r+size-1)%size, (r+1)%size
			if d := firstDiff(fwd[r], exactInput(prev, n)); d >= 0 {
				t.Errorf("size %d: rank %d's forward message differs at %d", size, r, d)
			}
			if d := firstDiff(bwd[r], exactInput(10+next, n+r)); d >= 0 {
				t.Errorf("size %d: rank %d's backward message differs at %d", size, r, d)
			}
		}
	}
	ws := connectWorlds(t, 2, nil)
	gs := groups(t, ws, allRanks(2))
	got := [2][2][]float32{}
	mustAll(t, 2, func(r int) error {
		got[r] = [2][]float32{make([]float32, 7), make([]float32, 7)}
		return gs[r].Exchange(ctx, []Transfer{{1 - r, exactInput(r, 7)}, {1 - r, exactInput(5+r, 7)}},
			[]Transfer{{1 - r, got[r][0]}, {1 - r, got[r][1]}})
	})
	for r := range 2 {
		if firstDiff(got[r][0], exactInput(1-r, 7)) >= 0 || firstDiff(got[r][1], exactInput(6-r, 7)) >= 0 {
			t.Errorf("rank %d received %v, %v: not in the order sent", r, got[r][0], got[r][1])
		}
	}
}

// countingStream counts Syncs, and fails the ones after fail.
type countingStream struct {
	n, fail int
}

func (s *countingStream) Sync() error {
	s.n++
	if s.n > s.fail {
		return errors.New("device fault")
	}
	return nil
}

// TestFabricWaitsForStream: each operation of a fabric's communicator waits
// for the stream first, and a stream's failure is the operation's.
func TestFabricWaitsForStream(t *testing.T) {
	ctx := context.Background()
	ws := connectWorlds(t, 2, nil)
	streams := []*countingStream{{fail: 100}, {fail: 100}}
	cs := make([]Communicator, 2)
	for r, w := range ws {
		c, err := w.Fabric(streams[r]).Communicator("test", []int{0, 1})
		if err != nil {
			t.Fatal(err)
		}
		cs[r] = c
	}
	mustAll(t, 2, func(r int) error {
		c, b := cs[r], make([]float32, 4)
		if err := c.AllReduce(ctx, b); err != nil {
			return err
		}
		if err := c.AllReduceAsync(b).Wait(ctx); err != nil {
			return err
		}
		if err := c.AllReduce64(ctx, []float64{1}); err != nil {
			return err
		}
		if err := c.ReduceScatter(ctx, b, b[:2]); err != nil {
			return err
		}
		if err := c.AllGather(ctx, b[:2], b); err != nil {
			return err
		}
		if err := c.Exchange(ctx, []Transfer{{1 - r, b[:2]}}, []Transfer{{1 - r, b[2:]}}); err != nil {
			return err
		}
		if r == 0 {
			return c.Send(ctx, b, 1)
		}
		return c.Recv(ctx, b, 0)
	})
	for r, s := range streams {
		if s.n != 7 {
			t.Errorf("rank %d: %d syncs for 7 operations", r, s.n)
		}
	}
	streams[0].fail = 0
	if err := cs[0].AllReduce(ctx, make([]float32, 4)); err == nil || !strings.Contains(err.Error(), "device fault") {
		t.Errorf("AllReduce after a failed sync: %v, want the stream's error", err)
	}
	if err := cs[0].AllReduceAsync(make([]float32, 4)).Wait(ctx); err == nil || !strings.Contains(err.Error(), "device fault") {
		t.Errorf("AllReduceAsync after a failed sync: %v, want the stream's error", err)
	}
}

// TestMismatch checks that members issuing different operations get errors
// promptly (not the timeout), naming a peer and saying why.
func TestMismatch(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		op   func(g *Group, r int) error
	}{
		{"lengths", func(g *Group, r int) error { return g.AllReduce(ctx, make([]float32, 10+2*r)) }},
		{"kinds", func(g *Group, r int) error {
			if r == 0 {
				return g.AllReduce(ctx, make([]float32, 10))
			}
			return g.Broadcast(ctx, make([]float32, 10), 0)
		}},
		{"recv length", func(g *Group, r int) error {
			if r == 0 {
				return g.Send(ctx, make([]float32, 10), 1)
			}
			return g.Recv(ctx, make([]float32, 11), 0)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := connectWorlds(t, 2, func(c *Config) { c.Timeout = 10 * time.Second })
			gs := groups(t, ws, allRanks(2))
			start := time.Now()
			errs := onAll(2, func(r int) error { return tc.op(gs[r], r) })
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("took %v", d)
			}
			mismatch := false
			for r, err := range errs {
				if tc.name == "recv length" && r == 0 {
					continue // the Send was handed to the kernel
				}
				var pe *PeerError
				if !errors.As(err, &pe) {
					t.Fatalf("member %d: %v, want a *PeerError", r, err)
				}
				mismatch = mismatch || errors.Is(err, ErrMismatch)
			}
			if !mismatch {
				t.Errorf("no error wraps ErrMismatch: %v", errs)
			}
			// The World is over for both.
			for r, g := range gs {
				if err := g.Barrier(ctx); err == nil {
					t.Errorf("member %d: Barrier after a failure succeeded", r)
				}
			}
		})
	}
}

// TestOperationTimeout checks that an operation a member never joins fails
// after the timeout with a *PeerError naming the member it waited for, and
// that the absent member's World fails too.
func TestOperationTimeout(t *testing.T) {
	t.Parallel() // alongside the tests that wait on timeouts
	const timeout = time.Second
	ws := connectWorlds(t, 2, func(c *Config) { c.Timeout = timeout })
	gs := groups(t, ws, allRanks(2))
	start := time.Now()
	err := gs[0].AllReduce(context.Background(), make([]float32, 100))
	d := time.Since(start)
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Rank != 1 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want a *PeerError naming rank 1 that wraps a deadline error", err)
	}
	if d < timeout*9/10 || d > 3*timeout {
		t.Errorf("failed after %v, want about %v", d, timeout)
	}
	t.Logf("after %v: %v", d.Round(time.Millisecond), err)
	// Rank 1 learns of it.
	start = time.Now()
	err = gs[1].Barrier(context.Background())
	if !errors.As(err, &pe) || time.Since(start) > timeout/2 {
		t.Errorf("rank 1: %v after %v, want a prompt *PeerError", err, time.Since(start))
	}
}

// TestCancel checks both kinds of cancellation: a blocking operation
// whose context ends aborts the World (the peer hears of it), while a
// Request.Wait whose context ends leaves the operation running.
func TestCancel(t *testing.T) {
	t.Run("Wait", func(t *testing.T) {
		ws := connectWorlds(t, 2, nil)
		gs := groups(t, ws, allRanks(2))
		buf := exactInput(0, 1000)
		q := gs[0].AllReduceAsync(buf)
		short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if err := q.Wait(short); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait with an expiring context: %v", err)
		}
		other := exactInput(1, 1000)
		if err := gs[1].AllReduce(context.Background(), other); err != nil {
			t.Fatal(err)
		}
		if err := q.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		if i := firstDiff(buf, other); i >= 0 {
			t.Errorf("members differ at %d", i)
		}
	})
	t.Run("blocking", func(t *testing.T) {
		ws := connectWorlds(t, 2, nil)
		gs := groups(t, ws, allRanks(2))
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := gs[0].AllReduce(ctx, make([]float32, 1000))
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second {
			t.Fatalf("got %v after %v", err, time.Since(start))
		}
		if err := gs[0].Barrier(context.Background()); err == nil || errors.As(err, new(*PeerError)) {
			t.Errorf("rank 0 after its abort: %v, want the abort", err)
		}
		err = gs[1].Barrier(context.Background())
		var pe *PeerError
		if !errors.As(err, &pe) || pe.Rank != 0 {
			t.Errorf("rank 1: %v, want a *PeerError naming rank 0", err)
		}
	})
}

// TestClose checks Close: a member waiting for a closed peer fails naming
// it, and a closed World refuses everything.
func TestClose(t *testing.T) {
	ctx := context.Background()
	ws := connectWorlds(t, 2, nil)
	gs := groups(t, ws, allRanks(2))
	errc := make(chan error, 1)
	go func() { errc <- gs[0].AllReduce(ctx, make([]float32, 10)) }()
	time.Sleep(50 * time.Millisecond)
	if err := ws[1].Close(); err != nil {
		t.Fatal(err)
	}
	var pe *PeerError
	if err := <-errc; !errors.As(err, &pe) || pe.Rank != 1 || !errors.Is(err, ErrPeerClosed) {
		t.Errorf("rank 0: %v, want a *PeerError naming rank 1, ErrPeerClosed", err)
	}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"AllReduce", gs[1].AllReduce(ctx, make([]float32, 10))},
		{"AllReduceAsync", gs[1].AllReduceAsync(make([]float32, 10)).Wait(ctx)},
		{"Barrier", gs[1].Barrier(ctx)},
		{"Group", func() error { _, err := ws[1].Group([]int{0, 1}); return err }()},
		{"Close again", ws[1].Close()},
	} {
		want := ErrClosed
		if tc.name == "Close again" {
			want = nil
		}
		if !errors.Is(tc.err, want) || (want == nil && tc.err != nil) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, want)
		}
	}
}

// TestArguments checks that invalid calls fail at once, without reaching
// the network (the World stays usable).
func TestArguments(t *testing.T) {
	ctx := context.Background()
	ws := connectWorlds(t, 2, nil)
	g := groups(t, ws, allRanks(2))[0]
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"ReduceScatter", g.ReduceScatter(ctx, make([]float32, 5), make([]float32, 3))},
		{"ReduceScatterAsync", g.ReduceScatterAsync(make([]float32, 5), make([]float32, 3)).Wait(ctx)},
		{"AllGather", g.AllGather(ctx, make([]float32, 3), make([]float32, 5))},
		{"AllGatherAsync", g.AllGatherAsync(make([]float32, 3), make([]float32, 5)).Wait(ctx)},
		{"Broadcast root", g.Broadcast(ctx, nil, 2)},
		{"Send to self", g.Send(ctx, nil, 0)},
		{"Recv out of range", g.Recv(ctx, nil, -1)},
	} {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	for _, ranks := range [][]int{nil, {1, 0}, {0, 0, 1}, {0, 2}, {1}, {-1, 0}} {
		if _, err := ws[0].Group(ranks); err == nil {
			t.Errorf("Group(%v): no error", ranks)
		}
	}
	gs := groups(t, ws, allRanks(2))
	mustAll(t, 2, func(r int) error { return gs[r].Barrier(ctx) })
}

// TestSingleRank checks that a World of one needs no master and that every
// operation works locally.
func TestSingleRank(t *testing.T) {
	ctx := context.Background()
	w, err := Connect(ctx, Config{Rank: 0, WorldSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	g, err := w.Group([]int{0})
	if err != nil {
		t.Fatal(err)
	}
	buf := exactInput(0, 5)
	out := make([]float32, 5)
	d := []float64{1.5}
	for _, err := range []error{
		g.AllReduce(ctx, buf), g.AllReduce64(ctx, d), g.ReduceScatter(ctx, buf, out),
		g.Broadcast(ctx, buf, 0), g.Barrier(ctx), g.AllGatherAsync(buf, out).Wait(ctx),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if firstDiff(buf, exactInput(0, 5)) >= 0 || firstDiff(out, buf) >= 0 || d[0] != 1.5 {
		t.Errorf("a one-member group changed the data: %v %v %v", buf, out, d)
	}
}

// TestAddF32 checks the vectorized add against the plain loop, bit for bit.
func TestAddF32(t *testing.T) {
	for n := range 70 {
		dst, src := randomInput(1, n), randomInput(2, n+3)
		want := slices.Clone(dst)
		addF32Go(want, src)
		addF32(dst, src)
		if i := firstDiff(dst, want); i >= 0 {
			t.Fatalf("n=%d: element %d: %v, want %v", n, i, dst[i], want[i])
		}
	}
}

// TestCloseLeavesNothing checks that closing the worlds stops every
// goroutine they started (connections, groups, the master).
func TestCloseLeavesNothing(t *testing.T) {
	before := runtime.NumGoroutine()
	ws := connectWorlds(t, 3, nil)
	gs := groups(t, ws, allRanks(3))
	mustAll(t, 3, func(r int) error { return gs[r].AllReduce(context.Background(), exactInput(r, 1000)) })
	pending := gs[0].AllReduceAsync(make([]float32, 10)) // never joined by the others
	closeWorlds(ws)
	// Which comes first, its own Close or a peer's goodbye, is a race.
	if err := pending.Wait(context.Background()); !errors.Is(err, ErrClosed) && !errors.Is(err, ErrPeerClosed) {
		t.Errorf("pending operation: %v, want ErrClosed or ErrPeerClosed", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<16)
		t.Errorf("%d goroutines before, %d after closing:\n%s", before, n, buf[:runtime.Stack(buf, true)])
	}
}
