package cpu

import (
	"cmp"
	"runtime"
	"slices"
	"sync"
	"unsafe"

	"github.com/gptui/gptui/kernels"
)

// The activations of bf16 mixed precision (kernels.ActivationMemory). The
// CPU keeps them in float32 and rounds to bfloat16 what each kernel stores
// into them (store), which is numerically the GPU's design of storing them
// in 16 bits: every value a kernel reads from them is a bfloat16.

// halfSpans are the address ranges of the buffers Activations returned
// under bf16, sorted by their start, each removed again when the garbage
// collector finds its buffer unreachable.
type halfSpans struct {
	mu    sync.RWMutex
	spans []halfSpan
}

type halfSpan struct{ lo, hi uintptr }

// Activations returns n zeroed activations: under Options.BF16 float32s
// that every kernel storing into them rounds to bfloat16; otherwise
// kernels.Float32s's.
func (b *Backend) Activations(n int) []float32 {
	x := kernels.Float32s(b, n)
	if !b.MarkActivations(x) || n == 0 {
		return x
	}
	// Once x is unreachable its span goes; a finalizer (not a cleanup)
	// keeps the memory from being reused until then, so no later
	// float32 buffer is ever taken for one of bfloat16s.
	runtime.SetFinalizer(&x[0], func(p *float32) { b.halves.remove(uintptr(unsafe.Pointer(p))) })
	return x
}

func (h *halfSpans) add(s halfSpan) {
	h.mu.Lock()
	defer h.mu.Unlock()
	i, _ := slices.BinarySearchFunc(h.spans, s.lo, func(s halfSpan, lo uintptr) int { return cmp.Compare(s.lo, lo) })
	h.spans = slices.Insert(h.spans, i, s)
}

func (h *halfSpans) remove(lo uintptr) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if i, ok := slices.BinarySearchFunc(h.spans, lo, func(s halfSpan, lo uintptr) int { return cmp.Compare(s.lo, lo) }); ok {
		h.spans = slices.Delete(h.spans, i, i+1)
	}
}

// holds reports whether x lies in a buffer of bfloat16 activations.
func (h *halfSpans) holds(x []float32) bool {
	if len(x) == 0 {
		return false
	}
	p := uintptr(unsafe.Pointer(&x[0]))
	h.mu.RLock()
	defer h.mu.RUnlock()
	i, ok := slices.BinarySearchFunc(h.spans, p, func(s halfSpan, lo uintptr) int { return cmp.Compare(s.lo, lo) })
	if !ok {
		i--
	}
	return i >= 0 && p < h.spans[i].hi
}

// store rounds to bfloat16 those of a kernel's outputs xs that are
// bfloat16 activations (a no-op outside bf16). Each kernel calls it on
// what it wrote, once it has written it.
func (b *Backend) store(xs ...[]float32) {
	if b.bf16 == nil {
		return
	}
	for _, x := range xs {
		if b.halves.holds(x) {
			b.ParallelFor(len(x), 1<<15, func(lo, hi int) { kernels.RoundBF16(x[lo:hi]) })
		}
	}
}

// isHalf reports whether x is bfloat16 activations, for fused kernels
// that read back what they stored.
func (b *Backend) isHalf(x []float32) bool { return b.bf16 != nil && b.halves.holds(x) }

// MarkActivations makes x, memory its caller allocated and keeps, bfloat16
// activations, as if Activations had returned it, until
// UnmarkActivations; it reports whether the backend rounds them (under
// Options.BF16). kernels/deferred runs the CPU's kernels on its own
// buffers and marks those of its Activations.
func (b *Backend) MarkActivations(x []float32) bool {
	if b.bf16 == nil {
		return false
	}
	if len(x) > 0 {
		lo := uintptr(unsafe.Pointer(&x[0]))
		b.halves.add(halfSpan{lo, lo + uintptr(4*len(x))})
	}
	return true
}

// UnmarkActivations ends what MarkActivations(x) began, before x's memory
// is given back.
func (b *Backend) UnmarkActivations(x []float32) {
	if len(x) > 0 {
		b.halves.remove(uintptr(unsafe.Pointer(&x[0])))
	}
}
