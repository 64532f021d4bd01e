package engine

import (
	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
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

// Model is a GPT-2 with its parameters and gradients in two contiguous
// buffers, and the activations of one micro-batch shape.
type Model struct {
	Cfg     ModelConfig
	Tensors []Tensor  // parameter views, llm.c order
	Params  []float32 // all parameters, laid out by Tensors
	Grads   []float32 // gradients, same layout

	be kernels.Backend
	p  weights // views of Params
	g  weights // views of Grads

	seed      uint64    // dropout stream seed
	recompute Recompute // activation policy
	acts      *activations

	// gradHook, when set, is called by Backward as soon as block l's
	// parameter gradients are complete for this pass (data parallel starts
	// their all-reduce while the blocks below are still computing).
	gradHook func(l int)
}

// NewModel allocates a model and initialises it from seed with N(0, std).
func NewModel(be kernels.Backend, cfg ModelConfig, std float64, seed uint64) (*Model, error) {
	m, err := newModel(be, cfg)
	if err != nil {
		return nil, err
	}
	initParams(m.Params, m.Tensors, cfg, std, seed)
	m.seed = seed
	return m, nil
}

func newModel(be kernels.Backend, cfg ModelConfig) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ts, n := Layout(cfg)
	m := &Model{Cfg: cfg, Tensors: ts, Params: make([]float32, n), Grads: make([]float32, n), be: be}
	m.p = viewWeights(m.Params, ts)
	m.g = viewWeights(m.Grads, ts)
	return m, nil
}

// SetDropoutSeed sets the seed of every dropout stream.
func (m *Model) SetDropoutSeed(s uint64) { m.seed = s }

// SetRecompute chooses what the forward pass keeps; it takes effect at the
// next allocation of activations.
func (m *Model) SetRecompute(r Recompute) {
	if r != m.recompute {
		m.recompute = r
		m.acts = nil
	}
}

// NumParams counts the parameters, padded vocabulary rows included.
func (m *Model) NumParams() int { return len(m.Params) }

// layerActs are the activations of one block that backward reads.
type layerActs struct {
	ln1, ln1Mean, ln1Rstd []float32 // (B,T,C), (B,T), (B,T)
	qkv                   []float32 // (B,T,3C)
	atty                  []float32 // (B,T,C) attention output, heads side by side
	res2                  []float32 // (B,T,C) residual after attention
	ln2, ln2Mean, ln2Rstd []float32 // (B,T,C), (B,T), (B,T)
	fch                   []float32 // (B,T,F) MLP pre-activation
	fchGelu               []float32 // (B,T,F) MLP activation
}

// activations of one micro-batch, plus the gradient scratch of backward.
type activations struct {
	B, T    int
	resid   [][]float32 // L+1 × (B,T,C): resid[0] embeddings, resid[l+1] output of block l
	layers  []layerActs // L, or 1 shared when recomputing whole blocks
	att     [][]float32 // L × (B,NH,T,T), or 1 shared when recomputing attention
	lnf     []float32   // (B,T,C)
	lnfMean []float32   // (B,T)
	lnfRstd []float32   // (B,T)
	logits  []float32   // (B,T,V): real vocabulary only; gradient in place
	losses  []float32   // (B,T)
	inputs  []int32     // (B,T) copy of the batch, read by backward
	targets []int32     // (B,T)

	proj   []float32 // (B,T,C) scratch: a branch output before dropout
	dresid []float32 // (B,T,C) gradient of the residual stream
	dln    []float32 // (B,T,C)
	dqkv   []float32 // (B,T,3C)
	datty  []float32 // (B,T,C)
	dfch   []float32 // (B,T,F)
	dfchG  []float32 // (B,T,F)

	stored int // bytes of activations kept between forward and backward
}

func newActivations(cfg ModelConfig, B, T int, rc Recompute) *activations {
	C, F, L, NH, V := cfg.C, cfg.F, cfg.L, cfg.NH, cfg.V
	N := B * T
	a := &activations{B: B, T: T}
	f := func(n int) []float32 { a.stored += 4 * n; return make([]float32, n) }
	scratch := func(n int) []float32 { return make([]float32, n) }
	a.resid = make([][]float32, L+1)
	for l := range a.resid {
		a.resid[l] = f(N * C)
	}
	nl, keep := L, f
	if rc == RecomputeFull {
		nl, keep = 1, scratch
	}
	a.layers = make([]layerActs, nl)
	for l := range a.layers {
		a.layers[l] = layerActs{
			ln1: keep(N * C), ln1Mean: keep(N), ln1Rstd: keep(N), qkv: keep(N * 3 * C), atty: keep(N * C),
			res2: keep(N * C), ln2: keep(N * C), ln2Mean: keep(N), ln2Rstd: keep(N), fch: keep(N * F), fchGelu: keep(N * F),
		}
	}
	na, keepAtt := L, f
	if rc != RecomputeNone {
		na, keepAtt = 1, scratch
	}
	a.att = make([][]float32, na)
	for l := range a.att {
		a.att[l] = keepAtt(B * NH * T * T)
	}
	a.lnf, a.lnfMean, a.lnfRstd = f(N*C), f(N), f(N)
	a.logits, a.losses = f(N*V), f(N)
	a.inputs, a.targets = make([]int32, N), make([]int32, N)
	a.proj = scratch(N * C)
	a.dresid, a.dln, a.dqkv, a.datty = scratch(N*C), scratch(N*C), scratch(N*3*C), scratch(N*C)
	a.dfch, a.dfchG = scratch(N*F), scratch(N*F)
	return a
}

// ActivationBytes is the memory activations of a (B,T) micro-batch keep
// between forward and backward under the model's recompute policy.
func (m *Model) ActivationBytes(B, T int) int {
	m.ensureActs(B, T)
	return m.acts.stored
}

func (m *Model) ensureActs(B, T int) {
	if m.acts == nil || m.acts.B != B || m.acts.T != T {
		m.acts = newActivations(m.Cfg, B, T, m.recompute)
	}
}

// Pass identifies one forward pass for the dropout streams: the optimizer
// step and the global index of the micro-batch's first sample in that step.
// The masks depend on these only, not on how the batch is split.
type Pass struct {
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

func (m *Model) dropout(p float32, ps Pass, l, site int) cpu.Dropout {
	return cpu.Dropout{P: p, Key: cpu.SiteKey(m.seed, uint64(ps.Step), uint64(l), uint64(site))}
}

// Forward runs the model on inputs (B,T) and returns the mean cross-entropy
// against targets (B,T). With train set, dropout is on and the gradient of
// dscale·Σ losses with respect to the logits is left in place for Backward
// (dscale = 1/(B·T·accumulation) makes the accumulated gradient that of the
// mean loss).
func (m *Model) Forward(inputs, targets []int32, B, T int, ps Pass, train bool, dscale float32) float32 {
	be, c, p := m.be, m.Cfg, m.p
	m.ensureActs(B, T)
	a := m.acts
	N, C, V := B*T, c.C, c.V
	copy(a.inputs, inputs)
	copy(a.targets, targets)
	hd, ad := float32(0), float32(0)
	if train {
		hd, ad = c.HiddenDropout, c.AttnDropout
	}
	off := uint64(ps.Sample) * uint64(T*C)

	be.EncoderForward(a.resid[0], a.inputs, p.wte, p.wpe, B, T, C)
	be.DropoutForward(a.resid[0], a.resid[0], m.dropout(hd, ps, 0, siteEmbed), off)
	for l := 0; l < c.L; l++ {
		m.blockForward(l, ps, hd, ad)
	}
	be.LayerNormForward(a.lnf, a.lnfMean, a.lnfRstd, a.resid[c.L], p.lnfw, p.lnfb, N, C)
	// logits (N,V) = lnf · wte[:V]ᵀ: padded rows of wte never score.
	be.MatmulForward(a.logits, a.lnf, p.wte[:V*C], nil, N, C, V)
	be.CrossEntropy(a.losses, a.logits, a.targets, N, V, dscale, train)
	var sum float64
	for _, l := range a.losses {
		sum += float64(l)
	}
	return float32(sum / float64(N))
}

// blockForward runs transformer block l: resid[l] → resid[l+1].
//
//	res2 = x + drop(attproj(attention(ln1(x))))
//	out  = res2 + drop(fcproj(gelu(fc(ln2(res2)))))
func (m *Model) blockForward(l int, ps Pass, hd, ad float32) {
	be, c, p, a := m.be, m.Cfg, m.p, m.acts
	B, T, C, F, NH := a.B, a.T, c.C, c.F, c.NH
	N := B * T
	la := &a.layers[min(l, len(a.layers)-1)]
	att := a.att[min(l, len(a.att)-1)]
	off := uint64(ps.Sample) * uint64(T*C)

	be.LayerNormForward(la.ln1, la.ln1Mean, la.ln1Rstd, a.resid[l], layer(p.ln1w, l, C), layer(p.ln1b, l, C), N, C)
	be.MatmulForward(la.qkv, la.ln1, layer(p.qkvw, l, 3*C*C), layer(p.qkvb, l, 3*C), N, C, 3*C)
	be.AttentionForward(la.atty, att, la.qkv, B, T, C, NH, m.dropout(ad, ps, l, siteAttnProbs), uint64(ps.Sample)*uint64(NH*T*T))
	be.MatmulForward(a.proj, la.atty, layer(p.attprojw, l, C*C), layer(p.attprojb, l, C), N, C, C)
	be.DropoutForward(a.proj, a.proj, m.dropout(hd, ps, l, siteAttnOut), off)
	be.ResidualForward(la.res2, a.resid[l], a.proj)

	be.LayerNormForward(la.ln2, la.ln2Mean, la.ln2Rstd, la.res2, layer(p.ln2w, l, C), layer(p.ln2b, l, C), N, C)
	be.MatmulForward(la.fch, la.ln2, layer(p.fcw, l, F*C), layer(p.fcb, l, F), N, C, F)
	be.GeluForward(la.fchGelu, la.fch)
	be.MatmulForward(a.proj, la.fchGelu, layer(p.fcprojw, l, C*F), layer(p.fcprojb, l, C), N, F, C)
	be.DropoutForward(a.proj, a.proj, m.dropout(hd, ps, l, siteMLPOut), off)
	be.ResidualForward(a.resid[l+1], la.res2, a.proj)
}

// Backward accumulates into Grads the gradient of the loss of the last
// training Forward (its logits already hold dloss/dlogits).
func (m *Model) Backward(ps Pass) {
	be, c, p, g, a := m.be, m.Cfg, m.p, m.g, m.acts
	B, T, C, V := a.B, a.T, c.C, c.V
	N := B * T
	hd, ad := c.HiddenDropout, c.AttnDropout

	// logits = lnf · wte[:V]ᵀ
	be.MatmulBackward(a.dln, g.wte[:V*C], nil, a.logits, a.lnf, p.wte[:V*C], N, C, V)
	be.Zero(a.dresid)
	be.LayerNormBackward(a.dresid, g.lnfw, g.lnfb, a.dln, a.resid[c.L], p.lnfw, a.lnfMean, a.lnfRstd, N, C)
	for l := c.L - 1; l >= 0; l-- {
		if m.recompute == RecomputeFull {
			m.blockForward(l, ps, hd, ad)
		}
		m.blockBackward(l, ps, hd, ad)
		if m.gradHook != nil {
			m.gradHook(l)
		}
	}
	off := uint64(ps.Sample) * uint64(T*C)
	be.DropoutBackward(a.dresid, a.dresid, m.dropout(hd, ps, 0, siteEmbed), off)
	be.EncoderBackward(g.wte, g.wpe, a.dresid, a.inputs, B, T, C)
}

// blockBackward takes dresid = dL/d resid[l+1] to dL/d resid[l], in place,
// accumulating block l's parameter gradients.
func (m *Model) blockBackward(l int, ps Pass, hd, ad float32) {
	be, c, p, g, a := m.be, m.Cfg, m.p, m.g, m.acts
	B, T, C, F, NH := a.B, a.T, c.C, c.F, c.NH
	N := B * T
	la := &a.layers[min(l, len(a.layers)-1)]
	att := a.att[min(l, len(a.att)-1)]
	off := uint64(ps.Sample) * uint64(T*C)
	attOff := uint64(ps.Sample) * uint64(NH*T*T)
	dropAttn := m.dropout(ad, ps, l, siteAttnProbs)

	// out = res2 + drop(fcproj(...)): dres2 = dout (the same buffer, dresid).
	be.DropoutBackward(a.proj, a.dresid, m.dropout(hd, ps, l, siteMLPOut), off)
	be.MatmulBackward(a.dfchG, layer(g.fcprojw, l, C*F), layer(g.fcprojb, l, C), a.proj, la.fchGelu, layer(p.fcprojw, l, C*F), N, F, C)
	be.GeluBackward(a.dfch, la.fch, la.fchGelu, a.dfchG)
	be.MatmulBackward(a.dln, layer(g.fcw, l, F*C), layer(g.fcb, l, F), a.dfch, la.ln2, layer(p.fcw, l, F*C), N, C, F)
	be.LayerNormBackward(a.dresid, layer(g.ln2w, l, C), layer(g.ln2b, l, C), a.dln, la.res2, layer(p.ln2w, l, C), la.ln2Mean, la.ln2Rstd, N, C)

	// res2 = x + drop(attproj(...)): dx = dres2 (still dresid).
	be.DropoutBackward(a.proj, a.dresid, m.dropout(hd, ps, l, siteAttnOut), off)
	be.MatmulBackward(a.datty, layer(g.attprojw, l, C*C), layer(g.attprojb, l, C), a.proj, la.atty, layer(p.attprojw, l, C*C), N, C, C)
	if m.recompute == RecomputeOnlyAttn {
		be.AttentionForward(la.atty, att, la.qkv, B, T, C, NH, dropAttn, attOff)
	}
	be.AttentionBackward(a.dqkv, a.datty, la.qkv, att, B, T, C, NH, dropAttn, attOff)
	be.MatmulBackward(a.dln, layer(g.qkvw, l, 3*C*C), layer(g.qkvb, l, 3*C), a.dqkv, la.ln1, layer(p.qkvw, l, 3*C*C), N, C, 3*C)
	be.LayerNormBackward(a.dresid, layer(g.ln1w, l, C), layer(g.ln1b, l, C), a.dln, a.resid[l], layer(p.ln1w, l, C), la.ln1Mean, la.ln1Rstd, N, C)
}

// padBuffers gives Params and Grads room for a multiple of k elements (zero
// beyond NumParams), so a flat buffer splits into k equal shards.
func (m *Model) padBuffers(k int) {
	n := len(m.Params)
	want := (n + k - 1) / k * k
	if cap(m.Params) >= want && cap(m.Grads) >= want {
		return
	}
	p, g := make([]float32, n, want), make([]float32, n, want)
	copy(p, m.Params)
	copy(g, m.Grads)
	m.Params, m.Grads = p, g
	m.p, m.g = viewWeights(p, m.Tensors), viewWeights(g, m.Tensors)
}

// layerRanges returns the [start, end) ranges of the flat buffer that hold
// block l's parameters (one per layered tensor).
func (m *Model) layerRanges(l int) [][2]int {
	var rs [][2]int
	for _, t := range m.Tensors {
		if len(t.Shape) < 2 || t.Shape[0] != m.Cfg.L || t.Name == "wte" || t.Name == "wpe" {
			continue
		}
		n := t.Size / m.Cfg.L
		rs = append(rs, [2]int{t.Offset + l*n, t.Offset + (l+1)*n})
	}
	return rs
}

// globalRanges returns the ranges of the parameters outside the blocks:
// wte, wpe, lnfw, lnfb.
func (m *Model) globalRanges() [][2]int {
	var rs [][2]int
	for _, t := range m.Tensors {
		switch t.Name {
		case "wte", "wpe", "lnfw", "lnfb":
			rs = append(rs, [2]int{t.Offset, t.Offset + t.Size})
		}
	}
	return rs
}

// ZeroGrad clears the gradient buffer.
func (m *Model) ZeroGrad() { m.be.Zero(m.Grads) }
