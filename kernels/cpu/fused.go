package cpu

import "github.com/gptui/gptui/kernels"

// The residual add fused with the norm that reads it (llm.c's
// fused_residual_forward): each row's sum is normalised while it is still
// in cache, in one pass over the rows instead of two. Every operation is
// ResidualForward's, then LayerNormForward's or RMSNormForward's, in their
// order, so the results are theirs bit for bit — under bf16 too, where the
// norm reads the sum as ResidualForward stores it, rounded to bfloat16
// when res is activations.

// ResidualLayerNormForward adds two streams and normalises their sum, row
// by row.
//
//	res  (N,C) = x + y                              (ResidualForward)
//	out  (N,C) = (res - mean) · rstd · w + bias     (LayerNormForward of res)
//	mean (N), rstd (N): kept for the backward pass
//
// res may alias x or y; out, mean and rstd alias nothing.
func (b *Backend) ResidualLayerNormForward(res, out, mean, rstd, x, y, w, bias []float32, N, C int) {
	defer b.store(out)
	half := b.isHalf(res)
	b.ParallelFor(N, 8, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			rr := addRow(res, x, y, r, C, half)
			mean[r], rstd[r] = layerNormRow(out[r*C:(r+1)*C], rr, w, bias)
		}
	})
}

// ResidualRMSNormForward adds two streams and normalises their sum by its
// root mean square, row by row.
//
//	res  (N,C) = x + y                                   (ResidualForward)
//	rstd (N)   = 1/√(mean(res²) + eps), summed in float64; kept for backward
//	out  (N,C) = res · rstd · w                          (RMSNormForward of res)
//
// res may alias x or y; out and rstd alias nothing.
func (b *Backend) ResidualRMSNormForward(res, out, rstd, x, y, w []float32, N, C int, eps float32) {
	defer b.store(out)
	half := b.isHalf(res)
	b.ParallelFor(N, 8, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			rstd[r] = rmsNormRow(out[r*C:(r+1)*C], addRow(res, x, y, r, C, half), w, eps)
		}
	})
}

// addRow writes row r of res = x + y (rows of C), rounded to bfloat16 when
// half, and returns it.
func addRow(res, x, y []float32, r, C int, half bool) []float32 {
	rr, xr, yr := res[r*C:(r+1)*C], x[r*C:(r+1)*C], y[r*C:(r+1)*C]
	for i := range rr {
		rr[i] = xr[i] + yr[i]
	}
	if half {
		kernels.RoundBF16(rr)
	}
	return rr
}
