#include "textflag.h"

// func expShiftSSE(x *float32, n int, k *[12]float32, s *[4]float64)
//
// expShift's loop on x[0:n] (n a multiple of 4), four lanes at a time with
// SSE2 (the amd64 baseline). k holds m (the shift), log2e, 1.5·2²³, ln2hi,
// ln2lo, 1/720, 1/120, 1/24, 1/6, 1/2, 1 and −87.3, each as the scalar
// code rounds it to float32. Every lane does the scalar loop's operations in
// the same order (no fused multiply-add), so each eˣ has the scalar loop's
// bits; arguments below −87.3, and NaNs, give 0 as there. The float64 sums
// s[0..3] go on where the caller left them: lane j adds the elements
// 4i + j in order, as s[i&3] does.
TEXT ·expShiftSSE(SB), NOSPLIT, $0-32
	MOVQ x+0(FP), DI
	MOVQ n+8(FP), CX
	MOVQ k+16(FP), AX
	MOVQ s+24(FP), BX

	MOVSS  0(AX), X15
	SHUFPS $0, X15, X15 // m
	MOVSS  4(AX), X14
	SHUFPS $0, X14, X14 // log2e
	MOVSS  8(AX), X13
	SHUFPS $0, X13, X13 // magic = 1.5·2²³
	MOVSS  12(AX), X12
	SHUFPS $0, X12, X12 // ln2hi
	MOVSS  16(AX), X11
	SHUFPS $0, X11, X11 // ln2lo
	MOVSS  44(AX), X10
	SHUFPS $0, X10, X10 // −87.3
	MOVL   $127, R8
	MOVD   R8, X6
	PSHUFL $0, X6, X6   // the exponent bias
	MOVUPS 0(BX), X8    // s[0], s[1]
	MOVUPS 16(BX), X9   // s[2], s[3]

	// The polynomial's coefficients are read from k as memory operands:
	// SSE has 16 registers and the loop needs the rest.
loop:
	CMPQ CX, $4
	JLT  done

	MOVUPS 0(DI), X0
	SUBPS  X15, X0      // v = x − m

	MOVAPS X10, X7
	CMPPS  X0, X7, $2   // mask = −87.3 ≤ v (false for NaN)

	MOVAPS X0, X1
	MULPS  X14, X1
	ADDPS  X13, X1      // t = v·log2e + magic
	MOVAPS X1, X2
	PSUBL  X13, X2      // k = bits(t) − bits(magic)
	SUBPS  X13, X1      // kf = t − magic

	MOVAPS X1, X3
	MULPS  X12, X3
	MOVAPS X0, X4
	SUBPS  X3, X4       // v − kf·ln2hi
	MULPS  X11, X1
	SUBPS  X1, X4       // r = (v − kf·ln2hi) − kf·ln2lo

	MOVSS  20(AX), X5
	SHUFPS $0, X5, X5   // 1/720
	MULPS  X4, X5
	MOVSS  24(AX), X1
	SHUFPS $0, X1, X1
	ADDPS  X1, X5       // 1/120 + r/720
	MULPS  X4, X5
	MOVSS  28(AX), X1
	SHUFPS $0, X1, X1
	ADDPS  X1, X5       // 1/24 + …
	MULPS  X4, X5
	MOVSS  32(AX), X1
	SHUFPS $0, X1, X1
	ADDPS  X1, X5       // 1/6 + …
	MULPS  X4, X5
	MOVSS  36(AX), X1
	SHUFPS $0, X1, X1
	ADDPS  X1, X5       // 1/2 + …
	MULPS  X4, X5
	MOVSS  40(AX), X1
	SHUFPS $0, X1, X1
	ADDPS  X1, X5       // 1 + …
	MULPS  X4, X5
	ADDPS  X1, X5       // p = 1 + r·(…)

	PADDL  X6, X2
	PSLLL  $23, X2      // 2ᵏ = bits((k + 127) << 23)
	MULPS  X2, X5       // e = p·2ᵏ
	ANDPS  X7, X5       // 0 where v < −87.3
	MOVUPS X5, 0(DI)

	CVTPS2PD X5, X0     // e[0], e[1] as float64
	ADDPD    X0, X8
	MOVHLPS  X5, X5
	CVTPS2PD X5, X0     // e[2], e[3]
	ADDPD    X0, X9

	ADDQ $16, DI
	SUBQ $4, CX
	JMP  loop

done:
	MOVUPS X8, 0(BX)
	MOVUPS X9, 16(BX)
	RET

// func maxSSE(x *float32, n int, lanes *[4]float32)
//
// The running maxima of four lanes over x[0:n] (n a multiple of 4): lane j
// starts at −Inf and takes x[4i+j] when x[4i+j] > lane, as maxOf's loop
// does (MAXPS with the new element first returns the old maximum when
// either is NaN, so NaNs are passed over).
TEXT ·maxSSE(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), DI
	MOVQ n+8(FP), CX
	MOVQ lanes+16(FP), BX
	MOVUPS 0(BX), X0

maxloop:
	CMPQ CX, $4
	JLT  maxdone
	MOVUPS 0(DI), X1
	MAXPS  X0, X1       // X1 = X1 > X0 ? X1 : X0
	MOVAPS X1, X0
	ADDQ   $16, DI
	SUBQ   $4, CX
	JMP    maxloop

maxdone:
	MOVUPS X0, 0(BX)
	RET

// func scaleSSE(x *float32, n int, s float32)
//
// x[i] *= s for i < n (n a multiple of 4): the scalar loop's products.
TEXT ·scaleSSE(SB), NOSPLIT, $0-20
	MOVQ   x+0(FP), DI
	MOVQ   n+8(FP), CX
	MOVSS  s+16(FP), X1
	SHUFPS $0, X1, X1

scaleloop:
	CMPQ   CX, $4
	JLT    scaledone
	MOVUPS 0(DI), X0
	MULPS  X1, X0
	MOVUPS X0, 0(DI)
	ADDQ   $16, DI
	SUBQ   $4, CX
	JMP    scaleloop

scaledone:
	RET
