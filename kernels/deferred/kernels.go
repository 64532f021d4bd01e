package deferred

import "github.com/gptui/gptui/kernels"

// The kernels, each queued with the buffers it writes (outs) and reads
// (ins) as kernels.Backend documents them.

type (
	outs = []any
	ins  = []any
)

// Sgemm queues C = alpha·op(A)·op(B) + beta·C.
func (b *Backend) Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, bm []float32, ldb int, beta float32, c []float32, ldc int) {
	b.enqueue("Sgemm", func() {
		b.inner.Sgemm(transA, transB, m, n, k, alpha, dev(b, a), lda, dev(b, bm), ldb, beta, dev(b, c), ldc)
	}, outs{c}, ins{a, bm})
}

// EncoderForward queues the inner backend's EncoderForward.
func (b *Backend) EncoderForward(out []float32, inp []int32, wte, wpe []float32, B, T, C int) {
	b.enqueue("EncoderForward", func() { b.inner.EncoderForward(dev(b, out), dev(b, inp), dev(b, wte), dev(b, wpe), B, T, C) }, outs{out}, ins{inp, wte, wpe})
}

// EncoderBackward queues the inner backend's EncoderBackward.
func (b *Backend) EncoderBackward(dwte, dwpe, dout []float32, inp []int32, B, T, C int) {
	b.enqueue("EncoderBackward", func() { b.inner.EncoderBackward(dev(b, dwte), dev(b, dwpe), dev(b, dout), dev(b, inp), B, T, C) }, outs{dwte, dwpe}, ins{dout, inp})
}

// EncoderShardForward queues the inner backend's EncoderShardForward.
func (b *Backend) EncoderShardForward(out []float32, inp []int32, wte []float32, vlo int, wpe []float32, B, T, C int) {
	b.enqueue("EncoderShardForward", func() { b.inner.EncoderShardForward(dev(b, out), dev(b, inp), dev(b, wte), vlo, dev(b, wpe), B, T, C) }, outs{out}, ins{inp, wte, wpe})
}

// EncoderShardBackward queues the inner backend's EncoderShardBackward.
func (b *Backend) EncoderShardBackward(dwte []float32, vlo int, dwpe, dout []float32, inp []int32, B, T, C int) {
	b.enqueue("EncoderShardBackward", func() {
		b.inner.EncoderShardBackward(dev(b, dwte), vlo, dev(b, dwpe), dev(b, dout), dev(b, inp), B, T, C)
	}, outs{dwte, dwpe}, ins{dout, inp})
}

// LayerNormForward queues the inner backend's LayerNormForward.
func (b *Backend) LayerNormForward(out, mean, rstd, inp, w, bias []float32, N, C int) {
	b.enqueue("LayerNormForward", func() {
		b.inner.LayerNormForward(dev(b, out), dev(b, mean), dev(b, rstd), dev(b, inp), dev(b, w), dev(b, bias), N, C)
	}, outs{out, mean, rstd}, ins{inp, w, bias})
}

// ResidualLayerNormForward queues the inner backend's ResidualLayerNormForward.
func (b *Backend) ResidualLayerNormForward(res, out, mean, rstd, x, y, w, bias []float32, N, C int) {
	b.enqueue("ResidualLayerNormForward", func() {
		b.inner.ResidualLayerNormForward(dev(b, res), dev(b, out), dev(b, mean), dev(b, rstd), dev(b, x), dev(b, y), dev(b, w), dev(b, bias), N, C)
	}, outs{res, out, mean, rstd}, ins{x, y, w, bias})
}

// LayerNormBackward queues the inner backend's LayerNormBackward.
func (b *Backend) LayerNormBackward(dinp, dw, dbias, dout, inp, w, mean, rstd []float32, N, C int) {
	b.enqueue("LayerNormBackward", func() {
		b.inner.LayerNormBackward(dev(b, dinp), dev(b, dw), dev(b, dbias), dev(b, dout), dev(b, inp), dev(b, w), dev(b, mean), dev(b, rstd), N, C)
	},
		outs{dinp, dw, dbias}, ins{dout, inp, w, mean, rstd})
}

// MatmulForward queues the inner backend's MatmulForward.
func (b *Backend) MatmulForward(out, inp, w, bias []float32, N, IC, OC int) {
	b.enqueue("MatmulForward", func() { b.inner.MatmulForward(dev(b, out), dev(b, inp), dev(b, w), dev(b, bias), N, IC, OC) }, outs{out}, ins{inp, w, bias})
}

// MatmulBackward queues the inner backend's MatmulBackward.
func (b *Backend) MatmulBackward(dinp, dw, dbias, dout, inp, w []float32, N, IC, OC int) {
	b.enqueue("MatmulBackward", func() {
		b.inner.MatmulBackward(dev(b, dinp), dev(b, dw), dev(b, dbias), dev(b, dout), dev(b, inp), dev(b, w), N, IC, OC)
	},
		outs{dinp, dw, dbias}, ins{dout, inp, w})
}

// MatmulGeluForward queues the inner backend's MatmulGeluForward.
func (b *Backend) MatmulGeluForward(out, pre, inp, w, bias []float32, N, IC, OC int) {
	b.enqueue("MatmulGeluForward", func() {
		b.inner.MatmulGeluForward(dev(b, out), dev(b, pre), dev(b, inp), dev(b, w), dev(b, bias), N, IC, OC)
	},
		outs{out, pre}, ins{inp, w, bias})
}

// MatmulBackwardGelu queues the inner backend's MatmulBackwardGelu.
func (b *Backend) MatmulBackwardGelu(dinp, dw, dbias, dout, inp, pre, w []float32, N, IC, OC int) {
	b.enqueue("MatmulBackwardGelu", func() {
		b.inner.MatmulBackwardGelu(dev(b, dinp), dev(b, dw), dev(b, dbias), dev(b, dout), dev(b, inp), dev(b, pre), dev(b, w), N, IC, OC)
	},
		outs{dinp, dw, dbias}, ins{dout, inp, pre, w})
}

// AttentionForward queues the inner backend's AttentionForward.
func (b *Backend) AttentionForward(out, att, qkv []float32, B, T, C, NH int, d kernels.Dropout, off uint64) {
	b.enqueue("AttentionForward", func() { b.inner.AttentionForward(dev(b, out), dev(b, att), dev(b, qkv), B, T, C, NH, d, off) }, outs{out, att}, ins{qkv})
}

// AttentionBackward queues the inner backend's AttentionBackward.
func (b *Backend) AttentionBackward(dqkv, dout, out, qkv, att []float32, B, T, C, NH int, d kernels.Dropout, off uint64) {
	b.enqueue("AttentionBackward", func() {
		b.inner.AttentionBackward(dev(b, dqkv), dev(b, dout), dev(b, out), dev(b, qkv), dev(b, att), B, T, C, NH, d, off)
	},
		outs{dqkv}, ins{dout, out, qkv, att})
}

// AttentionDecode queues the inner backend's AttentionDecode.
func (b *Backend) AttentionDecode(out, q, kc, vc []float32, B, pos, maxT, C, NH int) {
	b.enqueue("AttentionDecode", func() { b.inner.AttentionDecode(dev(b, out), dev(b, q), dev(b, kc), dev(b, vc), B, pos, maxT, C, NH) }, outs{out}, ins{q, kc, vc})
}

// GeluForward queues the inner backend's GeluForward.
func (b *Backend) GeluForward(out, inp []float32) {
	b.enqueue("GeluForward", func() { b.inner.GeluForward(dev(b, out), dev(b, inp)) }, outs{out}, ins{inp})
}

// GeluBackward queues the inner backend's GeluBackward.
func (b *Backend) GeluBackward(dinp, inp, out, dout []float32) {
	b.enqueue("GeluBackward", func() { b.inner.GeluBackward(dev(b, dinp), dev(b, inp), dev(b, out), dev(b, dout)) }, outs{dinp}, ins{inp, out, dout})
}

// ResidualForward queues the inner backend's ResidualForward.
func (b *Backend) ResidualForward(out, a, c []float32) {
	b.enqueue("ResidualForward", func() { b.inner.ResidualForward(dev(b, out), dev(b, a), dev(b, c)) }, outs{out}, ins{a, c})
}

// DropoutForward queues the inner backend's DropoutForward.
func (b *Backend) DropoutForward(out, inp []float32, d kernels.Dropout, off uint64) {
	b.enqueue("DropoutForward", func() { b.inner.DropoutForward(dev(b, out), dev(b, inp), d, off) }, outs{out}, ins{inp})
}

// DropoutBackward queues the inner backend's DropoutBackward.
func (b *Backend) DropoutBackward(dinp, dout []float32, d kernels.Dropout, off uint64) {
	b.enqueue("DropoutBackward", func() { b.inner.DropoutBackward(dev(b, dinp), dev(b, dout), d, off) }, outs{dinp}, ins{dout})
}

// CrossEntropy queues the inner backend's CrossEntropy.
func (b *Backend) CrossEntropy(losses, logits []float32, targets []int32, N, V, ld int, dscale float32, grad bool) {
	o := outs{losses}
	if grad {
		o = append(o, logits)
	}
	b.enqueue("CrossEntropy", func() { b.inner.CrossEntropy(dev(b, losses), dev(b, logits), dev(b, targets), N, V, ld, dscale, grad) }, o, ins{logits, targets})
}

// ClassifierMax queues the inner backend's ClassifierMax.
func (b *Backend) ClassifierMax(maxes, logits []float32, N, V, ld int) {
	b.enqueue("ClassifierMax", func() { b.inner.ClassifierMax(dev(b, maxes), dev(b, logits), N, V, ld) }, outs{maxes}, ins{logits})
}

// ClassifierGlobalMax queues the inner backend's ClassifierGlobalMax.
func (b *Backend) ClassifierGlobalMax(maxes, gmax []float32, N, MP int) {
	b.enqueue("ClassifierGlobalMax", func() { b.inner.ClassifierGlobalMax(dev(b, maxes), dev(b, gmax), N, MP) }, outs{maxes}, ins{gmax})
}

// ClassifierExp queues the inner backend's ClassifierExp.
func (b *Backend) ClassifierExp(stats []float64, logits []float32, targets []int32, maxes []float32, N, V, ld, vlo int) {
	b.enqueue("ClassifierExp", func() {
		b.inner.ClassifierExp(dev(b, stats), dev(b, logits), dev(b, targets), dev(b, maxes), N, V, ld, vlo)
	},
		outs{stats}, ins{logits, targets, maxes})
}

// ClassifierFinish queues the inner backend's ClassifierFinish.
func (b *Backend) ClassifierFinish(losses, logits []float32, targets []int32, maxes []float32, stats []float64, N, V, ld, vlo int, dscale float32, grad bool) {
	o := outs{losses}
	if grad {
		o = append(o, logits)
	}
	b.enqueue("ClassifierFinish", func() {
		b.inner.ClassifierFinish(dev(b, losses), dev(b, logits), dev(b, targets), dev(b, maxes), dev(b, stats), N, V, ld, vlo, dscale, grad)
	},
		o, ins{logits, targets, maxes, stats})
}

// AdamW queues the inner backend's AdamW.
func (b *Backend) AdamW(params, grads, m, v []float32, lr, beta1, beta2, eps, wd, gscale float32, step int) {
	b.enqueue("AdamW", func() {
		b.inner.AdamW(dev(b, params), dev(b, grads), dev(b, m), dev(b, v), lr, beta1, beta2, eps, wd, gscale, step)
	},
		outs{params, m, v}, ins{grads})
}

// Sum queues the inner backend's Sum.
func (b *Backend) Sum(out []float64, x []float32, w float64) {
	b.enqueue("Sum", func() { b.inner.Sum(dev(b, out), dev(b, x), w) }, outs{out[:1]}, ins{x})
}

// SumSquares queues the inner backend's SumSquares.
func (b *Backend) SumSquares(out []float64, x []float32, w float64) {
	b.enqueue("SumSquares", func() { b.inner.SumSquares(dev(b, out), dev(b, x), w) }, outs{out[:1]}, ins{x})
}

// Copy queues the inner backend's Copy.
func (b *Backend) Copy(dst, src []float32) {
	b.enqueue("Copy", func() { b.inner.Copy(dev(b, dst), dev(b, src)) }, outs{dst}, ins{src})
}

// Zero queues the inner backend's Zero.
func (b *Backend) Zero(x []float32) {
	b.enqueue("Zero", func() { b.inner.Zero(dev(b, x)) }, outs{x}, nil)
}

// Scale queues the inner backend's Scale.
func (b *Backend) Scale(x []float32, s float32) {
	b.enqueue("Scale", func() { b.inner.Scale(dev(b, x), s) }, outs{x}, nil)
}

// RMSNormForward queues the inner backend's RMSNormForward.
func (b *Backend) RMSNormForward(out, rstd, inp, w []float32, N, C int, eps float32) {
	b.enqueue("RMSNormForward", func() { b.inner.RMSNormForward(dev(b, out), dev(b, rstd), dev(b, inp), dev(b, w), N, C, eps) }, outs{out, rstd}, ins{inp, w})
}

// ResidualRMSNormForward queues the inner backend's ResidualRMSNormForward.
func (b *Backend) ResidualRMSNormForward(res, out, rstd, x, y, w []float32, N, C int, eps float32) {
	b.enqueue("ResidualRMSNormForward", func() {
		b.inner.ResidualRMSNormForward(dev(b, res), dev(b, out), dev(b, rstd), dev(b, x), dev(b, y), dev(b, w), N, C, eps)
	}, outs{res, out, rstd}, ins{x, y, w})
}

// RMSNormBackward queues the inner backend's RMSNormBackward.
func (b *Backend) RMSNormBackward(dinp, dw, dout, inp, w, rstd []float32, N, C int) {
	b.enqueue("RMSNormBackward", func() {
		b.inner.RMSNormBackward(dev(b, dinp), dev(b, dw), dev(b, dout), dev(b, inp), dev(b, w), dev(b, rstd), N, C)
	}, outs{dinp, dw}, ins{dout, inp, w, rstd})
}

// RoPEForward queues the inner backend's RoPEForward.
func (b *Backend) RoPEForward(out, inp, table []float32, B, T, C, heads, hd, pos0 int) {
	b.enqueue("RoPEForward", func() { b.inner.RoPEForward(dev(b, out), dev(b, inp), dev(b, table), B, T, C, heads, hd, pos0) }, outs{out}, ins{inp, table})
}

// RoPEBackward queues the inner backend's RoPEBackward.
func (b *Backend) RoPEBackward(dinp, dout, table []float32, B, T, C, heads, hd, pos0 int) {
	b.enqueue("RoPEBackward", func() { b.inner.RoPEBackward(dev(b, dinp), dev(b, dout), dev(b, table), B, T, C, heads, hd, pos0) }, outs{dinp}, ins{dout, table})
}

// SwiGLUForward queues the inner backend's SwiGLUForward.
func (b *Backend) SwiGLUForward(out, inp []float32, N, F int) {
	b.enqueue("SwiGLUForward", func() { b.inner.SwiGLUForward(dev(b, out), dev(b, inp), N, F) }, outs{out}, ins{inp})
}

// SwiGLUBackward queues the inner backend's SwiGLUBackward.
func (b *Backend) SwiGLUBackward(dinp, inp, dout []float32, N, F int) {
	b.enqueue("SwiGLUBackward", func() { b.inner.SwiGLUBackward(dev(b, dinp), dev(b, inp), dev(b, dout), N, F) }, outs{dinp}, ins{inp, dout})
}

// GQAForward queues the inner backend's GQAForward.
func (b *Backend) GQAForward(out, att, qkv []float32, B, T, NH, NKV, hd int, d kernels.Dropout, off uint64) {
	b.enqueue("GQAForward", func() { b.inner.GQAForward(dev(b, out), dev(b, att), dev(b, qkv), B, T, NH, NKV, hd, d, off) }, outs{out, att}, ins{qkv})
}

// GQABackward queues the inner backend's GQABackward.
func (b *Backend) GQABackward(dqkv, dout, out, qkv, att []float32, B, T, NH, NKV, hd int, d kernels.Dropout, off uint64) {
	b.enqueue("GQABackward", func() {
		b.inner.GQABackward(dev(b, dqkv), dev(b, dout), dev(b, out), dev(b, qkv), dev(b, att), B, T, NH, NKV, hd, d, off)
	},
		outs{dqkv}, ins{dout, out, qkv, att})
}

// GQADecode queues the inner backend's GQADecode.
func (b *Backend) GQADecode(out, q, kc, vc []float32, B, pos, maxT, NH, NKV, hd int) {
	b.enqueue("GQADecode", func() { b.inner.GQADecode(dev(b, out), dev(b, q), dev(b, kc), dev(b, vc), B, pos, maxT, NH, NKV, hd) }, outs{out}, ins{q, kc, vc})
}

// RingKV queues the inner backend's RingKV.
func (b *Backend) RingKV(kv, qkv []float32, rows, NH, NKV, hd int) {
	b.enqueue("RingKV", func() { b.inner.RingKV(dev(b, kv), dev(b, qkv), rows, NH, NKV, hd) }, outs{kv}, ins{qkv})
}

// RingAttentionForward queues the inner backend's RingAttentionForward.
func (b *Backend) RingAttentionForward(out, stats, qkv, kv []float32, B, c, NH, NKV, hd, cp, qr, kr int, first bool) {
	b.enqueue("RingAttentionForward", func() {
		b.inner.RingAttentionForward(dev(b, out), dev(b, stats), dev(b, qkv), dev(b, kv), B, c, NH, NKV, hd, cp, qr, kr, first)
	},
		outs{out, stats}, ins{qkv, kv})
}

// RingAttentionFinish queues the inner backend's RingAttentionFinish.
func (b *Backend) RingAttentionFinish(out, lse, stats []float32, rows, NH, hd int) {
	b.enqueue("RingAttentionFinish", func() { b.inner.RingAttentionFinish(dev(b, out), dev(b, lse), dev(b, stats), rows, NH, hd) }, outs{out, lse}, ins{stats})
}

// RingAttentionDelta queues the inner backend's RingAttentionDelta.
func (b *Backend) RingAttentionDelta(delta, dout, out []float32, rows, NH, hd int) {
	b.enqueue("RingAttentionDelta", func() { b.inner.RingAttentionDelta(dev(b, delta), dev(b, dout), dev(b, out), rows, NH, hd) }, outs{delta}, ins{dout, out})
}

// RingAttentionBackward queues the inner backend's RingAttentionBackward.
func (b *Backend) RingAttentionBackward(dqkv, dkv, dout, qkv, kv, lse, delta []float32, B, c, NH, NKV, hd, cp, qr, kr int) {
	b.enqueue("RingAttentionBackward", func() {
		b.inner.RingAttentionBackward(dev(b, dqkv), dev(b, dkv), dev(b, dout), dev(b, qkv), dev(b, kv), dev(b, lse), dev(b, delta), B, c, NH, NKV, hd, cp, qr, kr)
	},
		outs{dqkv, dkv}, ins{dout, qkv, kv, lse, delta})
}

// RingKVGrad queues the inner backend's RingKVGrad.
func (b *Backend) RingKVGrad(dqkv, dkv []float32, rows, NH, NKV, hd int) {
	b.enqueue("RingKVGrad", func() { b.inner.RingKVGrad(dev(b, dqkv), dev(b, dkv), rows, NH, NKV, hd) }, outs{dqkv}, ins{dkv})
}
