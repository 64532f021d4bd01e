package cuda

import (
	"fmt"
	"io"
	"math"
	"os"
	"strings"

	"github.com/gptui/gptui/kernels"
)

// Flash attention on tensor cores (kernels/flashattention.cu): causal
// grouped-query attention for head sizes 64 and 128 with FlashAttention-2's
// tiling, bf16 operands and fp32 accumulation, on sm_80 and later. Its
// forward pass writes out and lse exactly as GQAForward does (lse (B,NH,T),
// the log-sum-exp of each query row's scaled causal scores), so either
// backward pass takes either forward pass's output.
//
// The Backend uses it in place of attention.cu's fp32 kernels where its
// numerics are those of the rest of the step: the GEMMs multiply in bf16
// (Options.Precision, the GPU default), the head size is 64 or 128, a tile
// variant fits the device's shared memory ([Variants.Flash]) and dropout is
// off (the flash kernels draw no mask). Everywhere else, and with
// GPTUI_FLASH_ATTENTION=off in the environment, it keeps the fp32 kernels.

// flashHeadSizes are the head sizes the flash kernels exist for.
var flashHeadSizes = []int{64, 128}

// flashKernel is one flash kernel and its tile variants, largest first:
// Q query rows and K keys a block (the forward kernel's block has 2·Q
// threads, a warp per 16 rows; the backward kernel's 2·K, a warp per 16
// keys).
type flashKernel struct {
	kernel   string // flash_attn_forward_hs128, …
	hs       int
	backward bool
	tiles    []AttTile
}

// flashKernels lists the kernels as flashattention.cu stamps them out. The
// bytes of shared memory (FlashForwardShared, FlashBackwardShared):
//
//	forward  hs64  128×64:  55,296 (every device: 96 KiB and up; two stages)
//	forward  hs128 128×64:  69,632 (every device; one stage)
//	backward hs64   64×64:  65,536 (every device; two stages)
//	backward hs128  64×64:  79,360 (every device; one stage)
func flashKernels() []flashKernel {
	return []flashKernel{
		{"flash_attn_forward_hs64", 64, false, []AttTile{{128, 64}}},
		{"flash_attn_forward_hs128", 128, false, []AttTile{{128, 64}}},
		{"flash_attn_backward_hs64", 64, true, []AttTile{{64, 64}}},
		{"flash_attn_backward_hs128", 128, true, []AttTile{{64, 64}}},
	}
}

// flashFunction is the function name of kernel k on tile t.
func flashFunction(kernel string, t AttTile) string {
	return fmt.Sprintf("%s_q%dk%d", kernel, t.Q, t.K)
}

// flashKernelNames are the flash kernels' function names, every tile, and
// flash_attn_prep.
var flashKernelNames = func() []string {
	var names []string
	for _, k := range flashKernels() {
		for _, t := range k.tiles {
			names = append(names, flashFunction(k.kernel, t))
		}
	}
	return append(names, "flash_attn_prep")
}()

// FlashKernelNames returns the names of the flash-attention kernels.
func FlashKernelNames() []string { return append([]string(nil), flashKernelNames...) }

func flashRound(n int) int { return (n + 127) / 128 * 128 }

// FlashForwardShared is the dynamic shared memory, in bytes, of the flash
// forward kernel of head size hs on tile t (flashattention.cu's FaFwd):
// the q tile and a stage of k and v tiles in bf16 (rows of hs+8) — two
// stages (the next key tile copied in during the current one) where that
// fits 96 KiB, one elsewhere; the scores, probabilities and output stay in
// registers.
func FlashForwardShared(hs int, t AttTile) int {
	ldh := hs + 8
	q, kv := flashRound(t.Q*ldh*2), flashRound(t.K*ldh*2)
	if two := q + 4*kv; two <= 96*1024 {
		return two
	}
	return q + 2*kv
}

// FlashBackwardShared is the dynamic shared memory, in bytes, of the flash
// backward kernel of head size hs on tile t (flashattention.cu's FaBwd):
// k and v tiles in bf16 (rows of hs+8), dSᵀ in bf16 (a row of t.Q+8 per
// key), and a stage of q and dout tiles and a row each of lse and delta —
// two stages (the next query tile copied in during the current one) where
// that fits 96 KiB, one elsewhere.
func FlashBackwardShared(hs int, t AttTile) int {
	ldh, ldt := hs+8, t.Q+8
	kv, tt := flashRound(t.K*ldh*2), flashRound(t.K*ldt*2)
	stage := 2*flashRound(t.Q*ldh*2) + 2*flashRound(t.Q*4)
	if two := 2*kv + 2*stage + tt; two <= 96*1024 {
		return two
	}
	return 2*kv + stage + tt
}

// FlashChoice is the pair of flash kernels chosen for one head size.
type FlashChoice struct{ Forward, Backward KernelVariant }

// Flash returns the flash kernels for head size hs on v's device: for the
// forward and the backward kernel, the first tile, largest first, whose
// shared memory fits the device. ok is false where hs has no flash kernel
// or none fits. The choice is by shared memory alone: whether the device
// has bf16 tensor cores (sm_80) is the caller's to check.
func (v *Variants) Flash(hs int) (c FlashChoice, ok bool) {
	var fwd, bwd bool
	for _, k := range flashKernels() {
		if k.hs != hs {
			continue
		}
		for _, t := range k.tiles {
			n := FlashForwardShared(hs, t)
			if k.backward {
				n = FlashBackwardShared(hs, t)
			}
			if n > v.limit {
				continue
			}
			kv := KernelVariant{Kernel: k.kernel, Function: flashFunction(k.kernel, t), Tile: t, Shared: n}
			if k.backward {
				c.Backward, bwd = kv, true
			} else {
				c.Forward, fwd = kv, true
			}
			break
		}
	}
	return c, fwd && bwd
}

// FlashForwardGeometry is the forward kernel's launch: a block of 2·Q
// threads per (query head, batch row, query tile).
func FlashForwardGeometry(B, T, NH int, t AttTile) (grid, block Dim3) {
	return Dim3{uint32(NH), uint32(B), uint32((T + t.Q - 1) / t.Q)}, Dim3{uint32(2 * t.Q), 1, 1}
}

// FlashBackwardGeometry is the backward kernel's launch: a block of 2·K
// threads (a warp per 16 keys) per (key/value head, batch row, key tile).
func FlashBackwardGeometry(B, T, NKV int, t AttTile) (grid, block Dim3) {
	return Dim3{uint32(NKV), uint32(B), uint32((T + t.K - 1) / t.K)}, Dim3{uint32(2 * t.K), 1, 1}
}

// FlashPrepGeometry is flash_attn_prep's grid-stride launch: a warp
// per (position, head) of N positions and NH heads, 8 warps a block.
func FlashPrepGeometry(N, NH int) (grid, block Dim3) {
	n := (int64(N)*int64(NH) + 7) / 8
	return Dim3{uint32(min(max(n, 1), 8192)), 1, 1}, Dim3{256, 1, 1}
}

// FlashDeltaFloats is the scratch, in floats, FlashGQABackward takes:
// delta, one per query row and head.
func FlashDeltaFloats(B, NH, T int) int { return B * NH * T }

// flashCheck validates a flash launch's shape and returns the kernels.
func (k *Kernels) flashCheck(B, T, NH, NKV, hs int) (FlashChoice, error) {
	if err := attCheck(B, T, NH, NKV, hs); err != nil {
		return FlashChoice{}, err
	}
	c, ok := k.v.Flash(hs)
	if !ok {
		return c, fmt.Errorf("cuda: no flash attention kernel of head size %d fits %d bytes of shared memory", hs, k.v.limit)
	}
	if (T+c.Backward.Tile.Q-1)/c.Backward.Tile.Q > math.MaxUint16 || int64(B)*int64(T) > math.MaxInt32 {
		return c, fmt.Errorf("cuda: flash attention of B=%d T=%d is beyond the kernels' grid", B, T)
	}
	return c, nil
}

// FlashGQAForward is GQAForward on tensor cores, without dropout: qkv
// (B,T,(NH+2·NKV)·hs), out (B,T,NH·hs), lse (B,NH,T), for hs 64 or 128.
func (k *Kernels) FlashGQAForward(s Stream, out Buf, lse Ptr, qkv Buf, B, T, NH, NKV, hs int) error {
	c, err := k.flashCheck(B, T, NH, NKV, hs)
	if err != nil {
		return err
	}
	b, bf := bufs(out, qkv)
	grid, block := FlashForwardGeometry(B, T, NH, c.Forward.Tile)
	return k.launch(c.Forward.Function, grid, block, c.Forward.Shared, s,
		b[0], lse, b[1], int32(T), int32(NH), int32(NKV), attScale(hs), bf)
}

// FlashGQABackward is GQABackward on tensor cores, without dropout: dqkv
// (B,T,(NH+2·NKV)·hs), overwritten, from dout (B,T,NH·hs), the forward
// pass's out and lse (either forward kernel's) and qkv; delta is scratch
// of FlashDeltaFloats(B, NH, T) floats. Two kernels on s:
// flash_attn_prep (delta = rowsum(dout∘out), dq zeroed), then the
// tiled kernel, which adds dq with atomics (its last bits may differ from
// run to run) and writes dk and dv. dq accumulates in float32 as
// GQABackward's: in dqkv when it is float32, else in dq, (B·T, NH·hs)
// float32s, stored into dqkv rounded by a third kernel.
func (k *Kernels) FlashGQABackward(s Stream, dqkv, dout, out, qkv Buf, lse, delta, dq Ptr, B, T, NH, NKV, hs int) error {
	c, err := k.flashCheck(B, T, NH, NKV, hs)
	if err != nil {
		return err
	}
	b, bf := bufs(dqkv, dout, out, qkv)
	N, C, ld := B*T, NH*hs, (NH+2*NKV)*hs
	acc, accld := b[0], ld
	if bf&1 != 0 {
		if dq == 0 {
			return fmt.Errorf("cuda: FlashGQABackward into bfloat16 dqkv needs a float32 dq buffer")
		}
		acc, accld = dq, C
	}
	pg, pb := FlashPrepGeometry(N, NH)
	if err := k.launch("flash_attn_prep", pg, pb, 0, s,
		delta, acc, int64(accld), b[1], b[2], int32(N), int32(T), int32(NH), int32(NKV), int32(hs), bf>>1&3); err != nil {
		return err
	}
	grid, block := FlashBackwardGeometry(B, T, NKV, c.Backward.Tile)
	if err := k.launch(c.Backward.Function, grid, block, c.Backward.Shared, s,
		b[0], b[1], b[3], lse, delta, int32(T), int32(NH), int32(NKV), attScale(hs), acc, int64(accld), bf&3|bf>>1&4); err != nil {
		return err
	}
	if acc == b[0] {
		return nil
	}
	zg, zb := attZeroGeometry(N, C)
	return k.launch("attention_dq_store", zg, zb, 0, s, b[0], dq, int32(N), int32(C), int32(ld), bf&1)
}

// flashState is the Backend's use of the flash kernels, chosen at New.
type flashState struct {
	on     map[int]FlashChoice // by head size; empty: off
	delta  Ptr                 // FlashGQABackward's scratch
	deltaN int                 // floats it holds
}

// flashInit chooses the flash kernels for the device (see the comment at
// the top of this file), raises their shared-memory limits and logs the
// choice in one line.
func (b *Backend) flashInit(log io.Writer) error {
	b.flash.on = map[int]FlashChoice{}
	why := ""
	switch {
	case strings.EqualFold(os.Getenv("GPTUI_FLASH_ATTENTION"), "off"):
		why = "GPTUI_FLASH_ATTENTION=off"
	case b.prec != PrecisionBF16:
		why = fmt.Sprintf("the GEMMs multiply in %s, and flash attention rounds to bf16", b.prec)
	default:
		for _, hs := range flashHeadSizes {
			c, ok := b.variants.Flash(hs)
			if !ok {
				continue
			}
			for _, kv := range []KernelVariant{c.Forward, c.Backward} {
				if err := b.needShared(kv.Function, kv.Shared); err != nil {
					return err
				}
			}
			b.flash.on[hs] = c
		}
		if len(b.flash.on) == 0 {
			why = "no tile fits the device's shared memory"
		}
	}
	if log == nil {
		return nil
	}
	if why != "" {
		fmt.Fprintf(log, "cuda: flash attention off (%s): attention runs on the fp32 kernels\n", why)
		return nil
	}
	var parts []string
	for _, hs := range flashHeadSizes {
		if c, ok := b.flash.on[hs]; ok {
			parts = append(parts, fmt.Sprintf("hs %d (forward %s, %d B; backward %s, %d B)", hs, c.Forward.Tile, c.Forward.Shared, c.Backward.Tile, c.Backward.Shared))
		}
	}
	fmt.Fprintf(log, "cuda: flash attention on bf16 tensor cores for %s; other head sizes and dropout on the fp32 kernels\n", strings.Join(parts, ", "))
	return nil
}

// flashHS is the head size of multi-head attention over C channels, or 0.
func flashHS(C, NH int) int {
	if NH < 1 || C < 1 || C%NH != 0 {
		return 0
	}
	return C / NH
}

// flashUse returns the flash kernels to run attention of head size hs with
// dropout d on, if any.
func (b *Backend) flashUse(hs int, d kernels.Dropout) (FlashChoice, bool) {
	if d.P != 0 {
		return FlashChoice{}, false
	}
	c, ok := b.flash.on[hs]
	return c, ok
}

// flashForward runs the forward pass on the flash kernels and reports
// true, or reports false where they do not apply (the caller then runs the
// fp32 kernels).
func (b *Backend) flashForward(out, att, qkv []float32, B, T, NH, NKV, hs int, d kernels.Dropout) bool {
	if _, ok := b.flashUse(hs, d); !ok {
		return false
	}
	b.run("attention forward (flash)", b.k.FlashGQAForward(b.s, b.buf(out), b.ptr(att), b.buf(qkv), B, T, NH, NKV, hs))
	return true
}

// flashBackward is flashForward's backward pass, with the backend's delta
// scratch (grown as needed).
func (b *Backend) flashBackward(dqkv, dout, out, qkv, att []float32, B, T, NH, NKV, hs int, d kernels.Dropout) bool {
	if _, ok := b.flashUse(hs, d); !ok {
		return false
	}
	if n := FlashDeltaFloats(B, NH, T); b.flash.deltaN < n {
		if b.flash.delta != 0 {
			if err := b.dev.Sync(b.s); err != nil {
				b.run("attention backward (flash)", err)
				return true
			}
			if err := b.dev.Free(b.flash.delta); err != nil {
				b.run("attention backward (flash)", err)
				return true
			}
			b.flash.delta, b.flash.deltaN = 0, 0
		}
		p, err := b.dev.Alloc(4 * n)
		if err != nil {
			b.run("attention backward (flash)", fmt.Errorf("delta scratch of %d floats (%s): %w", n, memString(b.dev), err))
			return true
		}
		b.flash.delta, b.flash.deltaN = p, n
	}
	dq, err := b.dqFor(dqkv, B*T*NH*hs)
	if err == nil {
		err = b.k.FlashGQABackward(b.s, b.buf(dqkv), b.buf(dout), b.buf(out), b.buf(qkv), b.ptr(att), b.flash.delta, dq, B, T, NH, NKV, hs)
	}
	b.run("attention backward (flash)", err)
	return true
}
