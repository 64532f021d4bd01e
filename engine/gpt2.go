package engine

import (
	"context"
	"errors"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/kernels"
)

// Recompute says which activations the forward pass keeps for backward.
type Recompute int

const (
	// RecomputeNone keeps every activation.
	RecomputeNone Recompute = iota
	// RecomputeOnlyAttn drops the attention probabilities (B,NH,T,T) of
	// every layer and recomputes them from q and k in the backward pass.
	RecomputeOnlyAttn
	// RecomputeFull keeps only each block's input and reruns the whole
	// block's forward before its backward.
	RecomputeFull
)

// Model is a GPT-2 or a Llama (Cfg.Family: this file's passes, or
// llama.go's), or the part of one held by a rank of a tensor- or
// pipeline-parallel job, with its parameters and gradients in two
// contiguous buffers, and the activations of one micro-batch shape.
type Model struct {
	Cfg     ModelConfig // the whole model's shape
	Part    Part        // what this rank holds
	Tensors []Tensor    // parameter views, llm.c order
	Params  []float32   // all parameters held, laid out by Tensors (nil under sharding stage 3: see stage3)
	Grads   []float32   // gradients, same layout

	be    kernels.Backend
	n     int     // parameters held (NumParams)
	param weights // views of Params
	grad  weights // views of Grads
	dims  dims    // local sizes

	seed      uint64    // dropout stream seed
	recompute Recompute // activation policy
	acts      *activations
	scratch   *scratch
	par       parallel         // the parallel layout the passes call at fixed points (parallel.go)
	tp        *tensorParallel  // a tensor-parallel rank's layout, in par; nil for a whole model
	cp        *contextParallel // a context-parallel rank's layout, in par; nil without
	stage3    *stage3          // nil unless sharding stage 3 shards the parameters; then par, wrapping tp's
	loss      []float64        // Forward's and Loss's device scalar

	fam      passes    // the family's layer passes (familyPasses)
	rope     []float32 // a Llama's rotary table (T,hd) for the longest sequence yet (ensureRope); nil for GPT-2
	ropeRows int       // under context parallelism, the rows per sequence rope was built for (ensureRope)

	// maxHeadRows, if > 0, caps the rows of the head's chunks
	// (headChunk): a test's, to cut a small batch into chunks.
	maxHeadRows int
}

// dims are the sizes of the slices of a block a tensor-parallel rank
// holds, the whole block's for one process (sliceDims).
type dims struct {
	Cl, NHl, Fl int // attention channels, heads and MLP units (C/MP, NH/MP, F/MP)
	Vpl         int // rows of the padded vocabulary held, Vp/MP: the columns of the logits
	Vl          int // real vocabulary ids among them, the first Vl (the rest padding, masked in the loss)

	// A Llama's key/value heads: NKVl held (NKV/MP, or 1 when MP exceeds
	// NKV), each alike on kvCopies ranks of the group (MP/NKV, or 1).
	NKVl, kvCopies int
}

// NewModel allocates a model and initialises it from seed with N(0, std).
func NewModel(be kernels.Backend, cfg ModelConfig, std float64, seed uint64) (*Model, error) {
	return NewModelPart(be, cfg, WholePart(cfg), std, seed)
}

// NewModelPart allocates the part of a model one rank holds and initialises
// it as NewModel initialises the whole model: each element gets the value
// it has there (init.go), and nothing outside the part is computed.
func NewModelPart(be kernels.Backend, cfg ModelConfig, part Part, std float64, seed uint64) (*Model, error) {
	m, err := newModel(be, cfg, part)
	if err != nil {
		return nil, err
	}
	if err := fillSpans(be, m.Tensors, m.whole(), m.Params, initSource(cfg, std, seed)); err != nil {
		return nil, err
	}
	m.seed = seed
	return m, nil
}

func newModel(be kernels.Backend, cfg ModelConfig, part Part) (*Model, error) {
	return newShardedModel(be, cfg, part, 1, false)
}

// newShardedModel is newModel with its buffers laid out for a sharding
// group of S members from the start, so that none is copied or replaced
// later: Params and Grads with room for a multiple of S elements, as
// sharding stages 1 and 2 cut them (padBuffers then has nothing to do),
// or, with stage3, no whole buffers at all — a stage 3 rank holds its
// shard and the gather buffers stage3 allocates, never its whole part. The
// buffers are zero.
func newShardedModel(be kernels.Backend, cfg ModelConfig, part Part, S int, stage3 bool) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := part.check(cfg); err != nil {
		return nil, err
	}
	ts, n := PartTensors(cfg, part)
	m := &Model{Cfg: cfg, Part: part, Tensors: ts, be: be, n: n, dims: sliceDims(cfg, part)}
	m.par, m.tp, m.cp = newParallel(be, cfg, part)
	if !stage3 {
		want := (n + S - 1) / S * S
		m.Params, m.Grads = m.floats(want)[:n], m.floats(want)[:n]
		m.param, m.grad = viewWeights(m.Params, ts), viewWeights(m.Grads, ts)
	}
	m.setFamily()
	return m, nil
}

// SetDropoutSeed sets the seed of every dropout stream.
func (m *Model) SetDropoutSeed(s uint64) { m.seed = s }

// SetRecompute chooses what the forward pass keeps; it takes effect at the
// next allocation of activations.
func (m *Model) SetRecompute(r Recompute) {
	if r != m.recompute {
		m.recompute = r
		m.acts.free(m.be)
		m.scratch.free(m.be)
		m.acts, m.scratch = nil, nil
	}
}

// NumParams counts the parameters held, padded vocabulary rows included.
func (m *Model) NumParams() int { return m.n }

// whole is the span of a buffer laid out as the model's flat layout.
func (m *Model) whole() []Span { return []Span{{0, 0, m.n}} }

// numLayers is the number of blocks held.
func (m *Model) numLayers() int { return len(m.Part.Layers) }

// layerActs are the activations of one block that backward reads: the
// rank's Nr rows of the residual stream's (par.rows: all N = B·T, or its
// share under sequence parallelism), all N rows of the regions'.
type layerActs struct {
	ln1, ln1Mean, ln1Rstd []float32 // (Nr,C), (Nr), (Nr)
	qkv                   []float32 // (N,3Cl)
	atty                  []float32 // (N,Cl) attention output, heads side by side
	res2                  []float32 // (Nr,C) residual after attention
	ln2, ln2Mean, ln2Rstd []float32 // (Nr,C), (Nr), (Nr)
	fch                   []float32 // (N,Fl) MLP pre-activation
	fchGelu               []float32 // (N,Fl) MLP activation
}

// activations of one micro-batch: what the forward pass keeps for the
// backward pass. Under pipeline parallelism several micro-batches are in
// flight, each with its own.
type activations struct {
	B, T    int
	resid   [][]float32 // Ll+1 × (Nr,C): resid[0] the stage's input, resid[i+1] output of local block i
	layers  []layerActs // Ll, or the shared scratch one when recomputing whole blocks
	att     [][]float32 // Ll × (B,NHl,T,T) (kernels.AttentionFloats), or the shared scratch one when recomputing attention
	lnf     []float32   // (Nr,C)         head only
	lnfMean []float32   // (Nr)
	lnfRstd []float32   // (Nr)
	dlnf    []float32   // (B,T,C) float32: dL/d lnf, this rank's part (the head's backward runs in the forward pass: classify)
	losses  []float32   // (B,T)
	inputs  []int32     // (B,T) copy of the batch, read by backward
	targets []int32     // (B,T)

	stored int   // bytes of activations kept between forward and backward
	bufs   []any // what was allocated for these activations alone
}

// scratch is what the passes of every micro-batch share: the buffers of
// backward, and what is recomputed rather than kept.
type scratch struct {
	proj   []float32 // (B,T,C) a branch output before dropout
	dresid []float32 // (Nr,C) gradient of the residual stream
	dy     []float32 // (Nr,C) a branch output's gradient, dresid through its dropout's backward (nil without hidden dropout: dresid is it)
	dln    []float32 // (B,T,C) a region's input gradient
	dqkv   []float32 // (B,T,3Cl)
	datty  []float32 // (B,T,Cl)
	dfch   []float32 // (B,T,Fl)
	dfchG  []float32 // (B,T,Fl) a Llama's, SwiGLU's output gradient (GPT-2's GELU backward is fcproj's epilogue)
	dqkvw  []float32 // a Llama's qkvw gradient of one block, when its key/value heads have copies (sumKVCopies)
	dnorm  []float32 // the norms' weight gradients of one block, under sequence parallelism (normGrads)
	layer  layerActs // full recompute: the block being rebuilt
	att    []float32 // (B,NHl,T,T) recompute: the probabilities being rebuilt
	logits []float32 // (headRows,Vpl) the head's: one chunk of rows' logits, then their gradient (classify)

	headRows int // the rows of each chunk of the head's (arch.HeadRows)

	bufs  []any // every buffer above, to give back
	bytes int64 // their memory (kernels.ActivationBytes for the activations)
}

// newLayerActs allocates the activations of one block of N rows, Nr of
// them the rank's rows of the residual stream, their widths w
// (blockWidths): the layers' outputs from h (kernels.Activations: bf16
// under bf16), the norms' statistics from f (float32).
func newLayerActs(h, f func(int) []float32, N, Nr, C int, w widths) layerActs {
	la := layerActs{
		ln1: h(Nr * C), ln1Rstd: f(Nr), qkv: h(N * w.qkv), atty: h(N * w.att),
		res2: h(Nr * C), ln2: h(Nr * C), ln2Rstd: f(Nr), fch: h(N * w.fc), fchGelu: h(N * w.act),
	}
	if w.mean {
		la.ln1Mean, la.ln2Mean = f(Nr), f(Nr)
	}
	return la
}

func (m *Model) newScratch(B, T int) *scratch {
	c, d, w := m.Cfg, m.dims, m.blockWidths()
	N, C := B*T, c.C
	_, Nr := m.par.rows(N)
	var bufs []any
	var bytes int64
	ab := int64(kernels.ActivationBytes(m.be))
	f := func(n int) []float32 {
		x := kernels.Float32s(m.be, n)
		bufs = append(bufs, x)
		bytes += 4 * int64(n)
		return x
	}
	h := func(n int) []float32 {
		x := kernels.Activations(m.be, n)
		bufs = append(bufs, x)
		bytes += ab * int64(n)
		return x
	}
	// The activations' gradients are activations (bf16 under bf16), but
	// for dln, which tensor parallelism sums across ranks: a
	// column-parallel GEMM's input gradient stays float32 until the
	// kernel after the sum stores it, as a row-parallel GEMM's output
	// (proj) does.
	sc := &scratch{
		proj: f(N * C), dresid: h(Nr * C), dln: f(N * C), dqkv: h(N * w.qkv), datty: h(N * w.att),
		dfch: h(N * w.fc),
	}
	if c.llama() {
		sc.dfchG = h(N * w.act)
	}
	if c.HiddenDropout > 0 {
		sc.dy = h(Nr * C)
	}
	if d.kvCopies > 1 {
		sc.dqkvw = f(w.qkv * C)
	}
	if m.Part.SP {
		sc.dnorm = f(4 * C) // two LayerNorms' weights and biases
	}
	if m.recompute == RecomputeFull {
		sc.layer = newLayerActs(h, f, N, Nr, C, w)
	}
	if m.recompute != RecomputeNone {
		sc.att = f(m.par.attentionFloats(B, T, d.NHl))
	}
	if m.Part.Head {
		sc.headRows = arch.HeadRows(N, m.blockBytes(B, T), ab*int64(d.Vpl))
		sc.logits = h(sc.headRows * d.Vpl)
	}
	sc.bufs, sc.bytes = bufs, bytes
	return sc
}

// blockBytes is what one block keeps of a (B,T) micro-batch between its
// forward and backward pass under the recompute policy, as
// newActivations allocates it: its input, and, unless the block is
// recomputed whole, its layers' outputs and statistics (newLayerActs),
// and, unless attention is recomputed, the attention's store.
func (m *Model) blockBytes(B, T int) int64 {
	N, C := B*T, m.Cfg.C
	_, Nr := m.par.rows(N)
	ab := int64(kernels.ActivationBytes(m.be))
	n := ab * int64(Nr*C)
	count := func(size int64) func(int) []float32 {
		return func(k int) []float32 { n += size * int64(k); return nil }
	}
	if m.recompute != RecomputeFull {
		newLayerActs(count(ab), count(4), N, Nr, C, m.blockWidths())
	}
	if m.recompute == RecomputeNone {
		n += 4 * int64(m.par.attentionFloats(B, T, m.dims.NHl))
	}
	return n
}

// newActivations allocates the activations of one (B,T) micro-batch for
// local blocks lo … hi−1 (a pipeline chunk; 0 … Ll for the whole part):
// resid[lo … hi], layers[lo:hi] and att[lo:hi], the others nil, and the
// head's buffers when the range ends the model.
func (m *Model) newActivations(B, T, lo, hi int) *activations {
	m.ensureRope(T)
	if m.scratch == nil || len(m.scratch.proj) != B*T*m.Cfg.C {
		m.scratch.free(m.be)
		m.scratch = m.newScratch(B, T)
	}
	c, d, sc := m.Cfg, m.dims, m.scratch
	C, Ll, w := c.C, m.numLayers(), m.blockWidths()
	N := B * T
	_, Nr := m.par.rows(N)
	a := &activations{B: B, T: T}
	keep := func(alloc func(kernels.Backend, int) []float32, size int) func(int) []float32 {
		return func(n int) []float32 {
			a.stored += size * n
			x := alloc(m.be, n)
			a.bufs = append(a.bufs, x)
			return x
		}
	}
	h, f := keep(kernels.Activations, kernels.ActivationBytes(m.be)), keep(kernels.Float32s, 4)
	a.resid = make([][]float32, Ll+1)
	for l := lo; l <= hi; l++ {
		a.resid[l] = h(Nr * C)
	}
	a.layers = make([]layerActs, Ll)
	a.att = make([][]float32, Ll)
	for l := lo; l < hi; l++ {
		if m.recompute == RecomputeFull {
			a.layers[l] = sc.layer
		} else {
			a.layers[l] = newLayerActs(h, f, N, Nr, C, w)
		}
		if m.recompute != RecomputeNone {
			a.att[l] = sc.att
		} else {
			a.att[l] = f(m.par.attentionFloats(B, T, d.NHl))
		}
	}
	if m.Part.Head && hi == Ll {
		a.lnf, a.lnfRstd = h(Nr*C), f(Nr)
		if w.mean {
			a.lnfMean = f(Nr)
		}
		a.dlnf, a.losses = f(N*C), f(N)
	}
	a.inputs, a.targets = kernels.Int32s(m.be, N), kernels.Int32s(m.be, N)
	a.bufs = append(a.bufs, a.inputs, a.targets)
	return a
}

// free gives the buffers of a back to the backend (no-op for nil).
func (a *activations) free(be kernels.Backend) {
	if a == nil {
		return
	}
	for _, b := range a.bufs {
		kernels.Free(be, b)
	}
}

// free gives the buffers of sc back to the backend (no-op for nil).
func (sc *scratch) free(be kernels.Backend) {
	if sc == nil {
		return
	}
	for _, b := range sc.bufs {
		kernels.Free(be, b)
	}
}

// ActivationBytes is the memory activations of a (B,T) micro-batch keep
// between forward and backward under the model's recompute policy.
func (m *Model) ActivationBytes(B, T int) int {
	m.ensureActs(B, T)
	return m.acts.stored
}

func (m *Model) ensureActs(B, T int) {
	if m.acts == nil || m.acts.B != B || m.acts.T != T {
		m.acts.free(m.be)
		m.acts = m.newActivations(B, T, 0, m.numLayers())
	}
}

// DropoutKey identifies one forward pass for the dropout streams: the optimizer
// step and the global index of the micro-batch's first sample in that step.
// The masks depend on these only, not on how the batch is split.
type DropoutKey struct {
	Step   int
	Sample int
}

// Dropout sites, mixed into the stream keys.
const (
	siteEmbed = iota
	siteAttnProbs
	siteAttnOut
	siteMLPOut
)

func (m *Model) dropout(p float32, ps DropoutKey, l, site int) kernels.Dropout {
	return kernels.Dropout{P: p, Key: kernels.SiteKey(m.seed, uint64(ps.Step), uint64(l), uint64(site))}
}

// streamOff is the index in a residual-stream dropout stream of this
// rank's first element of a (B,T) micro-batch: the micro-batch's first
// sample's, plus the rows before the rank's (par.rows).
func (m *Model) streamOff(ps *pass, B, T int) uint64 {
	first, _ := m.par.rows(B * T)
	return uint64(ps.Sample)*uint64(T*m.Cfg.C) + uint64(first*m.Cfg.C)
}

// Forward runs a training pass of the model on inputs (B,T): dropout on,
// and the gradient of dscale·Σ losses taken through the head at once —
// accumulated into the head's weights' gradient in Grads, and with
// respect to the head's input kept for Backward (dscale =
// 1/(B·T·accumulation) makes the accumulated gradient that of the mean
// loss): the head keeps no logits (classify). It returns the mean cross-entropy
// against targets (B,T). The model must hold the embeddings and the head
// (no pipeline parallelism); under tensor parallelism every rank of the
// group calls it, and a failure of the group's communication under ctx is
// the error.
func (m *Model) Forward(ctx context.Context, inputs, targets []int32, B, T int, ps DropoutKey, dscale float32) (float32, error) {
	return m.meanLoss(&pass{ctx: ctx, DropoutKey: ps, train: true, dscale: dscale}, inputs, targets, B, T)
}

// Backward accumulates into Grads the gradient of the loss of the last
// Forward, whose pass ps must be given again. onGrads, if not nil, is
// called as soon as the parameter gradients of local block li are
// complete, from the last block down (data parallel starts their
// all-reduce there while the blocks below still compute).
func (m *Model) Backward(ctx context.Context, ps DropoutKey, onGrads func(li int)) error {
	p := &pass{ctx: ctx, DropoutKey: ps, train: true, onGrads: onGrads}
	m.backward(p)
	return p.err
}

// Loss runs the model on inputs (B,T) without dropout and returns the mean
// cross-entropy against targets (B,T): an evaluation, leaving no gradient.
func (m *Model) Loss(ctx context.Context, inputs, targets []int32, B, T int) (float32, error) {
	return m.meanLoss(&pass{ctx: ctx}, inputs, targets, B, T)
}

// Logits runs the model on inputs (B,T) without dropout and returns its
// next-token logits (B,T,V), read back from the device: the real
// vocabulary's columns, never the padding's. The model must be whole: one
// process's, not a tensor-parallel rank's or a pipeline stage's.
func (m *Model) Logits(ctx context.Context, inputs []int32, B, T int) ([]float32, error) {
	if m.Part.MP != 1 || m.Part.CP > 1 || !m.Part.Embed || !m.Part.Head || len(m.Part.Layers) != m.Cfg.L {
		return nil, errors.New("logits: the model is a part of a parallel one; they need all of it")
	}
	if _, err := m.Loss(ctx, inputs, make([]int32, B*T), B, T); err != nil {
		return nil, err
	}
	// The head computes the logits a chunk of rows at a time and keeps
	// none (classify): they are computed again from the final norm's
	// output, whole, into a buffer of their own, (B·T,Vp) with row stride
	// Vp, downloaded and compacted to their first V columns on the host.
	N, C, V, Vp := B*T, m.Cfg.C, m.Cfg.V, m.dims.Vpl
	w, _ := m.headWeights()
	logits := kernels.Activations(m.be, N*Vp)
	defer kernels.Free(m.be, logits)
	m.be.MatmulForward(logits, m.acts.lnf, w[:Vp*C], nil, N, C, Vp)
	out := make([]float32, N*Vp)
	if err := kernels.Download(m.be, out, logits); err != nil {
		return nil, err
	}
	for r := 1; r < N; r++ {
		copy(out[r*V:(r+1)*V], out[r*Vp:r*Vp+V])
	}
	return out[:N*V], nil
}

// meanLoss runs forward pass p and reads its mean loss back from the
// device: one Download.
func (m *Model) meanLoss(p *pass, inputs, targets []int32, B, T int) (float32, error) {
	if m.loss == nil {
		m.loss = kernels.Float64s(m.be, 1)
	}
	kernels.Upload(m.be, m.loss, []float64{0})
	p.loss = m.loss
	m.forward(p, inputs, targets, B, T)
	loss := []float64{0}
	err := kernels.Download(m.be, loss, m.loss)
	if p.err != nil {
		err = p.err
	}
	return float32(loss[0]), err
}

// forward runs pass p of the whole model on a (B,T) batch, adding its mean
// loss to p.loss.
func (m *Model) forward(p *pass, inputs, targets []int32, B, T int) {
	m.ensureActs(B, T)
	a := m.acts
	m.stage(a, inputs, targets)
	m.fam.embedForward(a, p)
	m.blocksForward(a, 0, m.numLayers(), p)
	m.fam.headForward(a, p)
}

// stage copies a micro-batch's inputs and targets (B,T) from host memory
// into a's buffers, ordered after the kernels queued before: those of the
// last pass through a may still read them.
func (m *Model) stage(a *activations, inputs, targets []int32) {
	kernels.Upload(m.be, a.inputs, inputs)
	kernels.Upload(m.be, a.targets, targets)
}

// backward runs the backward pass p of the whole model after forward.
func (m *Model) backward(p *pass) {
	a := m.acts
	m.fam.headBackward(a, p)
	m.blocksBackward(a, 0, m.numLayers(), p)
	m.fam.embedBackward(a, p)
}

// embedForward writes the embeddings of a.inputs to a.resid[0].
//
//	resid[0] = drop(wte[inputs] + wpe[t])
//
// The lookup is the layout's (par.embedForward): vocabulary-parallel
// under tensor parallelism, each rank looking up the tokens of its rows
// and the group summing.
func (m *Model) embedForward(a *activations, ps *pass) {
	be, c, p := m.be, m.Cfg, m.param
	B, T, C := a.B, a.T, c.C
	hd := float32(0)
	if ps.train {
		hd = c.HiddenDropout
	}
	m.par.embedForward(ps, a.resid[0], a.inputs, p.wte, p.wpe, B, T, C)
	be.DropoutForward(a.resid[0], a.resid[0], m.dropout(hd, ps.DropoutKey, 0, siteEmbed), m.streamOff(ps, B, T))
}

// embedBackward accumulates the embedding gradients from sc.dresid.
func (m *Model) embedBackward(a *activations, ps *pass) {
	be, c, g, sc := m.be, m.Cfg, m.grad, m.scratch
	B, T, C := a.B, a.T, c.C
	be.DropoutBackward(sc.dresid, sc.dresid, m.dropout(c.HiddenDropout, ps.DropoutKey, 0, siteEmbed), m.streamOff(ps, B, T))
	m.par.embedBackward(ps, g.wte, g.wpe, sc.dresid, a.inputs, B, T, C)
}

// blocksForward runs local blocks lo … hi−1: resid[lo] → resid[hi].
func (m *Model) blocksForward(a *activations, lo, hi int, ps *pass) {
	hd, ad := float32(0), float32(0)
	if ps.train {
		hd, ad = m.Cfg.HiddenDropout, m.Cfg.AttnDropout
	}
	for li := lo; li < hi; li++ {
		m.par.blockBegin(ps, li)
		m.fam.blockForward(a, li, ps, hd, ad)
	}
}

// blocksBackward takes sc.dresid = dL/d resid[hi] back to dL/d resid[lo],
// accumulating the blocks' parameter gradients, and tells ps.onGrads of
// each block done.
func (m *Model) blocksBackward(a *activations, lo, hi int, ps *pass) {
	hd, ad := m.Cfg.HiddenDropout, m.Cfg.AttnDropout
	for li := hi - 1; li >= lo; li-- {
		m.par.blockBegin(ps, li)
		if m.recompute == RecomputeFull {
			m.fam.blockForward(a, li, ps, hd, ad)
		}
		m.fam.blockBackward(a, li, ps, hd, ad)
		m.par.blockEnd(ps, li)
		if ps.onGrads != nil {
			ps.onGrads(li)
		}
	}
}

// headForward runs the final LayerNorm, the tied head and the loss on
// resid[Ll], and adds the mean of the losses of the B·T positions to
// ps.loss, on the device; training, it runs the head's backward pass too
// (classify).
//
//	logits (N,Vpl) = lnf(x) · wte[:Vpl]ᵀ     (this rank's padded vocabulary columns)
//
// Vocabulary-parallel, the softmax's row maxima and sums cross the group,
// never the logits (par.crossEntropy); the padding is masked in the loss.
func (m *Model) headForward(a *activations, ps *pass) {
	be, c, p, g := m.be, m.Cfg, m.param, m.grad
	_, Nr := m.par.rows(a.B * a.T)
	be.LayerNormForward(a.lnf, a.lnfMean, a.lnfRstd, a.resid[m.numLayers()], p.lnfw, p.lnfb, Nr, c.C)
	m.classify(a, ps, p.wte, g.wte)
}

// classify is the head's classifier on a.lnf: the logits (N,Vpl) of this
// rank's padded vocabulary columns against w's rows (the tied wte, or a
// Llama's lm_head), as llm.c computes them over Vp (a row stride of a
// multiple of 128 rather than an odd V), and the cross-entropy of each
// position over the first Vl, the real ones, whose mean it adds to ps.loss
// on the device. A rank holding only padding computes its logits too, all
// masked.
//
// The logits are never kept whole: classify computes them headChunk()
// rows at a time into sc.logits (arch.HeadRows), and, training, turns
// each chunk into its gradient in place (the loss's gradient needs only
// the logits and the targets, 0 in the padding) and takes it through the
// GEMM at once — w's gradient accumulated into gw, this rank's part of
// dL/d lnf into a.dlnf — so the head's backward pass (classifyBackward)
// has only the tensor-parallel sum left. The chunks cut the sum over the
// rows of gw's product into partial sums, one per chunk, added in order:
// the same on every rank of a layout, and one chunk where the logits
// take no more memory than a block.
//
//	for each chunk r of rows:
//	  logits (r,Vpl) = x[r] · w[:Vpl]ᵀ
//	  losses[r], dlogits (r,Vpl) in place = cross-entropy(logits, targets[r]) · dscale
//	  dx[r] (r,C) = dlogits · w[:Vpl];   gw[:Vpl] += dlogitsᵀ · x[r]
func (m *Model) classify(a *activations, ps *pass, w, gw []float32) {
	be, c, d, sc := m.be, m.Cfg, m.dims, m.scratch
	N, C := a.B*a.T, c.C
	x, w, rows := m.par.enterTP(ps, a.lnf), w[:d.Vpl*C], m.headChunk()
	for r := 0; r < N; r += rows {
		n := min(rows, N-r)
		xr, logits := x[r*C:(r+n)*C], sc.logits[:n*d.Vpl]
		be.MatmulForward(logits, xr, w, nil, n, C, d.Vpl)
		// The padding columns never score (masked in the loss).
		m.par.crossEntropy(ps, a.losses[r:r+n], logits, a.targets[r:r+n], n, d.Vl, d.Vpl)
		if ps.train {
			be.MatmulBackward(a.dlnf[r*C:(r+n)*C], gw[:d.Vpl*C], nil, logits, xr, w, n, C, d.Vpl)
		}
	}
	if ps.loss != nil {
		be.Sum(ps.loss, a.losses, m.lossWeight(N))
	}
}

// headChunk is the rows of each chunk of the head's (classify):
// sc.headRows, or fewer in a test (maxHeadRows).
func (m *Model) headChunk() int {
	if m.maxHeadRows > 0 {
		return min(m.scratch.headRows, m.maxHeadRows)
	}
	return m.scratch.headRows
}

// headBackward starts the backward pass: from the head's input gradient
// (classify) to sc.dresid = dL/d resid[Ll].
func (m *Model) headBackward(a *activations, ps *pass) {
	be, c, p, g, sc := m.be, m.Cfg, m.param, m.grad, m.scratch
	_, Nr := m.par.rows(a.B * a.T)
	dx := m.classifyBackward(a, ps)
	be.Zero(sc.dresid)
	ng := m.normGrads(g.lnfw, g.lnfb)
	be.LayerNormBackward(sc.dresid, ng[0], ng[1], dx, a.resid[m.numLayers()], p.lnfw, a.lnfMean, a.lnfRstd, Nr, c.C)
	m.addNormGrads(ps, ng, [][]float32{g.lnfw, g.lnfb})
}

// classifyBackward is what is left of the classifier's backward pass
// after classify: dL/d lnf, this rank's rows of it, summed over the
// tensor-parallel group. The padding columns' gradient was 0, so the
// padded rows of the weights' gradient gained nothing and dL/d lnf
// nothing from them.
func (m *Model) classifyBackward(a *activations, ps *pass) []float32 {
	return m.par.enterTPBackward(ps, a.dlnf)
}

// attnDropout is the dropout of the attention probabilities of block l,
// placing this rank's heads among all of them (par.heads).
func (m *Model) attnDropout(p float32, ps DropoutKey, l int) kernels.Dropout {
	d := m.dropout(p, ps, l, siteAttnProbs)
	d.Head0, d.Heads = m.par.heads()
	return d
}

// blockForward runs local block li (global block l): resid[li] → resid[li+1].
//
//	res2 = x + drop(attproj(attention(ln1(x))))
//	out  = res2 + drop(fcproj(gelu(fc(ln2(res2)))))
//
// Tensor-parallel: qkv and fc are column-parallel (this rank's heads and
// hidden units), attproj and fcproj row-parallel; each pair is a region
// the layout enters (par.enterTP: the input's N rows) and leaves
// (par.exitTP: the partial sums summed, the rank's Nr rows of them,
// before the dropout and the residual add). The norms, dropouts and
// residual adds run on the rank's rows of the stream (par.rows).
func (m *Model) blockForward(a *activations, li int, ps *pass, hd, ad float32) {
	be, c, d, sc := m.be, m.Cfg, m.dims, m.scratch
	B, T, C, Cl, Fl := a.B, a.T, c.C, d.Cl, d.Fl
	N, l := B*T, m.Part.Layers[li]
	_, Nr := m.par.rows(N)
	la, att := &a.layers[li], a.att[li]
	off := m.streamOff(ps, B, T)
	bp, _ := m.blockViews(li)

	be.LayerNormForward(la.ln1, la.ln1Mean, la.ln1Rstd, a.resid[li], bp.ln1w, bp.ln1b, Nr, C)
	x := m.par.enterTP(ps, la.ln1)
	be.MatmulForward(la.qkv, x, bp.qkvw, bp.qkvb, N, C, 3*Cl)
	m.par.attention(ps, la.atty, att, la.qkv, B, T, m.attnShape(), m.attnDropout(ad, ps.DropoutKey, l), uint64(ps.Sample)*uint64(c.NH*T*T))
	be.MatmulForward(sc.proj, la.atty, bp.attprojw, m.par.rowBias(bp.attprojb), N, Cl, C)
	y := m.par.exitTP(ps, sc.proj)
	be.DropoutForward(y, y, m.dropout(hd, ps.DropoutKey, l, siteAttnOut), off)
	// res2 (Nr,C) = resid[li] + y and ln2 (Nr,C) = layernorm(res2) in one
	// kernel (llm.c's fused_residual_forward), after y's dropout.
	be.ResidualLayerNormForward(la.res2, la.ln2, la.ln2Mean, la.ln2Rstd, a.resid[li], y, bp.ln2w, bp.ln2b, Nr, C)
	x = m.par.enterTP(ps, la.ln2)
	be.MatmulGeluForward(la.fchGelu, la.fch, x, bp.fcw, bp.fcb, N, C, Fl) // fch = fc(x), fchGelu = gelu(fch)
	be.MatmulForward(sc.proj, la.fchGelu, bp.fcprojw, m.par.rowBias(bp.fcprojb), N, Fl, C)
	y = m.par.exitTP(ps, sc.proj)
	be.DropoutForward(y, y, m.dropout(hd, ps.DropoutKey, l, siteMLPOut), off)
	be.ResidualForward(a.resid[li+1], la.res2, y)
}

// blockBackward takes sc.dresid = dL/d resid[li+1] to dL/d resid[li], in
// place, accumulating local block li's parameter gradients.
// Tensor-parallel: the regions' hooks mirrored (par.exitTPBackward: the
// output gradient's N rows; par.enterTPBackward: the input gradients of
// the column-parallel qkv and fc are partial sums, summed before their
// LayerNorm's backward), each region's input entered again for its
// GEMM's backward; the LayerNorms' weight gradients of the rank's rows
// summed over the rows' ranks (normGrads).
func (m *Model) blockBackward(a *activations, li int, ps *pass, hd, ad float32) {
	be, c, d, sc := m.be, m.Cfg, m.dims, m.scratch
	B, T, C, Cl, Fl := a.B, a.T, c.C, d.Cl, d.Fl
	N, l := B*T, m.Part.Layers[li]
	_, Nr := m.par.rows(N)
	la, att := &a.layers[li], a.att[li]
	off := m.streamOff(ps, B, T)
	bp, bg := m.blockViews(li)
	attOff := uint64(ps.Sample) * uint64(c.NH*T*T)
	dropAttn := m.attnDropout(ad, ps.DropoutKey, l)
	ng := m.normGrads(bg.ln1w, bg.ln1b, bg.ln2w, bg.ln2b)
	dy := m.branchGrad(hd) // each branch's output gradient, dresid through its dropout

	// out = res2 + drop(fcproj(...)): dres2 = dout (the same buffer, dresid).
	m.dropoutBackward(dy, hd, ps.DropoutKey, l, siteMLPOut, off)
	dyAll := m.par.exitTPBackward(ps, dy)
	be.MatmulBackwardGelu(sc.dfch, bg.fcprojw, bg.fcprojb, dyAll, la.fchGelu, la.fch, bp.fcprojw, N, Fl, C) // through the GELU
	be.MatmulBackward(sc.dln, bg.fcw, bg.fcb, sc.dfch, m.par.enterTP(ps, la.ln2), bp.fcw, N, C, Fl)
	dx := m.par.enterTPBackward(ps, sc.dln)
	be.LayerNormBackward(sc.dresid, ng[2], ng[3], dx, la.res2, bp.ln2w, la.ln2Mean, la.ln2Rstd, Nr, C)

	// res2 = x + drop(attproj(...)): dx = dres2 (still dresid).
	m.dropoutBackward(dy, hd, ps.DropoutKey, l, siteAttnOut, off)
	dyAll = m.par.exitTPBackward(ps, dy)
	be.MatmulBackward(sc.datty, bg.attprojw, bg.attprojb, dyAll, la.atty, bp.attprojw, N, Cl, C)
	if m.recompute == RecomputeOnlyAttn {
		m.par.attention(ps, la.atty, att, la.qkv, B, T, m.attnShape(), dropAttn, attOff)
	}
	m.par.attentionBackward(ps, sc.dqkv, sc.datty, la.atty, la.qkv, att, B, T, m.attnShape(), dropAttn, attOff)
	be.MatmulBackward(sc.dln, bg.qkvw, bg.qkvb, sc.dqkv, m.par.enterTP(ps, la.ln1), bp.qkvw, N, C, 3*Cl)
	dx = m.par.enterTPBackward(ps, sc.dln)
	be.LayerNormBackward(sc.dresid, ng[0], ng[1], dx, a.resid[li], bp.ln1w, la.ln1Mean, la.ln1Rstd, Nr, C)
	m.addNormGrads(ps, ng, [][]float32{bg.ln1w, bg.ln1b, bg.ln2w, bg.ln2b})
}

// branchGrad is the buffer a block's branches' output gradient is in
// backward, at hidden dropout hd: sc.dy, which dropoutBackward fills from
// the residual stream's gradient; without dropout that gradient itself,
// read where it is.
func (m *Model) branchGrad(hd float32) []float32 {
	if hd > 0 {
		return m.scratch.dy
	}
	return m.scratch.dresid
}

// dropoutBackward fills dy (branchGrad) with the gradient through the
// dropout of a branch's output at site of layer l: nothing to do without
// dropout.
func (m *Model) dropoutBackward(dy []float32, hd float32, key DropoutKey, l, site int, off uint64) {
	if hd > 0 {
		m.be.DropoutBackward(dy, m.scratch.dresid, m.dropout(hd, key, l, site), off)
	}
}

// blockViews returns the views of local block li's parameters and
// gradients: the layered tensors' slices of that block, the other fields
// nil. They lie where the layout keeps the block in use
// (par.blockWeights: stage 3's gather buffers), else in Params and Grads.
func (m *Model) blockViews(li int) (p, g weights) {
	if p, g, ok := m.par.blockWeights(li); ok {
		return p, g
	}
	return m.param.block(li, m.numLayers()), m.grad.block(li, m.numLayers())
}

// block returns block li of L's views of w's layered tensors.
func (w weights) block(li, L int) weights {
	l := func(x []float32) []float32 { return layer(x, li, len(x)/L) }
	return weights{ln1w: l(w.ln1w), ln1b: l(w.ln1b), qkvw: l(w.qkvw), qkvb: l(w.qkvb), attprojw: l(w.attprojw), attprojb: l(w.attprojb),
		ln2w: l(w.ln2w), ln2b: l(w.ln2b), fcw: l(w.fcw), fcb: l(w.fcb), fcprojw: l(w.fcprojw), fcprojb: l(w.fcprojb)}
}

// padBuffers gives Params and Grads room for a multiple of k elements (zero
// beyond NumParams), so a flat buffer splits into k equal shards: new
// buffers of the backend's memory, their first NumParams elements copied
// on the device.
func (m *Model) padBuffers(k int) {
	n := len(m.Params)
	want := (n + k - 1) / k * k
	if cap(m.Params) >= want && cap(m.Grads) >= want {
		return
	}
	p, g := m.floats(want)[:n], m.floats(want)[:n]
	m.be.Copy(p, m.Params)
	m.be.Copy(g, m.Grads)
	kernels.Free(m.be, m.Params)
	kernels.Free(m.be, m.Grads)
	m.Params, m.Grads = p, g
	m.param, m.grad = viewWeights(p, m.Tensors), viewWeights(g, m.Tensors)
}

// layerRanges returns the ranges of block li of a part whose tensors are
// ts, holding l blocks.
func layerRanges(ts []Tensor, l, li int) [][2]int {
	var rs [][2]int
	for _, t := range ts {
		if outerTensor(t.Name) {
			continue
		}
		n := t.Size / l
		rs = append(rs, [2]int{t.Offset + li*n, t.Offset + (li+1)*n})
	}
	return rs
}

// globalRanges returns the ranges of the outer tensors among ts.
func globalRanges(ts []Tensor) [][2]int {
	var rs [][2]int
	for _, t := range ts {
		if outerTensor(t.Name) {
			rs = append(rs, [2]int{t.Offset, t.Offset + t.Size})
		}
	}
	return rs
}

// outerTensor reports whether the tensor called name lies outside the
// blocks: wte, wpe, lnfw, lnfb, and a Llama's lmhead.
func outerTensor(name string) bool {
	switch name {
	case "wte", "wpe", "lnfw", "lnfb", "lmhead":
		return true
	}
	return false
}

// ZeroGrad clears the gradient buffer.
func (m *Model) ZeroGrad() { m.be.Zero(m.Grads) }

// tensor returns the tensor called name, if the model holds it.
func (m *Model) tensor(name string) (Tensor, bool) {
	for _, t := range m.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return Tensor{}, false
}

// floats returns n zeroed float32s in the backend's memory.
func (m *Model) floats(n int) []float32 { return kernels.Float32s(m.be, n) }
