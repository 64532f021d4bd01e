package cuda

import (
	"fmt"
	"math"
)

// The residual add fused with the norm that reads it (kernels/fused.cu,
// llm.c's fused_residual_forward): one launch in layernorm_forward's
// geometry, a warp per row, no shared memory.

// fusedKernelNames are the kernels of this file's methods, in source order.
var fusedKernelNames = []string{"residual_layernorm_forward", "residual_rmsnorm_forward"}

// ResidualLayerNormForward writes res (N,C) = x + y, then normalises it as
// LayerNormForward: out = (res − mean)·rstd·w + bias, keeping mean and
// rstd (N) unless they are 0. res may alias x or y; out, mean and rstd
// alias nothing. It equals ResidualForward then LayerNormForward.
func (k *Kernels) ResidualLayerNormForward(s Stream, res, out Buf, mean, rstd Ptr, x, y Buf, w, bias Ptr, N, C int) error {
	if err := checkSizes("ResidualLayerNormForward", N, C); err != nil {
		return err
	}
	if N == 0 || C == 0 {
		return nil
	}
	p, bf := bufs(res, out, x, y)
	vec := bf == 0 && C%4 == 0 && aligned(16, append(p, w, bias)...)
	grid, block := LayerNormForwardGeometry(N)
	return k.launch("residual_layernorm_forward", grid, block, 0, s, p[0], p[1], mean, rstd, p[2], p[3], w, bias, int32(N), int32(C), bf, flag(vec))
}

// ResidualRMSNormForward writes res (N,C) = x + y, then normalises it as
// RMSNormForward: out = res·rstd·w, rstd = 1/√(mean(res²) + eps), keeping
// rstd (N) unless it is 0. res may alias x or y; out and rstd alias
// nothing. It equals ResidualForward then RMSNormForward.
func (k *Kernels) ResidualRMSNormForward(s Stream, res, out Buf, rstd Ptr, x, y Buf, w Ptr, N, C int, eps float32) error {
	if err := checkSizes("ResidualRMSNormForward", N, C); err != nil {
		return err
	}
	if !(eps >= 0) || math.IsInf(float64(eps), 0) {
		return fmt.Errorf("cuda: ResidualRMSNormForward: eps %v: want a finite number ≥ 0", eps)
	}
	if N == 0 || C == 0 {
		return nil
	}
	p, bf := bufs(res, out, x, y)
	vec := bf == 0 && C%4 == 0 && aligned(16, append(p, w)...)
	grid, block := LayerNormForwardGeometry(N)
	return k.launch("residual_rmsnorm_forward", grid, block, 0, s, p[0], p[1], rstd, p[2], p[3], w, int32(N), int32(C), eps, bf, flag(vec))
}

// ResidualLayerNormForward adds two streams and normalises their sum.
func (b *Backend) ResidualLayerNormForward(res, out, mean, rstd, x, y, w, bias []float32, N, C int) {
	if b.ok() {
		b.run("ResidualLayerNormForward", b.k.ResidualLayerNormForward(b.s, b.buf(res), b.buf(out), b.ptr(mean), b.ptr(rstd), b.buf(x), b.buf(y), b.ptr(w), b.ptr(bias), N, C))
	}
}

// ResidualRMSNormForward adds two streams and normalises their sum by its
// root mean square.
func (b *Backend) ResidualRMSNormForward(res, out, rstd, x, y, w []float32, N, C int, eps float32) {
	if b.ok() {
		b.run("ResidualRMSNormForward", b.k.ResidualRMSNormForward(b.s, b.buf(res), b.buf(out), b.ptr(rstd), b.buf(x), b.buf(y), b.ptr(w), N, C, eps))
	}
}
