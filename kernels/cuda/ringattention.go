package cuda

import (
	"fmt"
	"math"
)

// Ring attention for context parallelism (kernels/ringattention.cu): the
// kernels.Backend methods RingKV … RingKVGrad and the Kernels launching
// them. A rank r of cp ranks holds, of each of the B sequences, chunks r
// and 2·cp−1−r of c positions, in rows = 2·B·c rows laid out
// sequence-major (B,2c): row b·2c+half·c+t holds position chunk(half)·c+t
// of sequence b; see kernels.Backend for the layouts and the ring. All
// fp32 (as attention is, whatever the GEMM precision).

const (
	ringWarps = 8   // warps per block of the attention kernels (RA_WARPS)
	ringMaxHD = 256 // largest head size (RA_MAXHD)
)

// ringKernelNames are the kernels of this file's methods, in source order
// (in [KernelNames], so that a missing one fails at start-up).
var ringKernelNames = []string{"ring_kv", "ring_kv_grad", "ring_forward", "ring_finish", "ring_delta", "ring_backward_dq", "ring_backward_dkv"}

// RingKernelNames returns the names of the ring-attention kernels.
func RingKernelNames() []string { return append([]string(nil), ringKernelNames...) }

// RingAttentionGeometry is the launch shape of ring_forward and the
// backward kernels: a warp per row (query rows, or key rows for dk and dv)
// and head (NH query heads, or NKV key/value heads), ringWarps rows a
// block, grid (⌈rows/ringWarps⌉, heads).
func RingAttentionGeometry(rows, heads int) (grid, block Dim3) {
	return Dim3{uint32((rows + ringWarps - 1) / ringWarps), uint32(heads), 1}, Dim3{32 * ringWarps, 1, 1}
}

// ringHeads validates the per-row shape: NH query heads, NKV key/value
// heads of hd channels, rows rows.
func ringHeads(op string, rows, NH, NKV, hd int) error {
	switch {
	case rows < 0 || NH < 1 || NKV < 1 || hd < 1:
		return fmt.Errorf("cuda: %s of %d rows, NH=%d NKV=%d hd=%d: want rows ≥ 0 and every head count and size at least 1", op, rows, NH, NKV, hd)
	case NH%NKV != 0:
		return fmt.Errorf("cuda: %s: NH=%d query heads is not a multiple of NKV=%d key/value heads", op, NH, NKV)
	case hd > ringMaxHD:
		return fmt.Errorf("cuda: %s: head size %d: the kernels take at most %d", op, hd, ringMaxHD)
	case NH > math.MaxUint16 || int64(NH+2*NKV)*int64(hd) > math.MaxInt32:
		return fmt.Errorf("cuda: %s: NH=%d NKV=%d hd=%d is beyond the kernels' grid", op, NH, NKV, hd)
	}
	return checkSizes(op, rows, (NH+2*NKV)*hd)
}

// ringCheck validates the shape of a ring step: B sequences, chunks of c
// positions, cp ranks, query rank qr and key/value rank kr.
func ringCheck(op string, B, c, NH, NKV, hd, cp, qr, kr int) error {
	if B < 0 || c < 0 || cp < 1 || qr < 0 || qr >= cp || kr < 0 || kr >= cp {
		return fmt.Errorf("cuda: %s of B=%d c=%d, ranks %d and %d of cp=%d: want B, c ≥ 0 and ranks in 0 … cp−1", op, B, c, qr, kr, cp)
	}
	if int64(2*cp)*int64(c) > math.MaxInt32 || int64(2*B)*int64(c) > math.MaxInt32 {
		return fmt.Errorf("cuda: %s of B=%d c=%d cp=%d is beyond the kernels' positions", op, B, c, cp)
	}
	return ringHeads(op, 2*B*c, NH, NKV, hd)
}

// RingKV writes kv (rows, 2·NKV·hd) from the key and value heads of qkv
// (rows, (NH+2·NKV)·hd).
func (k *Kernels) RingKV(s Stream, kv Ptr, qkv Buf, rows, NH, NKV, hd int) error {
	if err := ringHeads("RingKV", rows, NH, NKV, hd); err != nil {
		return err
	}
	if rows == 0 {
		return nil
	}
	grid, block := ElementwiseGeometry(int64(rows) * int64(2*NKV*hd))
	b, bf := bufs(qkv)
	return k.launch("ring_kv", grid, block, 0, s, kv, b[0], int32(rows), int32(NH), int32(NKV), int32(hd), bf)
}

// RingKVGrad overwrites the key and value parts of dqkv (rows,
// (NH+2·NKV)·hd) with dkv (rows, 2·NKV·hd).
func (k *Kernels) RingKVGrad(s Stream, dqkv, dkv Ptr, rows, NH, NKV, hd int) error {
	if err := ringHeads("RingKVGrad", rows, NH, NKV, hd); err != nil {
		return err
	}
	if rows == 0 {
		return nil
	}
	grid, block := ElementwiseGeometry(int64(rows) * int64(2*NKV*hd))
	return k.launch("ring_kv_grad", grid, block, 0, s, dqkv, dkv, int32(rows), int32(NH), int32(NKV), int32(hd))
}

// RingAttentionForward folds the key/value block kv of rank kr into the
// online softmax of rank qr's queries (the query heads of qkv): out (rows,
// NH·hd) unnormalised, stats (rows, NH, 2) each row and head's running max
// m and sum l. first starts from out = 0, m = −∞, l = 0 without reading
// them. One launch of ring_forward, a warp per query row and head.
func (k *Kernels) RingAttentionForward(s Stream, out, stats Ptr, qkv Buf, kv Ptr, B, c, NH, NKV, hd, cp, qr, kr int, first bool) error {
	if err := ringCheck("RingAttentionForward", B, c, NH, NKV, hd, cp, qr, kr); err != nil {
		return err
	}
	if B*c == 0 {
		return nil
	}
	grid, block := RingAttentionGeometry(2*B*c, NH)
	b, bf := bufs(qkv)
	return k.launch("ring_forward", grid, block, 0, s, out, stats, b[0], kv,
		int32(B), int32(c), int32(NH), int32(NKV), int32(hd), int32(cp), int32(qr), int32(kr), attScale(hd), flag(first), bf)
}

// RingAttentionFinish divides out (rows, NH·hd) by l and writes lse (rows,
// NH) = m + ln l from stats (rows, NH, 2). A row that met no key (l = 0)
// gets zeros and lse = −∞.
func (k *Kernels) RingAttentionFinish(s Stream, out, lse, stats Ptr, rows, NH, hd int) error {
	if err := ringHeads("RingAttentionFinish", rows, NH, NH, hd); err != nil {
		return err
	}
	if rows == 0 {
		return nil
	}
	grid, block := ElementwiseGeometry(int64(rows) * int64(NH*hd))
	return k.launch("ring_finish", grid, block, 0, s, out, lse, stats, int32(rows), int32(NH), int32(hd))
}

// RingAttentionDelta writes delta (rows, NH) = Σ over each head's hd
// channels of dout·out, dout and out (rows, NH·hd): a warp per row and
// head.
func (k *Kernels) RingAttentionDelta(s Stream, delta Ptr, dout, out Buf, rows, NH, hd int) error {
	if err := ringHeads("RingAttentionDelta", rows, NH, NH, hd); err != nil {
		return err
	}
	if rows == 0 {
		return nil
	}
	n := int64(rows) * int64(NH)
	blocks := min((n+ringWarps-1)/ringWarps, ewMaxBlocks)
	b, bf := bufs(dout, out)
	return k.launch("ring_delta", Dim3{uint32(blocks), 1, 1}, Dim3{32 * ringWarps, 1, 1}, 0, s, delta, b[0], b[1], int32(rows), int32(NH), int32(hd), bf)
}

// RingAttentionBackward adds, for the key/value block kv of rank kr and rank
// qr's queries, the queries' gradient into the query heads of dqkv (its
// key and value parts untouched) and the block's key and value gradient
// into dkv (rows, 2·NKV·hd), from dout (rows, NH·hd), the finished lse and
// delta (rows, NH). Two launches, neither with atomics (the same bits on
// every run): ring_backward_dq, a warp per query row and head, and
// ring_backward_dkv, a warp per key row and key/value head that sums its
// group's query heads in head order. Both recompute the probabilities.
func (k *Kernels) RingAttentionBackward(s Stream, dqkv, dkv Ptr, dout, qkv Buf, kv, lse, delta Ptr, B, c, NH, NKV, hd, cp, qr, kr int) error {
	if err := ringCheck("RingAttentionBackward", B, c, NH, NKV, hd, cp, qr, kr); err != nil {
		return err
	}
	if B*c == 0 {
		return nil
	}
	b, bf := bufs(dout, qkv)
	args := []any{int32(B), int32(c), int32(NH), int32(NKV), int32(hd), int32(cp), int32(qr), int32(kr), attScale(hd), bf}
	grid, block := RingAttentionGeometry(2*B*c, NH)
	if err := k.launch("ring_backward_dq", grid, block, 0, s, append([]any{dqkv, b[0], b[1], kv, lse, delta}, args...)...); err != nil {
		return err
	}
	grid, block = RingAttentionGeometry(2*B*c, NKV)
	return k.launch("ring_backward_dkv", grid, block, 0, s, append([]any{dkv, b[0], b[1], kv, lse, delta}, args...)...)
}

// ---- kernels.Backend ----

// ringLens records an error naming op unless each buffer bufs[i] holds at
// least need[i] floats (the kernels cannot tell).
func (b *Backend) ringLens(op string, bufs [][]float32, need []int) bool {
	for i, x := range bufs {
		if len(x) < need[i] {
			b.run(op, fmt.Errorf("cuda: %s: argument %d holds %d floats, %d are needed", op, i+1, len(x), need[i]))
			return false
		}
	}
	return true
}

// RingKV writes kv from the key and value heads of qkv.
func (b *Backend) RingKV(kv, qkv []float32, rows, NH, NKV, hd int) {
	if b.ok() && b.ringLens("RingKV", [][]float32{kv, qkv}, []int{rows * 2 * NKV * hd, rows * (NH + 2*NKV) * hd}) {
		b.run("RingKV", b.k.RingKV(b.s, b.ptr(kv), b.buf(qkv), rows, NH, NKV, hd))
	}
}

// RingAttentionForward folds the key/value block of rank kr into rank
// qr's online softmax.
func (b *Backend) RingAttentionForward(out, stats, qkv, kv []float32, B, c, NH, NKV, hd, cp, qr, kr int, first bool) {
	rows := 2 * B * c
	if b.ok() && b.ringLens("RingAttentionForward", [][]float32{out, stats, qkv, kv},
		[]int{rows * NH * hd, rows * NH * 2, rows * (NH + 2*NKV) * hd, rows * 2 * NKV * hd}) {
		b.run("RingAttentionForward", b.k.RingAttentionForward(b.s, b.ptr(out), b.ptr(stats), b.buf(qkv), b.ptr(kv), B, c, NH, NKV, hd, cp, qr, kr, first))
	}
}

// RingAttentionFinish divides out by l and writes lse = m + ln l.
func (b *Backend) RingAttentionFinish(out, lse, stats []float32, rows, NH, hd int) {
	if b.ok() && b.ringLens("RingAttentionFinish", [][]float32{out, lse, stats}, []int{rows * NH * hd, rows * NH, rows * NH * 2}) {
		b.run("RingAttentionFinish", b.k.RingAttentionFinish(b.s, b.ptr(out), b.ptr(lse), b.ptr(stats), rows, NH, hd))
	}
}

// RingAttentionDelta writes delta = Σ over each head's channels of
// dout·out.
func (b *Backend) RingAttentionDelta(delta, dout, out []float32, rows, NH, hd int) {
	if b.ok() && b.ringLens("RingAttentionDelta", [][]float32{delta, dout, out}, []int{rows * NH, rows * NH * hd, rows * NH * hd}) {
		b.run("RingAttentionDelta", b.k.RingAttentionDelta(b.s, b.ptr(delta), b.buf(dout), b.buf(out), rows, NH, hd))
	}
}

// RingAttentionBackward adds the block's share of dq into dqkv and the
// queries' share of the block's dk and dv into dkv.
func (b *Backend) RingAttentionBackward(dqkv, dkv, dout, qkv, kv, lse, delta []float32, B, c, NH, NKV, hd, cp, qr, kr int) {
	rows := 2 * B * c
	ld, ldkv := (NH+2*NKV)*hd, 2*NKV*hd
	if b.ok() && b.ringLens("RingAttentionBackward", [][]float32{dqkv, dkv, dout, qkv, kv, lse, delta},
		[]int{rows * ld, rows * ldkv, rows * NH * hd, rows * ld, rows * ldkv, rows * NH, rows * NH}) {
		b.run("RingAttentionBackward", b.k.RingAttentionBackward(b.s, b.ptr(dqkv), b.ptr(dkv), b.buf(dout), b.buf(qkv), b.ptr(kv), b.ptr(lse), b.ptr(delta), B, c, NH, NKV, hd, cp, qr, kr))
	}
}

// RingKVGrad overwrites the key and value parts of dqkv with dkv.
func (b *Backend) RingKVGrad(dqkv, dkv []float32, rows, NH, NKV, hd int) {
	if b.ok() && b.ringLens("RingKVGrad", [][]float32{dqkv, dkv}, []int{rows * (NH + 2*NKV) * hd, rows * 2 * NKV * hd}) {
		b.run("RingKVGrad", b.k.RingKVGrad(b.s, b.ptr(dqkv), b.ptr(dkv), rows, NH, NKV, hd))
	}
}
