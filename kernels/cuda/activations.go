package cuda

import (
	"cmp"
	"errors"
	"slices"
	"unsafe"

	"github.com/gptui/gptui/half"
)

// Activations in bfloat16 (kernels/activations.go). Under bf16 the
// backend stores activations in 16 bits: [Backend.Activations] hands out
// the addresses of n float32s, which the engine indexes and slices as
// float32s, from a reserved range (reserve.go, halfArena) whose memory
// holds n bfloat16s at half their offset: the element the engine
// addresses at base+o is at base+o/2. The backend translates the
// addresses it is given (span.addr): a kernel argument that may hold activations is a [Buf], a
// [Ptr] to float32s or a [BF16Ptr] to bfloat16s, and the kernel reads and
// stores each as its type says, computing in float32 (common.cuh's ldx
// and stx, the `bf` mask). An argument that takes only float32s panics on
// bfloat16 activations (a bug in the engine).
//
// The kernels that take Bufs, each checked under the emulator against
// kernels/cpu under bf16 (bf16_test.go, TestFlashAttentionBF16,
// TestRingAttention): the encoder, GELU, the residual add and scale,
// dropout, SwiGLU, RoPE, LayerNorm, RMSNorm and the fused residual norms,
// the classifier, attention (tiled, flash and decoding; dq summed in a
// float32 buffer and stored once), the ring attention kernels, the bias
// gradient, BiasStore and BiasGeluStore. The GEMMs read bfloat16 activations as cuBLAS's
// bf16 operands (no cast) and store into them (C in bf16, cuBLAS's float32
// sum rounded once); with a bias, read as a bfloat16 (as kernels/cpu
// reads it), cuBLASLt's bias epilogue adds it to the float32 sum before
// the one rounding — or, where cuBLASLt has no algorithm for that, the
// product goes to float32 scratch and BiasStore adds the rounded bias and
// rounds once (Backend.matmulBiasHalf). GPT-2's fc takes its GELU in
// cuBLASLt's GELU_AUX_BIAS epilogue (GELU of the float32 sum; the sum
// kept for the backward pass), fcproj's input gradient GELU's backward in
// the DGELU epilogue (the float32 product times the derivative at the
// kept sum), each rounded once (Backend.MatmulGeluForward,
// MatmulBackwardGelu); where cuBLASLt refuses them, BiasGeluStore and
// GeluBackward do the same from the float32 product in scratch. Copy,
// Zero, Upload and Download convert where one side is bfloat16 (Upload
// rounds on the host to nearest even, as the kernels do).
//
// NCCL moves bfloat16 activations as ncclBfloat16 (the pipeline's sends,
// sequence parallelism's gathers) at the address Half gives
// (nccl.Options.Halves); sums across ranks stay float32, but for the
// gradients' bfloat16 copy that Engine.mix_precision.reduce_dtype bf16
// all-reduces (comm's AllReduceBF16Async).
//
// The weights are float32 (the master weights): the GEMMs read them from
// the bfloat16 copy CopyWeights makes for a step (kernels/weights.go), or
// rounded into scratch where there is none (sharding stage 3's gather
// buffers, generation).

// halfArena is a reservation that bfloat16 activations are carved from,
// one after another: the buffer the engine addresses at Base+o (o bytes of
// float32s in) has its bfloat16s at Base+o/2, so that one span (and one
// translation) covers them all, and memory is mapped as the buffers come,
// to the granularity once per arena rather than per buffer.
type halfArena struct {
	r    *Reservation
	used int // bytes of float32 addresses handed out
	live int // buffers not freed
}

// halfArenaSpan is the addresses an arena reserves, unless a buffer needs
// more: 256 GiB, for 64 Gi activations in 128 GiB of memory.
const halfArenaSpan = 1 << 38

// Activations returns n zeroed activations (kernels.ActivationMemory):
// bfloat16s under bf16, addressed as n float32s (see above), float32s in
// the other precisions.
func (b *Backend) Activations(n int) []float32 {
	if b.prec != PrecisionBF16 || n == 0 {
		return b.Float32s(n)
	}
	if !b.ok() {
		panic(&AllocError{Bytes: 2 * n, Mem: memString(b.dev), Err: b.Err()})
	}
	p, err := b.carve(n)
	if err != nil {
		panic(&AllocError{Bytes: 2 * n, Mem: memString(b.dev), Err: err}) // as alloc's
	}
	return unsafe.Slice((*float32)(ptrOf(p)), n)
}

// ActivationBytes is the memory each activation takes (see
// kernels.ActivationBytes): 2 under bf16, else 4.
func (b *Backend) ActivationBytes() int {
	if b.prec == PrecisionBF16 {
		return 2
	}
	return 4
}

// carve returns the address (as the engine sees it) of n zeroed
// activations from the current arena, or a new one.
func (b *Backend) carve(n int) (Ptr, error) {
	// 512 bytes of float32 addresses: each buffer's bfloat16s start
	// 256-byte aligned, as cuMemAlloc's memory does.
	need := int(roundUp(uint64(4*n), 512))
	a := b.arena
	if a == nil || a.used+need > a.r.Span {
		r, err := b.dev.Reserve(max(need, halfArenaSpan))
		if err != nil {
			return 0, err
		}
		a = &halfArena{r: r}
		b.mu.Lock()
		b.arena = a
		b.addSpan(span{lo: uintptr(r.Base), hi: uintptr(r.Base), half: true})
		b.mu.Unlock()
	}
	off := a.used
	if err := b.dev.Back(a.r, (off+need)/2, 0); err != nil {
		return 0, err
	}
	base := uintptr(a.r.Base)
	if err := b.dev.Memset(Ptr(base+uintptr(off/2)), 2*n, b.s); err != nil {
		return 0, err
	}
	a.used += need
	a.live++
	p := base + uintptr(off)
	b.mu.Lock()
	b.halves[p] = a
	b.setSpanEnd(base, base+uintptr(a.used))
	b.mu.Unlock()
	return Ptr(p), nil
}

// freeHalf gives back one buffer of arena a: an arena with no buffers
// left is given back whole, or, the current one, reused from its start.
func (b *Backend) freeHalf(a *halfArena) error {
	b.mu.Lock()
	a.live--
	empty := a.live == 0
	base := uintptr(a.r.Base)
	current := a == b.arena
	if empty {
		a.used = 0
		b.setSpanEnd(base, base)
		if !current {
			b.dropSpan(base)
		}
	}
	b.mu.Unlock()
	if !empty || current {
		return nil
	}
	// Kernels queued on the stream may still use it.
	return errors.Join(b.dev.Sync(b.s), b.dev.Unreserve(a.r))
}

// setSpanEnd sets the end of the span starting at lo (under mu).
func (b *Backend) setSpanEnd(lo, hi uintptr) {
	if i, ok := slices.BinarySearchFunc(b.spans, lo, func(s span, x uintptr) int { return cmp.Compare(s.lo, x) }); ok {
		b.spans[i].hi = hi
	}
}

// dropSpan removes the span starting at lo (under mu).
func (b *Backend) dropSpan(lo uintptr) {
	if i, ok := slices.BinarySearchFunc(b.spans, lo, func(s span, x uintptr) int { return cmp.Compare(s.lo, x) }); ok {
		b.spans = slices.Delete(b.spans, i, i+1)
	}
}

// Half reports whether the bytes at p, as the engine addresses them, are
// bfloat16 activations of the backend's, and if so the address of their
// bfloat16s: the translation the NCCL fabric applies to its buffers
// (nccl.Options.Halves).
func (b *Backend) Half(p unsafe.Pointer, bytes int) (Ptr, bool) {
	u := uintptr(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	i, found := slices.BinarySearchFunc(b.spans, u, func(s span, x uintptr) int { return cmp.Compare(s.lo, x) })
	if !found {
		i--
	}
	if i < 0 || i >= len(b.spans) {
		return 0, false
	}
	s := b.spans[i]
	if !s.half || u < s.lo || u+uintptr(bytes) > s.hi {
		return 0, false
	}
	return s.addr(u), true
}

// halfBits returns x rounded to bfloat16, to nearest even.
func halfBits(x []float32) []uint16 {
	h := make([]uint16, len(x))
	for i, v := range x {
		h[i] = half.F32ToBF16(v)
	}
	return h
}

// widenBits writes the bfloat16s h into x as float32s.
func widenBits(x []float32, h []uint16) {
	for i, v := range h {
		x[i] = half.BF16ToF32(v)
	}
}

// Buf is a kernel's argument that may hold activations: a [Ptr] (float32)
// or a [BF16Ptr].
type Buf interface {
	buf() (p Ptr, bf16 bool)
}

func (p Ptr) buf() (Ptr, bool) { return p, false }

// BF16Ptr is the device address of bfloat16 activations.
type BF16Ptr Ptr

func (p BF16Ptr) buf() (Ptr, bool) { return Ptr(p), true }

// bufs returns the addresses of xs, a nil Buf as 0, and the kernel's bf
// mask: bit k set when xs[k] is bfloat16.
func bufs(xs ...Buf) ([]Ptr, int32) {
	ps := make([]Ptr, len(xs))
	var mask int32
	for k, x := range xs {
		if x == nil {
			continue
		}
		p, bf := x.buf()
		ps[k] = p
		if bf {
			mask |= 1 << k
		}
	}
	return ps, mask
}
