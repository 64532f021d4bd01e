package engine

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/kernels/deferred"
	"github.com/gptui/gptui/presets"
)

// TestGradBuckets: the gradient all-reduce's buckets (gradBuckets) of the
// GPT-2 124M and Llama 1B presets, whole and as a tensor-parallel rank's
// or a pipeline stage's part, tile the part's tensors exactly; each is one
// contiguous range of the flat buffer whose every element belongs to a
// block it waits for (or, outer, to an outer tensor), launched when its
// lowest block is done; none is larger than 25 MiB unless it is one
// block's slice of one tensor or the outer tensors'. And there are fewer
// than the one request per tensor per block of before: GPT-2 124M's
// blocks make under a quarter as many (Llama 1B's large matrices are
// each a bucket, one block's slice of one being over 25 MiB already).
func TestGradBuckets(t *testing.T) {
	for _, preset := range []string{"gpt2-124m", "llama-1b"} {
		cfg, err := presets.Load(preset, nil)
		if err != nil {
			t.Fatal(err)
		}
		shape := ShapeOf(cfg)
		whole := WholePart(shape)
		mp := whole
		mp.MP, mp.MPRank = 2, 1
		first, last := whole, whole
		first.Layers, first.Head = whole.Layers[:shape.L/2], false
		last.Layers, last.Embed = whole.Layers[shape.L/2:], false
		for _, p := range []struct {
			name string
			part Part
		}{{"whole", whole}, {"mp2 rank 1", mp}, {"pp2 first stage", first}, {"pp2 last stage", last}} {
			ts, n := PartTensors(shape, p.part)
			l := len(p.part.Layers)
			bs := gradBuckets(ts, l, bucketBytes)
			if msg := checkBuckets(ts, n, l, bs, bucketBytes); msg != "" {
				t.Errorf("%s %s: %s", preset, p.name, msg)
			}
			layered := 0
			for _, t := range ts {
				if !outerTensor(t.Name) {
					layered++
				}
			}
			before := layered*l + len(ts) - layered
			if len(bs) >= before || preset == "gpt2-124m" && len(bs) > before/4 {
				t.Errorf("%s %s: %d buckets, one per tensor per block was %d", preset, p.name, len(bs), before)
			}
			t.Logf("%s %s: %d buckets (one per tensor per block: %d)", preset, p.name, len(bs), before)
		}
	}
}

// checkBuckets checks buckets bs of the tensors ts (n elements, l blocks)
// as TestGradBuckets says, and returns what is wrong, or "".
func checkBuckets(ts []Tensor, n, l int, bs []gradBucket, capBytes int) string {
	// Which tensor and block each element range belongs to: the tensors
	// sorted by offset.
	ts = slices.Clone(ts)
	slices.SortFunc(ts, func(a, b Tensor) int { return a.Offset - b.Offset })
	covered := 0
	for _, t := range ts {
		covered += t.Size
	}
	var spans [][2]int
	seenOuter := false
	for k, b := range bs {
		if b.start >= b.end || b.start < 0 || b.end > n {
			return fmt.Sprintf("bucket %d: range [%d, %d) outside [0, %d)", k, b.start, b.end, n)
		}
		if seenOuter && !b.outer {
			return fmt.Sprintf("bucket %d of the blocks after an outer bucket", k)
		}
		seenOuter = seenOuter || b.outer
		spans = append(spans, [2]int{b.start, b.end})
		pieces, lowest := 0, l
		for _, t := range ts {
			lo, hi := max(b.start, t.Offset), min(b.end, t.Offset+t.Size)
			if lo >= hi {
				continue
			}
			if outerTensor(t.Name) != b.outer {
				return fmt.Sprintf("bucket %d (outer %v) holds %s", k, b.outer, t.Name)
			}
			if b.outer {
				continue
			}
			s := t.Size / l
			if (lo-t.Offset)%s != 0 || (hi-t.Offset)%s != 0 {
				return fmt.Sprintf("bucket %d cuts a block of %s", k, t.Name)
			}
			blo, bhi := (lo-t.Offset)/s, (hi-t.Offset)/s-1
			if blo < b.lo || bhi > b.hi {
				return fmt.Sprintf("bucket %d waits for blocks %d…%d, holds %s's %d…%d", k, b.lo, b.hi, t.Name, blo, bhi)
			}
			pieces += bhi - blo + 1
			lowest = min(lowest, blo)
		}
		if !b.outer && lowest != b.lo {
			return fmt.Sprintf("bucket %d waits for block %d, its lowest is %d", k, b.lo, lowest)
		}
		if !b.outer && 4*(b.end-b.start) > capBytes && pieces > 1 {
			return fmt.Sprintf("bucket %d: %d bytes in %d slices, over %d", k, 4*(b.end-b.start), pieces, capBytes)
		}
	}
	slices.SortFunc(spans, func(a, b [2]int) int { return a[0] - b[0] })
	sum := 0
	for i, s := range spans {
		if i > 0 && s[0] < spans[i-1][1] {
			return fmt.Sprintf("buckets overlap at %d", s[0])
		}
		sum += s[1] - s[0]
	}
	if sum != covered {
		return fmt.Sprintf("buckets cover %d elements, the tensors %d", sum, covered)
	}
	return ""
}

// commTrace is the deferred backend with a record of a rank's step, in
// queue order: each bucket's all-reduce launched and waited for
// (dataParallel.observe), the embedding's backward (EncoderBackward, the
// backward pass's last kernel) and the update's kernels (SumSquares for
// the gradient norm, then AdamW), each with the kernels queued before it.
type commTrace struct {
	*deferred.Backend
	events []traceEvent
}

type traceEvent struct {
	kind   string // "launch", "wait", "embed backward", "update"
	bucket int    // launch and wait
	kernel int    // the kernels queued before it (deferred.Counts.Kernels)
}

func (c *commTrace) note(kind string, bucket int) {
	c.events = append(c.events, traceEvent{kind, bucket, c.Counts().Kernels})
}

func (c *commTrace) EncoderBackward(dwte, dwpe, dout []float32, inp []int32, B, T, C int) {
	c.note("embed backward", -1)
	c.Backend.EncoderBackward(dwte, dwpe, dout, inp, B, T, C)
}

func (c *commTrace) EncoderShardBackward(dwte []float32, vlo int, dwpe, dout []float32, inp []int32, B, T, C int) {
	c.note("embed backward", -1)
	c.Backend.EncoderShardBackward(dwte, vlo, dwpe, dout, inp, B, T, C)
}

func (c *commTrace) SumSquares(out []float64, x []float32, w float64) {
	c.note("update", -1)
	c.Backend.SumSquares(out, x, w)
}

func (c *commTrace) AdamW(params, grads, m, v []float32, lr, beta1, beta2, eps, wd, gscale float32, t int) {
	c.note("update", -1)
	c.Backend.AdamW(params, grads, m, v, lr, beta1, beta2, eps, wd, gscale, t)
}

// TestBucketsOverlapBackward: on the asynchronous poisoning backend, a
// dp2 run of a 4-block model with 8 KiB buckets (so that every block
// completes some) matches the single process, and in every step of
// either rank each bucket of the blocks has its all-reduce launched
// during the last micro-batch's backward pass, before the embedding's
// backward — the pass's last kernel — is queued, as its blocks complete
// (one launch point per block), the outer tensors' buckets after it;
// and no bucket is waited for before that last kernel, every one before
// the update (the gradient norm's SumSquares, AdamW). A reduction moved
// after the backward pass (all launched in finish) fails it.
func TestBucketsOverlapBackward(t *testing.T) {
	const layers, capBytes = 4, 8 << 10
	tc := parityCase{"dp2 4 blocks 8 KiB buckets", 2, []string{"Distributed.dp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=2",
		fmt.Sprintf("Model.num_layers=%d", layers)}}
	var mu sync.Mutex // the ranks' edits run in their goroutines
	var traces []*commTrace
	var dps []*dataParallel
	o := rankOptions{
		backend: func() kernels.Backend { return &commTrace{Backend: deferred.NewSealed(fixedPeak{cpu.New()})} },
		edit: func(tr *Trainer) {
			c := tr.be.(*commTrace)
			tr.dp.bucketBytes = capBytes
			tr.dp.observe = func(e bucketEvent) {
				kind := "launch"
				if e.wait {
					kind = "wait"
				}
				c.note(kind, e.bucket)
			}
			mu.Lock()
			defer mu.Unlock()
			traces, dps = append(traces, c), append(dps, tr.dp)
		},
	}
	checkParity(t, tc, parityReference{}, o)
	if len(traces) != 2 {
		t.Fatalf("%d ranks traced, want 2", len(traces))
	}
	for r, c := range traces {
		bs := dps[r].buckets
		if len(bs) < layers+1 {
			t.Fatalf("rank %d: %d buckets at %d bytes, want some for each of the %d blocks", r, len(bs), capBytes, layers)
		}
		steps := traceSteps(c.events)
		if len(steps) != 5 {
			t.Errorf("rank %d: %d steps traced, want 5", r, len(steps))
		}
		for s, evs := range steps {
			if msg := checkOverlap(evs, bs, layers); msg != "" {
				t.Errorf("rank %d step %d: %s\n%s", r, s+1, msg, describeTrace(evs, bs))
			} else if r == 0 && s == 0 {
				t.Logf("rank 0 step 1:\n%s", describeTrace(evs, bs))
			}
		}
	}
}

// traceSteps cuts a rank's trace into its steps: each ends at the first
// update kernel after it (the ones after that, and an update with no
// step before it, belong to none).
func traceSteps(evs []traceEvent) [][]traceEvent {
	var steps [][]traceEvent
	var cur []traceEvent
	for _, e := range evs {
		if e.kind != "update" {
			cur = append(cur, e)
			continue
		}
		if len(cur) > 0 {
			steps = append(steps, append(cur, e))
			cur = nil
		}
	}
	return steps
}

// checkOverlap checks one step's trace evs (ending at its first update
// kernel) against the buckets bs of a part of l blocks, as
// TestBucketsOverlapBackward says, and returns what is wrong, or "".
func checkOverlap(evs []traceEvent, bs []gradBucket, l int) string {
	end := -1 // the last embedding backward: the backward pass's last kernel
	for i, e := range evs {
		if e.kind == "embed backward" {
			end = i
		}
	}
	if end < 0 {
		return "no embedding backward"
	}
	launched, waited := make([]int, len(bs)), make([]int, len(bs))
	points := map[int]bool{} // the kernel counts the blocks' buckets were launched at
	lastBlocks := -1
	for i, e := range evs {
		switch e.kind {
		case "launch":
			launched[e.bucket]++
			if bs[e.bucket].outer {
				if i < end {
					return fmt.Sprintf("outer bucket %d launched before the backward pass's last kernel", e.bucket)
				}
				continue
			}
			if i > end {
				return fmt.Sprintf("bucket %d (blocks %d…%d) launched after the backward pass's last kernel (kernel %d, the last at %d)", e.bucket, bs[e.bucket].lo, bs[e.bucket].hi, e.kernel, evs[end].kernel)
			}
			points[e.kernel] = true
			lastBlocks = i
		case "wait":
			waited[e.bucket]++
			if i < end {
				return fmt.Sprintf("bucket %d waited for before the backward pass's last kernel", e.bucket)
			}
		}
	}
	for k := range bs {
		if launched[k] != 1 || waited[k] != 1 {
			return fmt.Sprintf("bucket %d launched %d times and waited for %d times in the step, want once each", k, launched[k], waited[k])
		}
	}
	for i, e := range evs {
		if e.kind == "launch" && bs[e.bucket].outer && i < lastBlocks {
			return fmt.Sprintf("outer bucket %d launched before the blocks' buckets", e.bucket)
		}
	}
	if len(points) != l {
		return fmt.Sprintf("the blocks' buckets launched at %d points of the backward pass, want one per block (%d)", len(points), l)
	}
	return ""
}

// describeTrace writes a step's trace for the test's log: each event with
// the kernel it came at.
func describeTrace(evs []traceEvent, bs []gradBucket) string {
	var b strings.Builder
	for _, e := range evs {
		switch e.kind {
		case "launch", "wait":
			bk := bs[e.bucket]
			what := fmt.Sprintf("blocks %d…%d", bk.lo, bk.hi)
			if bk.outer {
				what = "outer tensors"
			}
			fmt.Fprintf(&b, "\tkernel %5d: %s bucket %d (%s, %d bytes)\n", e.kernel, e.kind, e.bucket, what, 4*(bk.end-bk.start))
		default:
			fmt.Fprintf(&b, "\tkernel %5d: %s\n", e.kernel, e.kind)
		}
	}
	return b.String()
}

// TestSmallBucketsSameNumbers: with 1 KiB buckets — nearly every block's
// slice of every tensor its own, the small tensors' spanning blocks, and
// on an interleaved pipeline a rank's two chunks — data parallel and
// sharding stage 1 train to the same losses and weights, bit for bit, as
// with the 25 MiB buckets (one for these models' blocks): the buckets
// cover every gradient once, each launched only once it is complete, and
// a two-member all-reduce adds each element alike however it is cut.
func TestSmallBucketsSameNumbers(t *testing.T) {
	for _, tc := range []parityCase{
		{"dp2", 2, []string{"Distributed.dp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=2"}},
		{"sharding2 stage1", 2, []string{"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=1", "Global.local_batch_size=4", "Global.micro_batch_size=2"}},
		{"dp2 mp2", 4, []string{"Distributed.dp_degree=2", "Distributed.mp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=2"}},
		{"dp2 pp2 interleaved vpp2", 4, []string{"Distributed.dp_degree=2", "Distributed.pp_degree=2", "Distributed.vpp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := append(append(parityOverrides(t), "Model.num_layers=4"), tc.o...)
			small := rankOptions{backend: deferredBackend, edit: func(tr *Trainer) { tr.dp.bucketBytes = 1 << 10 }}
			want := runRanksWith(t, tc.world, o, rankOptions{backend: deferredBackend})
			got := runRanksWith(t, tc.world, o, small)
			for k := range tc.world {
				if n := len(got.trs[k].dp.buckets); n < 10 {
					t.Errorf("rank %d: %d buckets of 1 KiB, want many", k, n)
				}
				if !slices.Equal(got.res[k].Losses, want.res[k].Losses) {
					t.Errorf("rank %d: losses %v with 1 KiB buckets, %v with 25 MiB", k, got.res[k].Losses, want.res[k].Losses)
				}
				if !slices.Equal(got.params[k], want.params[k]) {
					t.Errorf("rank %d: weights differ with 1 KiB buckets by %.3g (relative L2)", k, relNorm(got.params[k], want.params[k]))
				}
			}
		})
	}
}

// TestReduceBF16: under Engine.mix_precision.reduce_dtype bf16 the
// replicas' gradients are summed in bfloat16 — after the last step every
// element of the gradients is a bfloat16 value, which a float32 sum would
// not leave — and the layouts still give one process's losses and
// weights within the bf16 tolerances, on the CPU with bf16 GEMMs and on
// the poisoning backend over it (each bucket is rounded into its
// bfloat16 copy before its all-reduce and widened back only after the
// all-reduce is waited for: read too early, the poisoning shows).
// Sharding stage 2 reduce-scatters in float32 whatever reduce_dtype says.
func TestReduceBF16(t *testing.T) {
	bf16, err := cpuBF16Backend()
	if bf16 == nil {
		t.Skipf("bf16 on this CPU: %v", err)
	}
	byName := map[string]parityCase{}
	for _, c := range parityCases() {
		byName[c.name] = c
	}
	singles := parityReference{}
	for _, b := range []struct {
		name    string
		backend func() kernels.Backend
	}{{"cpu", bf16}, {"deferred", func() kernels.Backend { return deferred.NewSealed(bf16()) }}} {
		for _, name := range []string{"dp2", "dp2 mp2", "sharding2 stage1", "sharding2 stage2"} {
			tc := byName[name]
			tc.o = append(slices.Clone(tc.o), "Engine.mix_precision.dtype=bf16", "Engine.mix_precision.reduce_dtype=bf16")
			t.Run(b.name+" "+name, func(t *testing.T) {
				r := checkParity(t, tc, singles, rankOptions{backend: b.backend})
				half := !strings.Contains(name, "stage2")
				for k, tr := range r.trs {
					if got := tr.dp.half != nil; got != half {
						t.Fatalf("rank %d: a bfloat16 copy of the gradients: %v, want %v", k, got, half)
					}
					g := make([]float32, tr.Model.NumParams())
					if err := kernels.Download(tr.be, g, tr.Model.Grads[:len(g)]); err != nil {
						t.Fatal(err)
					}
					if n := notBF16(g); half && n > 0 {
						t.Errorf("rank %d: %d of %d gradients are not bfloat16 after a bfloat16 all-reduce", k, n, len(g))
					}
				}
			})
		}
	}
}
