#include "textflag.h"

// func adamwSSE(pp, gg, mm, vv *float32, n int, k *[10]float32)
//
// One AdamW step on p[0:n] (n a multiple of 4), four lanes at a time with
// SSE (part of the amd64 baseline). k holds gscale, β1, 1−β1, β2, 1−β2,
// rc2, ε, rc1, lr, wd. Every lane does the scalar loop's operations in the
// same order, and SQRTPS rounds √x to float32 exactly as
// float32(math.Sqrt(float64(x))) does, so the results have the scalar
// loop's bits.
TEXT ·adamwSSE(SB), NOSPLIT, $0-48
	MOVQ pp+0(FP), DI
	MOVQ gg+8(FP), SI
	MOVQ mm+16(FP), R8
	MOVQ vv+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ k+40(FP), AX

	MOVSS  0(AX), X6
	SHUFPS $0, X6, X6   // gscale
	MOVSS  4(AX), X7
	SHUFPS $0, X7, X7   // β1
	MOVSS  8(AX), X8
	SHUFPS $0, X8, X8   // 1−β1
	MOVSS  12(AX), X9
	SHUFPS $0, X9, X9   // β2
	MOVSS  16(AX), X10
	SHUFPS $0, X10, X10 // 1−β2
	MOVSS  20(AX), X11
	SHUFPS $0, X11, X11 // rc2
	MOVSS  24(AX), X12
	SHUFPS $0, X12, X12 // ε
	MOVSS  28(AX), X13
	SHUFPS $0, X13, X13 // rc1
	MOVSS  32(AX), X14
	SHUFPS $0, X14, X14 // lr
	MOVSS  36(AX), X15
	SHUFPS $0, X15, X15 // wd

loop:
	CMPQ CX, $4
	JLT  done

	MOVUPS 0(SI), X0
	MULPS  X6, X0       // gi = g·gscale

	MOVUPS 0(R8), X1
	MULPS  X7, X1       // β1·m
	MOVAPS X0, X2
	MULPS  X8, X2       // (1−β1)·gi
	ADDPS  X2, X1       // mi
	MOVUPS X1, 0(R8)

	MOVUPS 0(R9), X2
	MULPS  X9, X2       // β2·v
	MOVAPS X0, X3
	MULPS  X10, X3      // (1−β2)·gi
	MULPS  X0, X3       // ·gi
	ADDPS  X3, X2       // vi
	MOVUPS X2, 0(R9)

	MULPS  X11, X2      // vi·rc2
	SQRTPS X2, X3
	ADDPS  X12, X3      // den = √(vi·rc2) + ε

	MULPS  X13, X1      // mi·rc1
	DIVPS  X3, X1       // / den

	MOVUPS 0(DI), X4
	MOVAPS X4, X5
	MULPS  X15, X5      // wd·p
	ADDPS  X5, X1
	MULPS  X14, X1      // lr·(…)
	SUBPS  X1, X4
	MOVUPS X4, 0(DI)

	ADDQ $16, DI
	ADDQ $16, SI
	ADDQ $16, R8
	ADDQ $16, R9
	SUBQ $4, CX
	JMP  loop

done:
	RET
