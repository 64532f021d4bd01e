package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"

	"github.com/gptui/gptui/kernels"
)

// SampleOptions control how the next token is drawn from the logits.
type SampleOptions struct {
	MaxNewTokens int     // tokens to generate after each prompt
	Temperature  float64 // 0: greedy (argmax)
	TopK         int     // keep the K most likely tokens; 0: all
	TopP         float64 // keep the smallest set whose probability reaches P; 0 or 1: all
	Seed         uint64  // sampling RNG seed
}

// kvCache holds, per layer, the keys and values of every position seen:
// C channels a position in GPT-2, a Llama's NKV·hd (its grouped heads).
type kvCache struct {
	B, maxT int
	k, v    [][]float32 // L × (B,maxT,C) or (B,maxT,NKV·hd)
}

// decodeActs are the (B,·) buffers of one decoding step, the backend's:
// the host reads and writes none of them, only uploads the step's tokens
// and downloads its logits.
type decodeActs struct {
	tok                                                    []int32 // (B) the step's tokens
	x, ln, mean, rstd, qkv, q, atty, proj, res2, fch, fchG []float32
	logits                                                 []float32 // (B,V)
}

// free gives a's buffers back to the backend.
func (a *decodeActs) free(be kernels.Backend) {
	kernels.Free(be, a.tok)
	for _, x := range [][]float32{a.x, a.ln, a.mean, a.rstd, a.qkv, a.q, a.atty, a.proj, a.res2, a.fch, a.fchG, a.logits} {
		kernels.Free(be, x)
	}
}

// Generate continues each prompt by MaxNewTokens tokens with a key/value
// cache: every step runs the model on one new token per sequence, so the
// cost per token does not grow with re-running the prompt. Sequences advance
// in lockstep, one position per step; a sequence feeds its own prompt until it
// is used up and then its samples. emit, when not nil, receives each
// generated token as it is drawn. It returns the generated tokens.
func (m *Model) Generate(ctx context.Context, prompts [][]int, opt SampleOptions, emit func(seq, tok int) error) ([][]int, error) {
	c := m.Cfg
	B := len(prompts)
	longest := 0
	for i, p := range prompts {
		if len(p) == 0 {
			return nil, fmt.Errorf("prompt %d is empty", i)
		}
		for _, t := range p {
			if t < 0 || t >= c.V {
				return nil, fmt.Errorf("prompt %d: token %d outside the vocabulary of %d", i, t, c.V)
			}
		}
		longest = max(longest, len(p))
	}
	total := longest - 1 + opt.MaxNewTokens
	for _, p := range prompts {
		total = max(total, len(p)+opt.MaxNewTokens)
	}
	if total > c.MaxT {
		return nil, errors.New(fmt.Sprint("prompt plus ", opt.MaxNewTokens, " new tokens needs ", total, " positions; the model has ", c.MaxT))
	}
	// The cache and the rotary table hold the positions this generation
	// reaches, not max_position_embeddings (a Llama 3.1's 131072 would
	// make its cache 34 GB at 8B).
	cache := &kvCache{B: B, maxT: total, k: make([][]float32, c.L), v: make([][]float32, c.L)}
	kvw := c.KVHeads() * (c.C / c.NH) // channels of a position's keys (values)
	for l := range cache.k {
		cache.k[l] = m.floats(B * total * kvw)
		cache.v[l] = m.floats(B * total * kvw)
	}
	m.ensureRope(total)
	defer func() {
		for l := range cache.k {
			kernels.Free(m.be, cache.k[l])
			kernels.Free(m.be, cache.v[l])
		}
	}()
	f, w := m.floats, m.blockWidths()
	a := &decodeActs{
		tok: kernels.Int32s(m.be, B), x: f(B * c.C), ln: f(B * c.C), mean: f(B), rstd: f(B),
		qkv: f(B * w.qkv), q: f(B * c.C), atty: f(B * c.C), proj: f(B * c.C),
		res2: f(B * c.C), fch: f(B * w.fc), fchG: f(B * w.act), logits: f(B * c.V),
	}
	defer a.free(m.be)
	rng := rand.New(rand.NewPCG(opt.Seed, 0x73616d706c65)) // "sample"
	out := make([][]int, B)
	next := make([]int32, B)
	probs := make([]float64, c.V)
	logits := make([]float32, B*c.V) // the host's copy of a.logits
	for pos := 0; ; pos++ {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		done := true
		for b, p := range prompts {
			switch {
			case pos < len(p):
				next[b] = int32(p[pos])
			case len(out[b]) > 0:
				next[b] = int32(out[b][len(out[b])-1])
			}
			if len(out[b]) < opt.MaxNewTokens {
				done = false
			}
		}
		if done {
			return out, nil
		}
		kernels.Upload(m.be, a.tok, next)
		m.fam.decodeStep(cache, a, pos)
		if err := kernels.Download(m.be, logits, a.logits); err != nil {
			return out, err
		}
		for b, p := range prompts {
			if pos < len(p)-1 || len(out[b]) >= opt.MaxNewTokens {
				continue
			}
			tok := sample(logits[b*c.V:(b+1)*c.V], opt, rng, probs)
			out[b] = append(out[b], tok)
			if emit != nil {
				if err := emit(b, tok); err != nil {
					return out, err
				}
			}
		}
	}
}

// decodeStep queues the model on token a.tok[b] at position pos of every
// sequence, appending its keys and values to the cache, and leaves the
// next-token logits (B,V) in a.logits.
func (m *Model) decodeStep(kv *kvCache, a *decodeActs, pos int) {
	be, c, p := m.be, m.Cfg, m.param
	B, C, F, V := kv.B, c.C, c.F, c.V
	// x = wte[tok] + wpe[pos]: the embedding of a (B,1) batch whose one
	// position is pos.
	be.EncoderForward(a.x, a.tok, p.wte, p.wpe[pos*C:(pos+1)*C], B, 1, C)
	for l := 0; l < c.L; l++ {
		be.LayerNormForward(a.ln, a.mean, a.rstd, a.x, layer(p.ln1w, l, C), layer(p.ln1b, l, C), B, C)
		be.MatmulForward(a.qkv, a.ln, layer(p.qkvw, l, 3*C*C), layer(p.qkvb, l, 3*C), B, C, 3*C)
		kv.append(be, a, l, pos, a.qkv, C, C)
		be.AttentionDecode(a.atty, a.q, kv.k[l], kv.v[l], B, pos, kv.maxT, C, c.NH)
		be.MatmulForward(a.proj, a.atty, layer(p.attprojw, l, C*C), layer(p.attprojb, l, C), B, C, C)
		be.ResidualForward(a.res2, a.x, a.proj)
		be.LayerNormForward(a.ln, a.mean, a.rstd, a.res2, layer(p.ln2w, l, C), layer(p.ln2b, l, C), B, C)
		be.MatmulGeluForward(a.fchG, a.fch, a.ln, layer(p.fcw, l, F*C), layer(p.fcb, l, F), B, C, F)
		be.MatmulForward(a.proj, a.fchG, layer(p.fcprojw, l, C*F), layer(p.fcprojb, l, C), B, F, C)
		be.ResidualForward(a.x, a.res2, a.proj)
	}
	be.LayerNormForward(a.ln, a.mean, a.rstd, a.x, p.lnfw, p.lnfb, B, C)
	be.MatmulForward(a.logits, a.ln, p.wte[:V*C], nil, B, C, V)
}

// append queues the copies, on the device, of each sequence's row of qkv
// (q channels of queries, then kv of keys and kv of values) into a.q and
// into layer l's cache at position pos.
func (kv *kvCache) append(be kernels.Backend, a *decodeActs, l, pos int, qkv []float32, q, w int) {
	row := q + 2*w
	for b := 0; b < kv.B; b++ {
		r, at := qkv[b*row:(b+1)*row], (b*kv.maxT+pos)*w
		be.Copy(a.q[b*q:(b+1)*q], r[:q])
		be.Copy(kv.k[l][at:at+w], r[q:q+w])
		be.Copy(kv.v[l][at:at+w], r[q+w:])
	}
}

// sample draws a token from logits: argmax at temperature 0, else from the
// softmax of logits/temperature restricted by top-k and top-p.
func sample(logits []float32, opt SampleOptions, rng *rand.Rand, probs []float64) int {
	if opt.Temperature <= 0 {
		best := 0
		for i, v := range logits {
			if v > logits[best] {
				best = i
			}
		}
		return best
	}
	idx := make([]int, len(logits))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(i, j int) bool { return logits[idx[i]] > logits[idx[j]] })
	if opt.TopK > 0 && opt.TopK < len(idx) {
		idx = idx[:opt.TopK]
	}
	mx := float64(logits[idx[0]])
	var z float64
	for _, i := range idx {
		probs[i] = math.Exp((float64(logits[i]) - mx) / opt.Temperature)
		z += probs[i]
	}
	if opt.TopP > 0 && opt.TopP < 1 {
		var cum float64
		for k, i := range idx {
			cum += probs[i] / z
			if cum >= opt.TopP {
				idx = idx[:k+1]
				break
			}
		}
		z = 0
		for _, i := range idx {
			z += probs[i]
		}
	}
	u := rng.Float64() * z
	for _, i := range idx {
		u -= probs[i]
		if u <= 0 {
			return i
		}
	}
	return idx[len(idx)-1]
}
