package engine

import (
	"hash/fnv"
	"math"
	"runtime"
	"slices"
	"sync"

	"github.com/gptui/gptui/kernels"
)

// Initialisation and loading fill a rank's part of the parameters, and no
// more: each tensor piece the rank holds (Tensor.Pieces) is a block of a
// global tensor, and a blockSource writes any such block — from the
// initialisation's generator, a checkpoint or an llm.c file — into the
// rank's buffer, without the rest of the model ever being made. The
// buffer is the backend's memory, which the host writes through
// kernels.Upload only (fillSpans): straight into it where the backend
// computes on the host, else from a staging buffer of a few megabytes.

// blockSource writes the block of global tensor t.Name (of shape t.Global)
// that starts at start and has shape shape into dst, a row-major array of
// shape dstShape, at dstAt.
type blockSource func(t Tensor, start, shape []int, dst []float32, dstShape, dstAt []int) error

// fillWindow is the most elements fillSpans stages in host memory at once
// for a backend whose memory the host does not write itself (4 MB).
const fillWindow = 1 << 20

// fillSpans fills dst, a buffer of be laid out by spans — a rank's part
// ({0, 0, NumParams}) or its shard of it (Span) — with the elements of
// the flat layout ts that spans map, from src. On a backend that computes
// on the host it writes dst in place; on one with its own memory
// (kernels.Memory: a GPU, kernels/deferred) it fills a host buffer of at
// most fillWindow elements at a time and uploads it, each upload ordered
// after the kernels queued before it.
func fillSpans(be kernels.Backend, ts []Tensor, spans []Span, dst []float32, src blockSource) error {
	if _, ok := be.(kernels.Memory); !ok {
		for _, s := range spans {
			if err := fillRange(ts, s.Flat, s.Flat+s.N, dst[s.At:s.At+s.N], src); err != nil {
				return err
			}
		}
		return nil
	}
	var stage []float32
	for _, s := range spans {
		for k := 0; k < s.N; k += fillWindow {
			n := min(fillWindow, s.N-k)
			if len(stage) < n {
				stage = make([]float32, n)
			}
			if err := fillRange(ts, s.Flat+k, s.Flat+k+n, stage[:n], src); err != nil {
				return err
			}
			kernels.Upload(be, dst[s.At+k:s.At+k+n], stage[:n])
		}
	}
	return nil
}

// fillRange fills elements [lo, hi) of a flat buffer laid out by ts from
// src: dst[i-lo] is element i (dst is the buffer itself when lo is 0, or a
// shard of it). Each tensor's share of the range is cut into boxes, each
// a contiguous stretch of the tensor that is a block of it too (see
// boxes), and each piece of the tensor that meets a box is written into
// it by one call of src.
func fillRange(ts []Tensor, lo, hi int, dst []float32, src blockSource) error {
	for _, t := range ts {
		s, e := max(lo, t.Offset), min(hi, t.Offset+t.Size)
		if s >= e {
			continue
		}
		for _, b := range boxes(t.Shape, s-t.Offset, e-t.Offset) {
			at := t.Offset + b.offset - lo
			into := dst[at : at+numel(b.shape)]
			for _, pc := range t.Pieces {
				n := len(pc.Shape)
				start, shape, dstAt := make([]int, n), make([]int, n), make([]int, n)
				meets := true
				for d := range n {
					a := max(b.at[d], pc.Local[d])
					z := min(b.at[d]+b.shape[d], pc.Local[d]+pc.Shape[d])
					if a >= z {
						meets = false
						break
					}
					start[d], shape[d], dstAt[d] = pc.Global[d]+a-pc.Local[d], z-a, a-b.at[d]
				}
				if !meets {
					continue
				}
				if err := src(t, start, shape, into, b.shape, dstAt); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// box is a block of a row-major tensor that is also a contiguous stretch
// of it: extent 1 in the dimensions before some dimension, a range in it,
// whole in the ones after.
type box struct {
	at, shape []int // the block
	offset    int   // its first element in the tensor
}

// boxes cuts elements [s, e) of a row-major tensor of shape shape into
// at most 2·len(shape)−1 boxes, in order.
func boxes(shape []int, s, e int) []box {
	var out []box
	var cut func(prefix []int, off, s, e int)
	// cut boxes elements [s, e) of the sub-tensor at index prefix (of
	// shape shape[len(prefix):], first element off).
	cut = func(prefix []int, off, s, e int) {
		if s >= e {
			return
		}
		d := len(prefix)
		row := numel(shape[d+1:])
		whole := func(r0, r1 int) {
			at := append(slices.Clone(prefix), r0)
			sh := make([]int, d+1, len(shape))
			for i := range d {
				sh[i] = 1
			}
			sh[d] = r1 - r0
			out = append(out, box{append(at, make([]int, len(shape)-d-1)...), append(sh, shape[d+1:]...), off + r0*row})
		}
		r0, r1 := s/row, e/row
		if r0 == r1 || d == len(shape)-1 {
			if d == len(shape)-1 {
				whole(s, e)
				return
			}
			cut(append(slices.Clone(prefix), r0), off+r0*row, s-r0*row, e-r0*row)
			return
		}
		if s%row != 0 {
			cut(append(slices.Clone(prefix), r0), off+r0*row, s-r0*row, row)
			r0++
		}
		if r0 < r1 {
			whole(r0, r1)
		}
		if e%row != 0 {
			cut(append(slices.Clone(prefix), r1), off+r1*row, 0, e-r1*row)
		}
	}
	cut(nil, 0, s, e)
	return out
}

// forRuns calls fn for each run of a block (shape shape at start in a
// row-major tensor of shape global, written into a row-major array of
// shape dstShape at dstAt): the run's first element in the array (k) and
// in the tensor (g), and its length n (shape's last dimension). The runs
// are split among up to GOMAXPROCS goroutines when the block is large, so
// fn must be safe to call concurrently on different runs.
func forRuns(global, start, shape, dstShape, dstAt []int, fn func(k, g, n int)) {
	runs := numRuns(shape)
	const perWorker = 1 << 16 // elements below which one goroutine does it all
	w := min(runtime.GOMAXPROCS(0), runs, numel(shape)/perWorker)
	each := func(from, to int) {
		eachRun(global, start, shape, dstShape, dstAt, from, to, func(k, g, n int) bool { fn(k, g, n); return true })
	}
	if w <= 1 {
		each(0, runs)
		return
	}
	var wg sync.WaitGroup
	for i := range w {
		wg.Go(func() { each(i*runs/w, (i+1)*runs/w) })
	}
	wg.Wait()
}

// numRuns is the number of runs (rows of the last dimension) of a block of
// shape shape: 0 for an empty one.
func numRuns(shape []int) int {
	if len(shape) == 0 || numel(shape) == 0 {
		return 0
	}
	return numel(shape) / shape[len(shape)-1]
}

// eachRun calls fn, as forRuns does, for runs from … to-1 of the block in
// order, until fn returns false.
func eachRun(global, start, shape, dstShape, dstAt []int, from, to int, fn func(k, g, n int) bool) {
	d := len(shape)
	if from >= to {
		return
	}
	inner := shape[d-1]
	gs, ds := strides(global), strides(dstShape)
	idx := make([]int, d-1) // run r's index in the block's outer dimensions
	for i, r := d-2, from; i >= 0; i-- {
		idx[i] = r % shape[i]
		r /= shape[i]
	}
	for r := from; r < to; r++ {
		g, k := start[d-1], dstAt[d-1]
		for i, v := range idx {
			g += (start[i] + v) * gs[i]
			k += (dstAt[i] + v) * ds[i]
		}
		if !fn(k, g, inner) {
			return
		}
		for i := d - 2; i >= 0; i-- {
			if idx[i]++; idx[i] < shape[i] {
				break
			}
			idx[i] = 0
		}
	}
}

// The initialisation's generator is counter-based: the value of element i
// of global tensor name is a function of (seed, name, i) alone, so a rank
// computes the elements it holds — under any tensor-, pipeline- or
// sharding layout — exactly as one process holding the whole model does,
// without drawing the others. Element pairs (2j, 2j+1) are the two normals
// Box–Muller makes of two uniforms, each a splitmix64 hash of the tensor's
// key and a counter.

// mix64 is splitmix64's finaliser, a bijection of 64-bit words that
// scatters every input bit over the output.
func mix64(z uint64) uint64 {
	z ^= z >> 30
	z *= 0xbf58476d1ce4e5b9
	z ^= z >> 27
	z *= 0x94d049bb133111eb
	return z ^ z>>31
}

// initKey is the generator's key of tensor name under seed.
func initKey(seed uint64, name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return mix64(seed ^ mix64(h.Sum64()))
}

// normalPair returns the standard normals of elements 2j and 2j+1 of the
// tensor keyed key.
func normalPair(key uint64, j int) (float64, float64) {
	a := mix64(key + mix64(uint64(2*j)))
	b := mix64(key + mix64(uint64(2*j+1)))
	u1 := float64(a>>11+1) / (1 << 53) // (0, 1]: the logarithm is finite
	u2 := float64(b>>11) / (1 << 53)   // [0, 1)
	r := math.Sqrt(-2 * math.Log(u1))
	s, c := math.Sincos(2 * math.Pi * u2)
	return r * c, r * s
}

// fillNormal sets dst[k] to std times the standard normal of element g+k
// of the tensor keyed key.
func fillNormal(dst []float32, key uint64, g int, std float64) {
	for k := 0; k < len(dst); {
		i := g + k
		z0, z1 := normalPair(key, i/2)
		if i%2 == 1 {
			dst[k] = float32(z1 * std)
			k++
			continue
		}
		dst[k] = float32(z0 * std)
		if k+1 < len(dst) {
			dst[k+1] = float32(z1 * std)
		}
		k += 2
	}
}

// initSource is the initialisation of a model of shape cfg as a
// blockSource: N(0, std) for the embeddings and the matrices, the residual
// output projections (attprojw, fcprojw: a Llama's o_proj and down_proj
// too) N(0, std/√(2L)), biases 0, LayerNorm and RMSNorm weights 1 and
// biases 0. The padded rows of wte (and of a Llama's lmhead) are 0: no
// token reads them and no logit is computed for them.
func initSource(cfg ModelConfig, std float64, seed uint64) blockSource {
	resid := std / math.Sqrt(2*float64(cfg.L))
	return func(t Tensor, start, shape []int, dst []float32, dstShape, dstAt []int) error {
		sd, end := 0.0, 0  // the normals' deviation; the element where they stop
		rest := float32(0) // the value of the other elements
		switch t.Name {
		case "ln1w", "ln2w", "lnfw":
			rest = 1
		case "wte", "lmhead":
			sd, end = std, cfg.V*cfg.C
		case "wpe", "qkvw", "fcw":
			sd, end = std, numel(t.Global)
		case "attprojw", "fcprojw":
			sd, end = resid, numel(t.Global)
		}
		key := initKey(seed, t.Name)
		forRuns(t.Global, start, shape, dstShape, dstAt, func(k, g, n int) {
			row := dst[k : k+n]
			m := min(max(end-g, 0), n)
			fillNormal(row[:m], key, g, sd)
			for i := range row[m:] {
				row[m+i] = rest
			}
		})
		return nil
	}
}
