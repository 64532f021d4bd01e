package engine

import (
	"errors"
	"fmt"
	"slices"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/kernels"
)

// The Llama family (Llama 2 and 3), layer by layer beside GPT-2's passes
// (gpt2.go): the same residual stream, the same parallel hooks at the
// same points (parallel.go: the tensor-parallel regions, the
// vocabulary-parallel embedding and loss, stage 3's gathers and
// reduce-scatters in blocksForward and blocksBackward), onGrads for data
// parallel, recompute, the dropout sites when the config asks for them
// (Llama has none by default) — with Llama's layers:
//
//	x        = wte[inputs]                              no position embedding
//	h        = x + o_proj(attention(rope(q, k), v))     q, k, v = qkv(rmsnorm₁(x)), grouped-query
//	out      = h + down(silu(gate(n)) · up(n))          n = rmsnorm₂(h)
//	logits   = rmsnorm_f(x_L) · Wᵀ                      W = lm_head, or wte when tied
//
// with rmsnorm(x) = x / √(mean(x²) + eps) · w, rotary embeddings in
// Hugging Face's rotate_half layout (kernels.Backend.RoPEForward), and no
// biases. The tensors and their layout are in Tensors' doc comment.
//
// Tensor parallel splits a Llama as Megatron-LM does: the query heads and
// the key/value heads column-parallel with the qkv projection (each rank
// NH/MP query heads and the key/value heads they use: NKV/MP of them, or,
// when MP exceeds NKV, the one head its query heads share, alike on MP/NKV
// ranks whose gradients of it are summed: par.sumKVCopies), gate and up
// column-parallel, o_proj and down row-parallel, the embedding and the
// lm_head vocabulary-parallel.

// passes are a model family's layer passes, which the model's forward
// and backward passes (gpt2.go: forward, backward, blocksForward,
// blocksBackward), the pipeline (pipeline.go) and generation
// (generate.go) call: GPT-2's or Llama's.
type passes struct {
	embedForward, embedBackward func(a *activations, ps *pass)
	blockForward, blockBackward func(a *activations, li int, ps *pass, hd, ad float32)
	headForward, headBackward   func(a *activations, ps *pass)
	decodeStep                  func(kv *kvCache, a *decodeActs, pos int)
}

// setFamily sets the model's passes by its family.
func (m *Model) setFamily() {
	if m.Cfg.Family != arch.Llama {
		m.fam = passes{m.embedForward, m.embedBackward, m.blockForward, m.blockBackward, m.headForward, m.headBackward, m.decodeStep}
		return
	}
	m.fam = passes{m.llamaEmbedForward, m.llamaEmbedBackward, m.llamaBlockForward, m.llamaBlockBackward,
		m.llamaHeadForward, m.llamaHeadBackward, m.llamaDecodeStep}
}

// ensureRope makes a Llama's rotary table m.rope cover positions [0, n),
// n ≤ MaxT: computed on the host and uploaded, grown when a longer
// sequence comes, so that its size follows the sequences the model runs
// (the activations', a generation's), not max_position_embeddings, which
// a config may set to anything. Called where a pass's buffers are
// allocated, before its kernels.
//
// Where a micro-batch's rows are not positions 0 … n−1 of their sequences
// (context parallelism: par.positions), the table holds the rows'
// positions instead, one row of it per row of a sequence, built for n.
func (m *Model) ensureRope(n int) {
	c := m.Cfg
	if c.Family != arch.Llama {
		return
	}
	hd := c.C / c.NH
	pos := m.par.positions(n)
	if pos == nil && n <= len(m.rope)/hd || pos != nil && m.ropeRows == n {
		return
	}
	table := make([]float32, n*hd)
	if pos == nil {
		c.RoPE.Table(table, n, hd)
	} else {
		whole := make([]float32, (slices.Max(pos)+1)*hd)
		c.RoPE.Table(whole, slices.Max(pos)+1, hd)
		for j, p := range pos {
			copy(table[j*hd:(j+1)*hd], whole[p*hd:(p+1)*hd])
		}
		m.ropeRows = n
	}
	kernels.Free(m.be, m.rope)
	m.rope = kernels.Float32s(m.be, len(table))
	kernels.Upload(m.be, m.rope, table)
}

// llama reports whether c is of the Llama family.
func (c ModelConfig) llama() bool { return c.Family == arch.Llama }

// validateLlama reports a Llama shape the engine cannot run, naming the
// sizes as n does: key/value heads that do not divide the heads, rotary
// embeddings that do not fit the head size, a non-positive epsilon.
func (c ModelConfig) validateLlama(n ShapeNames) error {
	nkv := c.KVHeads()
	if nkv < 1 || c.NH%nkv != 0 {
		return fmt.Errorf("%s %d does not divide %s %d", n.NKV, nkv, n.NH, c.NH)
	}
	if err := c.RoPE.Check(c.C / c.NH); err != nil {
		return fmt.Errorf("%s %d and %s %d: %w", n.C, c.C, n.NH, c.NH, err)
	}
	if !(c.NormEps > 0) {
		return errors.New("the RMSNorm epsilon (rms_norm_eps) must be positive")
	}
	return nil
}

// widths are the columns of a block's activations (per row, this rank's
// slice): the qkv projection's output, the attention output, the MLP's
// first projection's output and its activation, and whether the block's
// norms keep their means (LayerNorm's; RMSNorm has none).
type widths struct {
	qkv, att, fc, act int
	mean              bool
}

// attnShape is the shape of the attention of the model's blocks on this
// rank: its query and key/value heads.
func (m *Model) attnShape() attnShape {
	d, hd := m.dims, m.Cfg.C/m.Cfg.NH
	if m.Cfg.Family == arch.Llama {
		return attnShape{NH: d.NHl, NKV: d.NKVl, hd: hd, gqa: true}
	}
	return attnShape{NH: d.NHl, NKV: d.NHl, hd: hd}
}

// blockWidths are the widths of the model's blocks. GPT-2: 3·Cl, Cl, Fl,
// Fl. Llama: (NHl + 2·NKVl)·hd, Cl, 2·Fl (gate and up), Fl.
func (m *Model) blockWidths() widths {
	d := m.dims
	if m.Cfg.Family == arch.Llama {
		hd := m.Cfg.C / m.Cfg.NH
		return widths{qkv: (d.NHl + 2*d.NKVl) * hd, att: d.Cl, fc: 2 * d.Fl, act: d.Fl}
	}
	return widths{qkv: 3 * d.Cl, att: d.Cl, fc: d.Fl, act: d.Fl, mean: true}
}

// headWeights are the views of the head's weights and their gradients:
// the lm_head's, or the token embedding's when tied.
func (m *Model) headWeights() (w, g []float32) {
	if m.Cfg.Tied() {
		return m.param.wte, m.grad.wte
	}
	return m.param.lmhead, m.grad.lmhead
}

// llamaEmbedForward writes the token embeddings of a.inputs to a.resid[0].
//
//	resid[0] = drop(wte[inputs])
//
// The layout's lookup as GPT-2's (embedForward), without positions: the
// rotary embeddings place the tokens inside attention.
func (m *Model) llamaEmbedForward(a *activations, ps *pass) {
	be, c, p := m.be, m.Cfg, m.param
	B, T, C := a.B, a.T, c.C
	hd := float32(0)
	if ps.train {
		hd = c.HiddenDropout
	}
	m.par.embedForward(ps, a.resid[0], a.inputs, p.wte, nil, B, T, C)
	be.DropoutForward(a.resid[0], a.resid[0], m.dropout(hd, ps.DropoutKey, 0, siteEmbed), m.streamOff(ps, B, T))
}

// llamaEmbedBackward accumulates the embedding's gradient from sc.dresid.
func (m *Model) llamaEmbedBackward(a *activations, ps *pass) {
	be, c, g, sc := m.be, m.Cfg, m.grad, m.scratch
	B, T, C := a.B, a.T, c.C
	be.DropoutBackward(sc.dresid, sc.dresid, m.dropout(c.HiddenDropout, ps.DropoutKey, 0, siteEmbed), m.streamOff(ps, B, T))
	m.par.embedBackward(ps, g.wte, nil, sc.dresid, a.inputs, B, T, C)
}

// llamaBlockForward runs local block li (global block l): resid[li] →
// resid[li+1]. With hd = C/NH, W = (NHl + 2·NKVl)·hd, Nr the rank's rows
// of the residual stream (par.rows):
//
//	ln1  (Nr,C) = rmsnorm(x)·ln1w
//	qkv  (N,W)  = ln1 · qkvwᵀ, then q and k rotated by position, in place
//	atty (N,Cl) = attention of the NHl query heads, query head h reading
//	              key/value head h/(NHl/NKVl)
//	res2 (Nr,C) = x + drop(atty · attprojwᵀ)            o_proj
//	ln2  (Nr,C) = rmsnorm(res2)·ln2w
//	fch  (N,2Fl) = ln2 · fcwᵀ                           gate | up
//	out  (Nr,C) = res2 + drop(swiglu(fch) · fcprojwᵀ)   down
//
// Tensor-parallel: qkv and fc column-parallel, o_proj and down
// row-parallel, the regions entered and left as in GPT-2's block.
func (m *Model) llamaBlockForward(a *activations, li int, ps *pass, hd, ad float32) {
	be, c, d, sc := m.be, m.Cfg, m.dims, m.scratch
	B, T, C, Cl, Fl := a.B, a.T, c.C, d.Cl, d.Fl
	N, l, hs, W := B*T, m.Part.Layers[li], c.C/c.NH, m.blockWidths().qkv
	_, Nr := m.par.rows(N)
	la, att := &a.layers[li], a.att[li]
	off := m.streamOff(ps, B, T)
	bp, _ := m.blockViews(li)

	be.RMSNormForward(la.ln1, la.ln1Rstd, a.resid[li], bp.ln1w, Nr, C, c.NormEps)
	x := m.par.enterTP(ps, la.ln1)
	be.MatmulForward(la.qkv, x, bp.qkvw, nil, N, C, W)
	be.RoPEForward(la.qkv, la.qkv, m.rope, B, T, W, d.NHl+d.NKVl, hs, 0)
	m.par.attention(ps, la.atty, att, la.qkv, B, T, m.attnShape(), m.attnDropout(ad, ps.DropoutKey, l), uint64(ps.Sample)*uint64(c.NH*T*T))
	be.MatmulForward(sc.proj, la.atty, bp.attprojw, nil, N, Cl, C)
	y := m.par.exitTP(ps, sc.proj)
	be.DropoutForward(y, y, m.dropout(hd, ps.DropoutKey, l, siteAttnOut), off)
	// res2 (Nr,C) = resid[li] + y and ln2 (Nr,C) = rmsnorm(res2)·ln2w in one
	// kernel (llm.c's fused_residual_forward), after y's dropout.
	be.ResidualRMSNormForward(la.res2, la.ln2, la.ln2Rstd, a.resid[li], y, bp.ln2w, Nr, C, c.NormEps)
	x = m.par.enterTP(ps, la.ln2)
	be.MatmulForward(la.fch, x, bp.fcw, nil, N, C, 2*Fl)
	be.SwiGLUForward(la.fchGelu, la.fch, N, Fl)
	be.MatmulForward(sc.proj, la.fchGelu, bp.fcprojw, nil, N, Fl, C)
	y = m.par.exitTP(ps, sc.proj)
	be.DropoutForward(y, y, m.dropout(hd, ps.DropoutKey, l, siteMLPOut), off)
	be.ResidualForward(a.resid[li+1], la.res2, y)
}

// llamaBlockBackward takes sc.dresid = dL/d resid[li+1] to dL/d resid[li],
// in place, accumulating local block li's parameter gradients.
// Tensor-parallel: the regions' hooks mirrored, as in GPT-2's block; a
// key/value head held alike by several ranks gets from each the share of
// its query heads, summed over them (par.sumKVCopies) before it is
// accumulated.
func (m *Model) llamaBlockBackward(a *activations, li int, ps *pass, hd, ad float32) {
	be, c, d, sc := m.be, m.Cfg, m.dims, m.scratch
	B, T, C, Cl, Fl := a.B, a.T, c.C, d.Cl, d.Fl
	N, l, hs, W := B*T, m.Part.Layers[li], c.C/c.NH, m.blockWidths().qkv
	_, Nr := m.par.rows(N)
	la, att := &a.layers[li], a.att[li]
	off := m.streamOff(ps, B, T)
	bp, bg := m.blockViews(li)
	attOff := uint64(ps.Sample) * uint64(c.NH*T*T)
	dropAttn := m.attnDropout(ad, ps.DropoutKey, l)
	ng := m.normGrads(bg.ln1w, bg.ln2w)
	dy := m.branchGrad(hd) // each branch's output gradient, dresid through its dropout

	// out = res2 + drop(down(...)): dres2 = dout (the same buffer, dresid).
	m.dropoutBackward(dy, hd, ps.DropoutKey, l, siteMLPOut, off)
	dyAll := m.par.exitTPBackward(ps, dy)
	be.MatmulBackward(sc.dfchG, bg.fcprojw, nil, dyAll, la.fchGelu, bp.fcprojw, N, Fl, C)
	be.SwiGLUBackward(sc.dfch, la.fch, sc.dfchG, N, Fl)
	be.MatmulBackward(sc.dln, bg.fcw, nil, sc.dfch, m.par.enterTP(ps, la.ln2), bp.fcw, N, C, 2*Fl)
	dx := m.par.enterTPBackward(ps, sc.dln)
	be.RMSNormBackward(sc.dresid, ng[1], dx, la.res2, bp.ln2w, la.ln2Rstd, Nr, C)

	// res2 = x + drop(o_proj(...)): dx = dres2 (still dresid).
	m.dropoutBackward(dy, hd, ps.DropoutKey, l, siteAttnOut, off)
	dyAll = m.par.exitTPBackward(ps, dy)
	be.MatmulBackward(sc.datty, bg.attprojw, nil, dyAll, la.atty, bp.attprojw, N, Cl, C)
	if m.recompute == RecomputeOnlyAttn {
		m.par.attention(ps, la.atty, att, la.qkv, B, T, m.attnShape(), dropAttn, attOff)
	}
	m.par.attentionBackward(ps, sc.dqkv, sc.datty, la.atty, la.qkv, att, B, T, m.attnShape(), dropAttn, attOff)
	be.RoPEBackward(sc.dqkv, sc.dqkv, m.rope, B, T, W, d.NHl+d.NKVl, hs, 0)
	if d.kvCopies > 1 {
		// This micro-batch's qkvw gradient apart, its key/value rows
		// summed over the copies, then accumulated.
		be.Zero(sc.dqkvw)
		be.MatmulBackward(sc.dln, sc.dqkvw, nil, sc.dqkv, m.par.enterTP(ps, la.ln1), bp.qkvw, N, C, W)
		m.par.sumKVCopies(ps, sc.dqkvw[Cl*C:])
		be.ResidualForward(bg.qkvw, bg.qkvw, sc.dqkvw)
	} else {
		be.MatmulBackward(sc.dln, bg.qkvw, nil, sc.dqkv, m.par.enterTP(ps, la.ln1), bp.qkvw, N, C, W)
	}
	dx = m.par.enterTPBackward(ps, sc.dln)
	be.RMSNormBackward(sc.dresid, ng[0], dx, a.resid[li], bp.ln1w, la.ln1Rstd, Nr, C)
	m.addNormGrads(ps, ng, [][]float32{bg.ln1w, bg.ln2w})
}

// llamaHeadForward runs the final RMSNorm, the head and the loss on
// resid[Ll], adding the mean of the B·T losses to ps.loss on the device.
//
//	logits (N,Vpl) = rmsnorm(x)·lnfw · W[:Vpl]ᵀ   W: lm_head, or wte when tied; padding masked in the loss
//
// Vocabulary-parallel as GPT-2's head (classify).
func (m *Model) llamaHeadForward(a *activations, ps *pass) {
	be, c, p := m.be, m.Cfg, m.param
	_, Nr := m.par.rows(a.B * a.T)
	be.RMSNormForward(a.lnf, a.lnfRstd, a.resid[m.numLayers()], p.lnfw, Nr, c.C, c.NormEps)
	w, gw := m.headWeights()
	m.classify(a, ps, w, gw)
}

// llamaHeadBackward starts the backward pass: from the head's input gradient
// to sc.dresid = dL/d resid[Ll].
func (m *Model) llamaHeadBackward(a *activations, ps *pass) {
	be, c, p, g, sc := m.be, m.Cfg, m.param, m.grad, m.scratch
	_, Nr := m.par.rows(a.B * a.T)
	dx := m.classifyBackward(a, ps)
	be.Zero(sc.dresid)
	ng := m.normGrads(g.lnfw)
	be.RMSNormBackward(sc.dresid, ng[0], dx, a.resid[m.numLayers()], p.lnfw, a.lnfRstd, Nr, c.C)
	m.addNormGrads(ps, ng, [][]float32{g.lnfw})
}

// llamaDecodeStep queues the whole model on token a.tok[b] at position pos of
// every sequence, appending its rotated keys and its values to the
// grouped cache (NKV·hd channels a position), and leaves the next-token
// logits (B,V) in a.logits: GQADecode attends each query head to its
// key/value head.
func (m *Model) llamaDecodeStep(kv *kvCache, a *decodeActs, pos int) {
	be, c, p := m.be, m.Cfg, m.param
	B, C, F, V := kv.B, c.C, c.F, c.V
	hs, nkv := c.C/c.NH, c.KVHeads()
	W := C + 2*nkv*hs
	// x = wte[tok], no position embedding (the rotation carries it).
	be.EncoderShardForward(a.x, a.tok, p.wte, 0, nil, B, 1, C)
	for l := 0; l < c.L; l++ {
		be.RMSNormForward(a.ln, a.rstd, a.x, layer(p.ln1w, l, C), B, C, c.NormEps)
		be.MatmulForward(a.qkv, a.ln, layer(p.qkvw, l, W*C), nil, B, C, W)
		be.RoPEForward(a.qkv, a.qkv, m.rope, B, 1, W, c.NH+nkv, hs, pos)
		kv.append(be, a, l, pos, a.qkv, C, nkv*hs)
		be.GQADecode(a.atty, a.q, kv.k[l], kv.v[l], B, pos, kv.maxT, c.NH, nkv, hs)
		be.MatmulForward(a.proj, a.atty, layer(p.attprojw, l, C*C), nil, B, C, C)
		be.ResidualForward(a.res2, a.x, a.proj)
		be.RMSNormForward(a.ln, a.rstd, a.res2, layer(p.ln2w, l, C), B, C, c.NormEps)
		be.MatmulForward(a.fch, a.ln, layer(p.fcw, l, 2*F*C), nil, B, C, 2*F)
		be.SwiGLUForward(a.fchG, a.fch, B, F)
		be.MatmulForward(a.proj, a.fchG, layer(p.fcprojw, l, C*F), nil, B, F, C)
		be.ResidualForward(a.x, a.res2, a.proj)
	}
	be.RMSNormForward(a.ln, a.rstd, a.x, p.lnfw, B, C, c.NormEps)
	w, _ := m.headWeights()
	be.MatmulForward(a.logits, a.ln, w[:V*C], nil, B, C, V)
}
