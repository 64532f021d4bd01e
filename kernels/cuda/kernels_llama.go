package cuda

import (
	"fmt"
	"math"
)

// The Llama family's kernels (kernels/rmsnorm.cu, rope.cu, swiglu.cu);
// grouped-query attention is in kernels_attention.go.

// llamaKernelNames are the kernels of this file's methods, in source order.
var llamaKernelNames = []string{"rmsnorm_forward", "rmsnorm_backward", "rope", "swiglu_forward", "swiglu_backward"}

// RMSNormBackwardShared is rmsnorm_backward's dynamic shared memory for C
// channels: the block's dw partial sums. Above 48 KiB (C > 12288) the
// backend must raise the function's limit before launching it.
func RMSNormBackwardShared(C int) int { return C * 4 }

// RMSNormForward normalises N rows of C: out = inp·rstd·w, rstd = 1/√(mean
// (inp²) + eps), keeping rstd (N) unless it is 0. It launches
// layernorm_forward's geometry, a warp per row.
func (k *Kernels) RMSNormForward(s Stream, out Buf, rstd Ptr, inp Buf, w Ptr, N, C int, eps float32) error {
	if err := checkSizes("RMSNormForward", N, C); err != nil {
		return err
	}
	if !(eps >= 0) || math.IsInf(float64(eps), 0) {
		return fmt.Errorf("cuda: RMSNormForward: eps %v: want a finite number ≥ 0", eps)
	}
	if N == 0 || C == 0 {
		return nil
	}
	p, bf := bufs(out, inp)
	vec := bf == 0 && C%4 == 0 && aligned(16, p[0], p[1], w)
	grid, block := LayerNormForwardGeometry(N)
	return k.launch("rmsnorm_forward", grid, block, 0, s, p[0], rstd, p[1], w, int32(N), int32(C), eps, bf, flag(vec))
}

// RMSNormBackward accumulates dinp (N,C) and dw (C) as kernels/cpu, in
// layernorm_backward's geometry. The dw sums take atomics: their last bits
// may differ from run to run. It needs RMSNormBackwardShared(C) bytes of
// dynamic shared memory, whose limit the backend raises above 48 KiB.
func (k *Kernels) RMSNormBackward(s Stream, dinp Buf, dw Ptr, dout, inp Buf, w, rstd Ptr, N, C int) error {
	if err := checkSizes("RMSNormBackward", N, C); err != nil {
		return err
	}
	if N == 0 || C == 0 {
		return nil
	}
	grid, block, _ := LayerNormBackwardGeometry(N, C)
	p, bf := bufs(dinp, dout, inp)
	return k.launch("rmsnorm_backward", grid, block, RMSNormBackwardShared(C), s, p[0], dw, p[1], p[2], w, rstd, int32(N), int32(C), bf)
}

// RoPEForward rotates the first heads·hd channels of each of the B·T rows
// of C of inp into out, by the angles of table (maxT,hd) at positions
// pos0 … pos0+T−1 (kernels/cpu's RoPEForward), and copies the other
// channels unless out is inp. The table must hold pos0+T rows.
func (k *Kernels) RoPEForward(s Stream, out, inp Buf, table Ptr, B, T, C, heads, hd, pos0 int) error {
	return k.rope("RoPEForward", s, out, inp, table, B, T, C, heads, hd, pos0, 1)
}

// RoPEBackward is RoPEForward's inverse rotation on the gradient: dinp from
// dout (dinp may be dout).
func (k *Kernels) RoPEBackward(s Stream, dinp, dout Buf, table Ptr, B, T, C, heads, hd, pos0 int) error {
	return k.rope("RoPEBackward", s, dinp, dout, table, B, T, C, heads, hd, pos0, -1)
}

func (k *Kernels) rope(op string, s Stream, out, inp Buf, table Ptr, B, T, C, heads, hd, pos0 int, sign float32) error {
	if err := checkSizes(op, B, T, C); err != nil {
		return err
	}
	if err := checkSizes(op, heads, hd); err != nil {
		return err
	}
	if pos0 < 0 || pos0 > math.MaxInt32-T {
		return fmt.Errorf("cuda: %s: first position %d out of range (0 to %d)", op, pos0, math.MaxInt32-T)
	}
	if hd < 2 || hd%2 != 0 || heads*hd > C {
		return fmt.Errorf("cuda: %s: %d heads of %d channels in rows of %d: want an even head size of at least 2, heads·hd ≤ C", op, heads, hd, C)
	}
	if B*T == 0 {
		return nil
	}
	p, bf := bufs(out, inp)
	copyRest := p[0] != p[1] && heads*hd < C
	n := int64(B) * int64(T) * int64(heads) * int64(hd/2)
	if copyRest {
		n = max(n, int64(B)*int64(T)*int64(C-heads*hd))
	}
	grid, block := ElementwiseGeometry(n)
	return k.launch("rope", grid, block, 0, s, p[0], p[1], table, int32(B*T), int32(T), int32(C), int32(heads), int32(hd), int32(pos0), sign, flag(copyRest), bf)
}

// SwiGLUForward writes out (N,F) = silu(gate)·up from inp (N,2F), each row
// the gate (F) then the up projection (F).
func (k *Kernels) SwiGLUForward(s Stream, out, inp Buf, N, F int) error {
	if err := checkSizes("SwiGLUForward", N, 2*F); err != nil {
		return err
	}
	if N == 0 || F == 0 {
		return nil
	}
	p, bf := bufs(out, inp)
	vec := bf == 0 && F%4 == 0 && aligned(16, p...)
	grid, block := ElementwiseGeometry(vecWork(int64(N)*int64(F), vec))
	return k.launch("swiglu_forward", grid, block, 0, s, p[0], p[1], int64(N), int32(F), bf, flag(vec))
}

// SwiGLUBackward writes dinp (N,2F), overwritten, the gradients of the gate
// and up halves, from dout (N,F) and the forward pass's inp.
func (k *Kernels) SwiGLUBackward(s Stream, dinp, inp, dout Buf, N, F int) error {
	if err := checkSizes("SwiGLUBackward", N, 2*F); err != nil {
		return err
	}
	if N == 0 || F == 0 {
		return nil
	}
	grid, block := ElementwiseGeometry(int64(N) * int64(F))
	p, bf := bufs(dinp, inp, dout)
	return k.launch("swiglu_backward", grid, block, 0, s, p[0], p[1], p[2], int64(N), int32(F), bf)
}
