package cuda

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// matmul.go: the linear layers and the plain GEMM of the Backend — cuBLAS's
// GEMMs and cuBLASLt's Matmul with its epilogues (the bias, GPT-2's GELU
// and its backward) into float32 or bfloat16 activations, the operands
// rounded to the precision's 16-bit type or read from the weights'
// bfloat16 copy, and the backend's own kernels where cuBLASLt refuses an
// epilogue.

// Sgemm is the row-major single-precision GEMM of kernels/cpu, run by
// cuBLAS in IEEE fp32 whatever the precision.
func (b *Backend) Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, bm []float32, ldb int, beta float32, c []float32, ldc int) {
	if !b.ok() {
		return
	}
	b.run("Sgemm", b.rowMajor(PrecisionFP32, transA, transB, m, n, k, alpha, a, lda, bm, ldb, beta, b.ptr(c), ldc))
}

// rowMajor computes, for row-major matrices, C(m,n) = alpha·op(A)·op(B) +
// beta·C: to cuBLAS, which is column-major, that is Cᵀ = op(B)ᵀ·op(A)ᵀ,
// the same call with A and B swapped. Under BF16/FP16, A and B are
// multiplied in 16 bits: bfloat16 activations as they are, float32s
// rounded first into scratch buffers. C is float32, or bfloat16
// activations that cuBLAS rounds its float32 sum into once.
func (b *Backend) rowMajor(p Precision, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, bm []float32, ldb int, beta float32, c Buf, ldc int) error {
	return b.rowMajorEpilogue(p, transA, transB, m, n, k, alpha, a, lda, bm, ldb, beta, c, ldc, EpilogueNone, 0, 0)
}

// rowMajorEpilogue is rowMajor followed by cuBLASLt's epilogue ep (its
// bias vector, of C's type, one element per column of the row-major C;
// its auxiliary matrix, of C's type and layout), through cuBLASLt's
// Matmul; EpilogueNone goes through cuBLAS's GEMM.
func (b *Backend) rowMajorEpilogue(p Precision, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, bm []float32, ldb int, beta float32, c Buf, ldc int, ep Epilogue, bias, aux Ptr) error {
	t := p.dataType()
	pa, err := b.operand(&b.castA, a, extent(transA, m, k, lda), t)
	if err != nil {
		return err
	}
	pb, err := b.operand(&b.castB, bm, extent(transB, k, n, ldb), t)
	if err != nil {
		return err
	}
	pc, half := c.buf()
	ct := F32
	if half {
		ct = BF16
	}
	if ep != EpilogueNone {
		return b.blas.Matmul(transB, transA, n, m, k, alpha, pb, t, ldb, pa, t, lda, beta, pc, ct, ldc, ep, bias, aux)
	}
	return b.blas.Gemm(transB, transA, n, m, k, alpha, pb, t, ldb, pa, t, lda, beta, pc, ct, ldc, p == PrecisionFP32)
}

// operand returns the address of a GEMM input x of n elements in type t:
// bfloat16 activations as they are (under bf16), float32s as they are for
// fp32, weights in the copy CopyWeights made while it is in use, else
// rounded to t into the scratch buffer sc.
func (b *Backend) operand(sc *scratch, x []float32, n int, t DataType) (Ptr, error) {
	p, half := b.buf(x).buf()
	switch {
	case half && t == BF16:
		return p, nil
	case half:
		return 0, fmt.Errorf("cuda: a GEMM in %s of bfloat16 activations", t)
	case t == F32:
		return p, nil
	case t == BF16 && b.whi != 0 && uintptr(p) >= b.wlo && uintptr(p)+4*uintptr(n) <= b.whi:
		return b.weights.p + Ptr((uintptr(p)-b.wlo)/2), nil
	}
	buf, err := b.grow(sc, 2*n)
	if err != nil {
		return 0, err
	}
	if t == BF16 {
		return buf, b.k.CastF32ToBF16(b.s, buf, p, n)
	}
	return buf, b.k.CastF32ToF16(b.s, buf, p, n)
}

// extent is the number of elements a row-major r×c operand (c×r when
// transposed) with leading dimension ld spans.
func extent(trans bool, r, c, ld int) int {
	if trans {
		r, c = c, r
	}
	if r == 0 || c == 0 {
		return 0
	}
	return (r-1)*ld + c
}

// MatmulForward: out (N,OC) = inp (N,IC) · wᵀ + bias, w (OC,IC). Into
// bfloat16 activations with a bias, see matmulBiasHalf.
func (b *Backend) MatmulForward(out, inp, w, bias []float32, N, IC, OC int) {
	if !b.ok() {
		return
	}
	o := b.buf(out)
	if _, half := o.buf(); half && bias != nil {
		b.run("MatmulForward", b.matmulBiasHalf(o, inp, w, bias, N, IC, OC))
		return
	}
	if err := b.rowMajor(b.prec, false, true, N, OC, IC, 1, inp, IC, w, IC, 0, o, OC); err != nil {
		b.run("MatmulForward", err)
		return
	}
	if bias != nil {
		b.run("MatmulForward bias", b.k.BiasAdd(b.s, b.ptr(out), b.ptr(bias), N, OC))
	}
}

// matmulBiasHalf is MatmulForward into bfloat16 activations out with a
// bias, which is read as a bfloat16 (kernels/activations.go): cuBLASLt's
// bias epilogue adds the bias, rounded into biasHalf, to the float32 sum
// and rounds once into out. Where cuBLASLt refuses that epilogue
// (epilogue), the product goes to float32 scratch, which BiasStore adds
// the rounded bias to and stores, as the epilogue would.
func (b *Backend) matmulBiasHalf(out Buf, inp, w, bias []float32, N, IC, OC int) error {
	if done, err := b.epilogue(EpilogueBias, N, OC, IC, inp, w, out, bias, 0); done {
		return err
	}
	prod, err := b.productOf(inp, w, N, IC, OC)
	if err != nil {
		return err
	}
	return b.k.BiasStore(b.s, out, prod, b.ptr(bias), N, OC)
}

// MatmulGeluForward is GPT-2's fc with its GELU: into bfloat16
// activations (pre and out) cuBLASLt's GELU_AUX_BIAS epilogue, which
// stores the sum into pre and its GELU into out, each rounded once from
// the float32 sum, or where cuBLASLt refuses it (or there is no bias) the
// product into float32 scratch and BiasGeluStore, with the same numerics
// but GELU's own; into float32 MatmulForward then GeluForward, which is
// the same.
func (b *Backend) MatmulGeluForward(out, pre, inp, w, bias []float32, N, IC, OC int) {
	if !b.ok() {
		return
	}
	o, p := b.buf(out), b.buf(pre)
	_, oh := o.buf()
	pp, ph := p.buf()
	if !oh || !ph {
		b.MatmulForward(pre, inp, w, bias, N, IC, OC)
		b.GeluForward(out, pre)
		return
	}
	b.run("MatmulGeluForward", func() error {
		if bias != nil {
			if done, err := b.epilogue(EpilogueGeluAuxBias, N, OC, IC, inp, w, o, bias, pp); done {
				return err
			}
		}
		prod, err := b.productOf(inp, w, N, IC, OC)
		if err != nil {
			return err
		}
		return b.k.BiasGeluStore(b.s, o, p, prod, b.ptr(bias), N, OC)
	}())
}

// MatmulBackwardGelu is MatmulBackward after a GELU whose input was pre:
// into a bfloat16 dinp, cuBLASLt's DGELU epilogue multiplies the float32
// product by GELU's derivative at pre and rounds once, or where cuBLASLt
// refuses it the product goes to float32 scratch and GeluBackward (the
// derivative from pre alone) stores it; into float32, the product and
// GeluBackward in place.
func (b *Backend) MatmulBackwardGelu(dinp, dw, dbias, dout, inp, pre, w []float32, N, IC, OC int) {
	if !b.ok() {
		return
	}
	d, p := b.buf(dinp), b.buf(pre)
	pp, _ := p.buf()
	err := func() error {
		if _, half := d.buf(); !half {
			if err := b.rowMajor(b.prec, false, false, N, IC, OC, 1, dout, OC, w, IC, 0, d, IC); err != nil {
				return err
			}
			return b.k.GeluBackward(b.s, d, p, nil, d, N*IC)
		}
		if done, err := b.epilogue(EpilogueDGelu, N, IC, OC, dout, w, d, nil, pp); done {
			return err
		}
		prod, err := b.rowMajorProduct(false, false, N, IC, OC, dout, OC, w, IC)
		if err != nil {
			return err
		}
		return b.k.GeluBackward(b.s, d, p, nil, prod, N*IC)
	}()
	if err != nil {
		b.run("MatmulBackwardGelu dinp", err)
		return
	}
	b.MatmulBackward(nil, dw, dbias, dout, inp, w, N, IC, OC)
}

// epilogue runs a linear layer's GEMM with cuBLASLt's epilogue ep unless
// cuBLASLt has refused ep before: out (rows,cols) = a (rows,k) · op(w) with
// the epilogue's bias (rounded into biasHalf: the epilogue reads it in
// out's type) and auxiliary matrix (of out's layout), op(w) = wᵀ for the
// forward epilogues, w for DGELU (an input gradient). done is false, with
// no GEMM launched, where cuBLASLt refuses ep (now or before): the caller
// then does the work with its own kernels. The first refusal of each
// epilogue is kept (EpilogueRefused).
func (b *Backend) epilogue(ep Epilogue, rows, cols, k int, a, w []float32, out Buf, bias []float32, aux Ptr) (done bool, err error) {
	if b.refused[ep] != nil {
		return false, nil
	}
	var hb Ptr
	if ep.usesBias() {
		if hb, err = b.halfBias(bias); err != nil {
			return true, err
		}
	}
	transW := ep != EpilogueDGelu
	err = b.rowMajorEpilogue(b.prec, false, transW, rows, cols, k, 1, a, k, w, ldw(transW, k, cols), 0, out, cols, ep, hb, aux)
	if err == nil || !matmulRefused(err) {
		return true, err
	}
	if b.refused == nil {
		b.refused = map[Epilogue]error{}
	}
	b.refused[ep] = err
	return false, nil
}

// ldw is the leading dimension of a row-major weight read as op(w):
// (cols,k) transposed, or (k,cols).
func ldw(trans bool, k, cols int) int {
	if trans {
		return k
	}
	return cols
}

// halfBias rounds bias into biasHalf, the bfloat16 bias cuBLASLt's
// epilogues read into bfloat16 activations.
func (b *Backend) halfBias(bias []float32) (Ptr, error) {
	hb, err := b.grow(&b.biasHalf, 2*len(bias))
	if err != nil {
		return 0, err
	}
	return hb, b.k.CastF32ToBF16(b.s, hb, b.ptr(bias), len(bias))
}

// productOf is the float32 product inp (N,IC)·wᵀ, (N,OC), in the product
// scratch, for a GEMM into bfloat16 activations whose epilogue the
// backend's own kernel applies.
func (b *Backend) productOf(inp, w []float32, N, IC, OC int) (Ptr, error) {
	return b.rowMajorProduct(false, true, N, OC, IC, inp, IC, w, IC)
}

// rowMajorProduct is rowMajor into the float32 product scratch (m,n).
func (b *Backend) rowMajorProduct(transA, transB bool, m, n, k int, a []float32, lda int, bm []float32, ldb int) (Ptr, error) {
	prod, err := b.grow(&b.product, 4*m*n)
	if err != nil {
		return 0, err
	}
	return prod, b.rowMajor(b.prec, transA, transB, m, n, k, 1, a, lda, bm, ldb, 0, prod, n)
}

// CopyWeights keeps a bfloat16 copy of w, the model's parameters, for
// the GEMMs under bf16 until DropWeights (kernels.WeightCopier): one cast
// of them all, in place of a cast of each weight before each GEMM that
// reads it. In the other precisions it does nothing.
func (b *Backend) CopyWeights(w []float32) {
	if b.prec != PrecisionBF16 || len(w) == 0 || !b.ok() {
		return
	}
	p := b.ptr(w)
	dst, err := b.grow(&b.weights, 2*len(w))
	if err == nil {
		err = b.k.CastF32ToBF16(b.s, dst, p, len(w))
	}
	if err != nil {
		b.run("CopyWeights", err)
		return
	}
	b.wlo, b.whi = uintptr(p), uintptr(p)+4*uintptr(len(w))
}

// DropWeights ends the use of the copy CopyWeights made: the GEMMs round
// the weights they read again. The copy's memory is kept for the next.
func (b *Backend) DropWeights() { b.wlo, b.whi = 0, 0 }

// EpiloguesEnv, set to "off", keeps the backend from asking cuBLASLt for
// any epilogue: its own kernels do their work from the float32 product,
// as where cuBLASLt refuses one — to compare the two on a GPU, or to do
// without a library's epilogues, as GPTUI_FLASH_ATTENTION=off does
// without the flash kernels.
const EpiloguesEnv = "GPTUI_CUBLASLT_EPILOGUES"

// epiloguesInit marks every epilogue refused under EpiloguesEnv=off, and
// says so in log.
func (b *Backend) epiloguesInit(log io.Writer) {
	if !strings.EqualFold(os.Getenv(EpiloguesEnv), "off") {
		return
	}
	off := fmt.Errorf("%s=off", EpiloguesEnv)
	b.refused = map[Epilogue]error{EpilogueBias: off, EpilogueGeluAuxBias: off, EpilogueDGelu: off}
	if log != nil {
		fmt.Fprintf(log, "cuda: %s=off: no cuBLASLt epilogues; the backend's own kernels add the biases and GELU\n", EpiloguesEnv)
	}
}

// EpilogueRefused reports whether the GEMMs that would take cuBLASLt's
// epilogue ep (EpilogueBias, EpilogueGeluAuxBias, EpilogueDGelu: the
// GEMMs into bfloat16 activations) have had it: nil, or why not
// (cuBLASLt's first refusal, after which the backend's own kernels do
// its work), for `gptui gpu check` to say.
func (b *Backend) EpilogueRefused(ep Epilogue) error { return b.refused[ep] }

// MatmulBackward: dinp = dout·w (overwritten, skipped when nil),
// dw += doutᵀ·inp, dbias += Σ rows of dout (skipped when nil).
func (b *Backend) MatmulBackward(dinp, dw, dbias, dout, inp, w []float32, N, IC, OC int) {
	if !b.ok() {
		return
	}
	if dinp != nil {
		if err := b.rowMajor(b.prec, false, false, N, IC, OC, 1, dout, OC, w, IC, 0, b.buf(dinp), IC); err != nil {
			b.run("MatmulBackward dinp", err)
			return
		}
	}
	if err := b.rowMajor(b.prec, true, false, OC, IC, N, 1, dout, OC, inp, IC, 1, b.ptr(dw), IC); err != nil {
		b.run("MatmulBackward dw", err)
		return
	}
	if dbias != nil {
		b.run("MatmulBackward dbias", b.k.BiasBackward(b.s, b.ptr(dbias), b.buf(dout), N, OC))
	}
}
