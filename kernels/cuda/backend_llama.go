package cuda

import (
	"fmt"

	"github.com/gptui/gptui/kernels"
)

// The Llama family's kernels.Backend methods: RMSNorm, rotary embeddings,
// SwiGLU and grouped-query attention, computing in float32 on float32 or
// bfloat16 activations (activations.go).

// RMSNormForward normalises N rows of C channels by their root mean square.
func (b *Backend) RMSNormForward(out, rstd, inp, w []float32, N, C int, eps float32) {
	if b.ok() {
		b.run("RMSNormForward", b.k.RMSNormForward(b.s, b.buf(out), b.ptr(rstd), b.buf(inp), b.ptr(w), N, C, eps))
	}
}

// RMSNormBackward accumulates into dinp and dw.
func (b *Backend) RMSNormBackward(dinp, dw, dout, inp, w, rstd []float32, N, C int) {
	if !b.ok() {
		return
	}
	if err := b.needShared("rmsnorm_backward", RMSNormBackwardShared(C)); err != nil {
		_, rms := b.variants.NormMaxChannels()
		b.run("RMSNormBackward", fmt.Errorf("C=%d (at most %d here): %w", C, rms, err))
		return
	}
	b.run("RMSNormBackward", b.k.RMSNormBackward(b.s, b.buf(dinp), b.ptr(dw), b.buf(dout), b.buf(inp), b.ptr(w), b.ptr(rstd), N, C))
}

// RoPEForward rotates the query and key heads by their positions.
func (b *Backend) RoPEForward(out, inp, table []float32, B, T, C, heads, hd, pos0 int) {
	if b.ok() && b.ropeTable("RoPEForward", table, T, hd, pos0) {
		b.run("RoPEForward", b.k.RoPEForward(b.s, b.buf(out), b.buf(inp), b.ptr(table), B, T, C, heads, hd, pos0))
	}
}

// RoPEBackward is the inverse rotation on the gradient.
func (b *Backend) RoPEBackward(dinp, dout, table []float32, B, T, C, heads, hd, pos0 int) {
	if b.ok() && b.ropeTable("RoPEBackward", table, T, hd, pos0) {
		b.run("RoPEBackward", b.k.RoPEBackward(b.s, b.buf(dinp), b.buf(dout), b.ptr(table), B, T, C, heads, hd, pos0))
	}
}

// ropeTable records an error unless table holds the rows of positions
// pos0 … pos0+T−1 (the kernel cannot tell).
func (b *Backend) ropeTable(op string, table []float32, T, hd, pos0 int) bool {
	if pos0 < 0 || len(table) < (pos0+T)*hd {
		b.run(op, fmt.Errorf("cuda: a rotary table of %d floats has no rows for positions %d … %d of head size %d", len(table), pos0, pos0+T-1, hd))
		return false
	}
	return true
}

// SwiGLUForward: out = silu(gate)·up from the fused (N,2F) projections.
func (b *Backend) SwiGLUForward(out, inp []float32, N, F int) {
	if b.ok() {
		b.run("SwiGLUForward", b.k.SwiGLUForward(b.s, b.buf(out), b.buf(inp), N, F))
	}
}

// SwiGLUBackward writes dinp (N,2F), overwritten.
func (b *Backend) SwiGLUBackward(dinp, inp, dout []float32, N, F int) {
	if b.ok() {
		b.run("SwiGLUBackward", b.k.SwiGLUBackward(b.s, b.buf(dinp), b.buf(inp), b.buf(dout), N, F))
	}
}

// GQAForward is causal grouped-query attention; att holds each query row's
// log-sum-exp (AttentionFloats), not the probabilities.
func (b *Backend) GQAForward(out, att, qkv []float32, B, T, NH, NKV, hd int, d kernels.Dropout, off uint64) {
	if b.ok() && !b.flashForward(out, att, qkv, B, T, NH, NKV, hd, d) {
		b.run("GQAForward", b.k.GQAForward(b.s, b.buf(out), b.ptr(att), b.buf(qkv), B, T, NH, NKV, hd, d.P, d.Key, d.Heads, d.Head0, off))
	}
}

// GQABackward overwrites dqkv, recomputing the probabilities from qkv and
// the log-sum-exps in att; out is the forward pass's output.
func (b *Backend) GQABackward(dqkv, dout, out, qkv, att []float32, B, T, NH, NKV, hd int, d kernels.Dropout, off uint64) {
	if b.ok() && !b.flashBackward(dqkv, dout, out, qkv, att, B, T, NH, NKV, hd, d) {
		dq, err := b.dqFor(dqkv, B*T*NH*hd)
		if err == nil {
			err = b.k.GQABackward(b.s, b.buf(dqkv), b.buf(dout), b.buf(out), b.buf(qkv), b.ptr(att), dq, B, T, NH, NKV, hd, d.P, d.Key, d.Heads, d.Head0, off)
		}
		b.run("GQABackward", err)
	}
}

// GQADecode attends one new position per sequence to a grouped KV cache.
func (b *Backend) GQADecode(out, q, kc, vc []float32, B, pos, maxT, NH, NKV, hd int) {
	if b.ok() {
		b.run("GQADecode", b.k.GQADecode(b.s, b.buf(out), b.buf(q), b.ptr(kc), b.ptr(vc), B, pos, maxT, NH, NKV, hd))
	}
}
