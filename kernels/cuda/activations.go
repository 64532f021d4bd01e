package cuda

// Activations in bfloat16 (kernels/activations.go): a kernel argument
// that may hold activations is a [Buf], either a [Ptr] to float32s or a
// [BF16Ptr] to bfloat16s; the kernel reads and stores each as its type
// says, computing in float32 (common.cuh's ldx and stx, the `bf` mask).
//
// The kernels that take Bufs, each checked under the emulator against
// kernels/cpu under bf16 (bf16_test.go, TestFlashAttentionBF16,
// TestRingAttention): the encoder, GELU, the residual add and scale,
// dropout, SwiGLU, RoPE, LayerNorm, RMSNorm and the fused residual norms,
// the classifier, attention (tiled, flash and decoding; dq summed in a
// float32 buffer and stored once), the ring attention kernels and the
// bias gradient.
//
// Still to take bfloat16 before the backend allocates it (today every
// argument the backend passes is a Ptr): the GEMMs' operands and outputs
// (cuBLAS with bf16 A and B, a bf16 output with its bias added in float32
// before the one rounding: cuBLASLt's bias epilogue, or a float32 product
// and a store kernel), Copy, Zero, Upload and Download of bfloat16
// buffers, and NCCL's operations on them (ncclBfloat16).

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
