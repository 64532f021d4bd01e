package cuda

import (
	"fmt"
	"math"
)

// Attention kernels (kernels/attention.cu). The forward and backward kernels
// come in one instantiation per common head size, named by the suffix
// attHeadSizes gives, and a generic one ("any") for other head sizes up to
// attMaxHS; some in smaller tile variants too (variants.go), of which
// Kernels launches the one its Variants chose.
const (
	attTile    = 64  // query rows and keys per tile
	attThreads = 256 // threads per block of the tiled kernels
	attMaxHS   = 128 // largest head size of the generic kernels

	attDecodeThreads = 256 // 8 warps
	attDecodeMaxHS   = 256 // largest head size of attention_decode
)

// attHeadSizes are the head sizes with a kernel of their own.
var attHeadSizes = []int{32, 64, 80, 128}

// attentionKernelNames are the attention kernels' names, for the name table.
func attentionKernelNames() []string {
	var names []string
	for _, s := range append(attSuffixes(), "any") {
		names = append(names, "attention_forward_"+s, "attention_backward_"+s)
	}
	names = append(names, attVariantNames()...)
	return append(names, "attention_zero_dq", "attention_dq_store", "attention_decode")
}

func attSuffixes() []string {
	s := make([]string, len(attHeadSizes))
	for i, hs := range attHeadSizes {
		s[i] = fmt.Sprintf("hs%d", hs)
	}
	return s
}

// attSuffix is the name suffix of the forward and backward kernels for head
// size hs.
func attSuffix(hs int) string {
	for _, n := range attHeadSizes {
		if n == hs {
			return fmt.Sprintf("hs%d", hs)
		}
	}
	return "any"
}

// attLD is the padded row stride, in floats, of the kernels' shared tiles of
// head size hs (attention.cu's att_ld): rows of an odd number of float4s
// when the kernel reads them as float4, else an odd number of floats.
func attLD(hs int) int {
	if attSuffix(hs) != "any" {
		return 4 * ((hs / 4) | 1)
	}
	return hs | 1
}

// AttentionForwardShared is the dynamic shared memory, in bytes, of the
// 64×64 forward kernel for head size hs: q, k and v tiles and a tile of
// probabilities. Above 48 KiB (hs ≥ 64) the kernel's function needs its
// limit raised (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) before the
// first launch. [AttTile.ForwardShared] gives the other tiles'.
func AttentionForwardShared(hs int) int { return attDefaultTile.ForwardShared(hs) }

// AttentionBackwardShared is the dynamic shared memory, in bytes, of the
// 64×64 backward kernel for head size hs: k, v, q and dout tiles and two
// tiles of probabilities and their gradients (over 48 KiB for every hs ≥
// 16). [AttTile.BackwardShared] gives the other tiles'.
func AttentionBackwardShared(hs int) int { return attDefaultTile.BackwardShared(hs) }

// AttentionSharedNeeds maps each 64×64 attention kernel that needs more
// than the default 48 KiB of dynamic shared memory to the most it asks for:
// [DefaultVariants]'s [Variants.SharedNeeds].
func AttentionSharedNeeds() map[string]int { return DefaultVariants().SharedNeeds() }

// attCheck validates the shape arguments common to the attention kernels
// (B, T, NH query heads, NKV key/value heads of hs channels).
func attCheck(B, T, NH, NKV, hs int) error {
	switch {
	case B < 1 || T < 1 || NH < 1 || NKV < 1 || hs < 1:
		return fmt.Errorf("cuda: attention of B=%d T=%d NH=%d NKV=%d hs=%d: every size must be at least 1", B, T, NH, NKV, hs)
	case NH%NKV != 0:
		return fmt.Errorf("cuda: attention: NH=%d query heads is not a multiple of NKV=%d key/value heads", NH, NKV)
	case B > math.MaxUint16 || NH > math.MaxUint16 || (T+attTile-1)/attTile > math.MaxUint16 || T > math.MaxInt32/4 ||
		int64(NH+2*NKV)*int64(hs) > math.MaxInt32/4:
		return fmt.Errorf("cuda: attention of B=%d T=%d NH=%d NKV=%d hs=%d is beyond the kernels' grid", B, T, NH, NKV, hs)
	}
	return nil
}

// mhaHeads returns the head size of multi-head attention over C channels.
func mhaHeads(C, NH int) (int, error) {
	if NH < 1 || C < 1 || C%NH != 0 {
		return 0, fmt.Errorf("cuda: attention: C=%d is not a multiple of NH=%d (both at least 1)", C, NH)
	}
	return C / NH, nil
}

// attDropout returns the dropout arguments the kernels take: p, the scale
// 1/(1−p) of kept elements as kernels/cpu computes it, and the head
// placement (total heads Hg, first head h0) of the stream index.
func attDropout(p float32, NH, heads, head0 int) (float32, float32, int32, int32, error) {
	if !(p >= 0 && p < 1) {
		return 0, 0, 0, 0, fmt.Errorf("cuda: attention dropout %v: want 0 ≤ p < 1", p)
	}
	if heads == 0 {
		heads, head0 = NH, 0
	}
	if head0 < 0 || head0+NH > heads {
		return 0, 0, 0, 0, fmt.Errorf("cuda: attention heads %d…%d of %d: out of range", head0, head0+NH-1, heads)
	}
	return p, 1 / (1 - p), int32(heads), int32(head0), nil
}

// attScale is kernels/cpu's 1/√hs.
func attScale(hs int) float32 { return float32(1 / math.Sqrt(float64(hs))) }

// AttentionGeometry is the launch shape of the forward and backward
// kernels: one block of 256 threads per (head, batch row, tile of rows
// positions), the tile slowest so the blocks with the most work start
// first. The forward kernel has a block per query head (heads = NH) and
// query tile (rows = the tile's Q), the backward kernel one per key/value
// head (heads = NKV), which walks its group's query heads, and key tile
// (rows = the tile's K).
func AttentionGeometry(B, T, heads, rows int) (grid, block Dim3) {
	nt := (T + rows - 1) / rows
	return Dim3{uint32(heads), uint32(B), uint32(nt)}, Dim3{attThreads, 1, 1}
}

// attVariant returns the variant k launches for kernel name and checks
// that its grid of rows-position tiles over T fits.
func (k *Kernels) attVariant(name string, T int, backward bool) (KernelVariant, error) {
	kv, ok := k.v.Kernel(name)
	if !ok {
		return KernelVariant{}, fmt.Errorf("cuda: no variant of %s", name)
	}
	rows := kv.Tile.Q
	if backward {
		rows = kv.Tile.K
	}
	if (T+rows-1)/rows > math.MaxUint16 {
		return KernelVariant{}, fmt.Errorf("cuda: attention of T=%d is beyond %s's grid of %d-row tiles", T, kv.Function, rows)
	}
	return kv, nil
}

// AttentionForward is causal multi-head self-attention on packed q, k, v
// (kernels/cpu's AttentionForward, with lse in place of att): GQAForward
// with NKV = NH and hs = C/NH.
//
//	qkv (B,T,3C), out (B,T,C) as kernels/cpu
//	lse (B,NH,T): each row's log Σ exp of its scaled causal scores
func (k *Kernels) AttentionForward(s Stream, out Buf, lse Ptr, qkv Buf, B, T, C, NH int, p float32, key uint64, heads, head0 int, off uint64) error {
	hs, err := mhaHeads(C, NH)
	if err != nil {
		return err
	}
	return k.GQAForward(s, out, lse, qkv, B, T, NH, NH, hs, p, key, heads, head0, off)
}

// AttentionBackward is GQABackward with NKV = NH and hs = C/NH: dqkv
// (B,T,3C), overwritten, from dout (B,T,C), the forward pass's out and lse
// and the packed qkv; dq as GQABackward's.
func (k *Kernels) AttentionBackward(s Stream, dqkv, dout, out, qkv Buf, lse, dq Ptr, B, T, C, NH int, p float32, key uint64, heads, head0 int, off uint64) error {
	hs, err := mhaHeads(C, NH)
	if err != nil {
		return err
	}
	return k.GQABackward(s, dqkv, dout, out, qkv, lse, dq, B, T, NH, NH, hs, p, key, heads, head0, off)
}

// AttentionDecode is GQADecode with NKV = NH: q (B,C), kc and vc
// (B,maxT,C), out (B,C).
func (k *Kernels) AttentionDecode(s Stream, out, q Buf, kc, vc Ptr, B, pos, maxT, C, NH int) error {
	hs, err := mhaHeads(C, NH)
	if err != nil {
		return err
	}
	return k.GQADecode(s, out, q, kc, vc, B, pos, maxT, NH, NH, hs)
}

// GQAForward is causal grouped-query self-attention without the T×T matrix
// (kernels/cpu's GQAForward, with lse in place of att):
//
//	qkv (B,T,(NH+2·NKV)·hs): NH query heads, NKV key heads, NKV value heads;
//	                         query head h reads key/value head h/(NH/NKV)
//	out (B,T,NH·hs)
//	lse (B,NH,T): each row's log Σ exp of its scaled causal scores
//
// Dropout with probability p under site key draws kernels/cpu's mask: off is
// the stream index of the whole (B,heads,T,T) tensor's first element, of
// whose query heads this call holds head0 … head0+NH−1 (heads = 0: all NH).
func (k *Kernels) GQAForward(s Stream, out Buf, lse Ptr, qkv Buf, B, T, NH, NKV, hs int, p float32, key uint64, heads, head0 int, off uint64) error {
	if err := attCheck(B, T, NH, NKV, hs); err != nil {
		return err
	}
	if hs > attMaxHS {
		return fmt.Errorf("cuda: attention head size %d: the kernels take at most %d", hs, attMaxHS)
	}
	p, ps, hg, h0, err := attDropout(p, NH, heads, head0)
	if err != nil {
		return err
	}
	kv, err := k.attVariant("attention_forward_"+attSuffix(hs), T, false)
	if err != nil {
		return err
	}
	b, bf := bufs(out, qkv)
	grid, block := AttentionGeometry(B, T, NH, kv.Tile.Q)
	return k.launch(kv.Function, grid, block, kv.Tile.ForwardShared(hs), s,
		b[0], lse, b[1], int32(T), int32(NH), int32(NKV), int32(hs), attScale(hs), p, ps, key, hg, h0, off, bf)
}

// GQABackward computes dqkv (B,T,(NH+2·NKV)·hs), overwritten, the gradients
// of the query, key and value heads, from dout (B,T,NH·hs), the forward
// pass's out and lse and the packed qkv, with the forward pass's dropout
// (same p, key, heads, head0, off). It runs two kernels on s: one zeroing
// dq, then the tiled kernel, a block per key/value head and key tile, that
// accumulates dq with atomics (so dq's last bits may differ from run to run)
// and writes dk and dv, each summed over its group's query heads in a fixed
// order. dq accumulates in float32: in dqkv's query heads when dqkv is
// float32 (dq unused), else in dq, (B·T, NH·hs) float32s, which a third
// kernel then stores into dqkv rounded (the CPU rounds dq once, too).
func (k *Kernels) GQABackward(s Stream, dqkv, dout, out, qkv Buf, lse, dq Ptr, B, T, NH, NKV, hs int, p float32, key uint64, heads, head0 int, off uint64) error {
	if err := attCheck(B, T, NH, NKV, hs); err != nil {
		return err
	}
	if hs > attMaxHS {
		return fmt.Errorf("cuda: attention head size %d: the kernels take at most %d", hs, attMaxHS)
	}
	p, ps, hg, h0, err := attDropout(p, NH, heads, head0)
	if err != nil {
		return err
	}
	kv, err := k.attVariant("attention_backward_"+attSuffix(hs), T, true)
	if err != nil {
		return err
	}
	b, bf := bufs(dqkv, dout, out, qkv)
	N, C, ld := B*T, NH*hs, (NH+2*NKV)*hs
	acc, accld := b[0], ld // dq in dqkv's query heads
	if bf&1 != 0 {
		if dq == 0 {
			return fmt.Errorf("cuda: GQABackward into bfloat16 dqkv needs a float32 dq buffer")
		}
		acc, accld = dq, C
	}
	zg, zb := attZeroGeometry(N, C)
	if err := k.launch("attention_zero_dq", zg, zb, 0, s, acc, int32(N), int32(C), int32(accld)); err != nil {
		return err
	}
	grid, block := AttentionGeometry(B, T, NKV, kv.Tile.K)
	if err := k.launch(kv.Function, grid, block, kv.Tile.BackwardShared(hs), s,
		b[0], b[1], b[2], b[3], lse, int32(T), int32(NH), int32(NKV), int32(hs), attScale(hs), p, ps, key, hg, h0, off, acc, int64(accld), bf); err != nil {
		return err
	}
	if acc == b[0] {
		return nil
	}
	return k.launch("attention_dq_store", zg, zb, 0, s, b[0], dq, int32(N), int32(C), int32(ld), bf&1)
}

// attZeroGeometry is attention_zero_dq's grid-stride launch over N rows of C.
func attZeroGeometry(N, C int) (grid, block Dim3) {
	const threads = 256
	n := (N*C + threads - 1) / threads
	if n > 8192 {
		n = 8192
	}
	return Dim3{uint32(n), 1, 1}, Dim3{threads, 1, 1}
}

// GQADecode is grouped-query attention for one new position per sequence
// against a key/value cache (kernels/cpu's GQADecode): q (B,NH·hs) at
// position pos, kc and vc (B,maxT,NKV·hs) filled for rows 0 … pos, out
// (B,NH·hs). One block of 8 warps per (query head, batch row).
func (k *Kernels) GQADecode(s Stream, out, q Buf, kc, vc Ptr, B, pos, maxT, NH, NKV, hs int) error {
	if err := attCheck(B, maxT, NH, NKV, hs); err != nil {
		return err
	}
	if hs > attDecodeMaxHS {
		return fmt.Errorf("cuda: attention decode head size %d: the kernel takes at most %d", hs, attDecodeMaxHS)
	}
	if pos < 0 || pos >= maxT {
		return fmt.Errorf("cuda: attention decode at position %d of a %d-row cache", pos, maxT)
	}
	b, bf := bufs(out, q)
	return k.launch("attention_decode", Dim3{uint32(NH), uint32(B), 1}, Dim3{attDecodeThreads, 1, 1}, 0, s,
		b[0], b[1], kc, vc, int32(pos), int32(maxT), int32(NH), int32(NKV), int32(hs), attScale(hs), bf)
}
