#include "textflag.h"

// func addF32SSE(dst, src *float32, n int)
//
// dst[i] += src[i] for i < n, four lanes at a time with SSE (part of the
// amd64 baseline), 16 elements per iteration. Each lane is an ordinary
// IEEE single-precision addition, so the result has the same bits as the
// scalar loop.
TEXT ·addF32SSE(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

loop16:
	CMPQ   CX, $16
	JLT    tail
	MOVUPS 0(DI), X0
	MOVUPS 16(DI), X1
	MOVUPS 32(DI), X2
	MOVUPS 48(DI), X3
	MOVUPS 0(SI), X4
	MOVUPS 16(SI), X5
	MOVUPS 32(SI), X6
	MOVUPS 48(SI), X7
	ADDPS  X4, X0
	ADDPS  X5, X1
	ADDPS  X6, X2
	ADDPS  X7, X3
	MOVUPS X0, 0(DI)
	MOVUPS X1, 16(DI)
	MOVUPS X2, 32(DI)
	MOVUPS X3, 48(DI)
	ADDQ   $64, DI
	ADDQ   $64, SI
	SUBQ   $16, CX
	JMP    loop16

tail:
	CMPQ  CX, $0
	JEQ   done
	MOVSS 0(DI), X0
	ADDSS 0(SI), X0
	MOVSS X0, 0(DI)
	ADDQ  $4, DI
	ADDQ  $4, SI
	DECQ  CX
	JMP   tail

done:
	RET
