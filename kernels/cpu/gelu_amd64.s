#include "textflag.h"

// func geluTanhAVX512(th, x *float32, n int, k *[15]float32)
//
// geluTanh's loop on x[0:n] (n a multiple of 16), sixteen lanes at a
// time: every lane does the scalar loop's float32 operations in its
// order, none fused, so the results have its bits. k holds its constants
// as float32 (0.044715, √(2/π), −9, 9, 2, log₂e, 1.5·2²³, ln2's high part
// and its low part negated, 1/720, 1/120, 1/24, 1/6, 1/2, 1). VMAXPS and VMINPS return
// their second source when a lane is NaN, so a NaN passes as min and max
// pass it.
TEXT ·geluTanhAVX512(SB), NOSPLIT, $0-32
	MOVQ th+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ k+24(FP), AX

	VBROADCASTSS 0(AX), Z16  // 0.044715
	VBROADCASTSS 4(AX), Z17  // √(2/π)
	VBROADCASTSS 8(AX), Z18  // −9
	VBROADCASTSS 12(AX), Z19 // 9
	VBROADCASTSS 16(AX), Z20 // 2
	VBROADCASTSS 20(AX), Z21 // log₂e
	VBROADCASTSS 24(AX), Z22 // 1.5·2²³
	VBROADCASTSS 28(AX), Z23 // ln2 high
	VBROADCASTSS 32(AX), Z24 // −(ln2 low)
	VBROADCASTSS 36(AX), Z25 // 1/720
	VBROADCASTSS 40(AX), Z26 // 1/120
	VBROADCASTSS 44(AX), Z27 // 1/24
	VBROADCASTSS 48(AX), Z28 // 1/6
	VBROADCASTSS 52(AX), Z29 // 1/2
	VBROADCASTSS 56(AX), Z30 // 1
	MOVL         $0xb4c0007f, BX // 127 − 0x4b400000 as int32
	VPBROADCASTD BX, Z31

loop:
	VMOVUPS (SI), Z0
	VMULPS  Z0, Z16, Z1 // 0.044715·v
	VMULPS  Z0, Z1, Z1  // ·v
	VMULPS  Z0, Z1, Z1  // ·v
	VADDPS  Z1, Z0, Z1  // v + 0.044715·v³
	VMULPS  Z1, Z17, Z1 // u
	VMAXPS  Z1, Z18, Z1 // max(u, −9)
	VMINPS  Z1, Z19, Z1 // min(…, 9)
	VMULPS  Z1, Z20, Z1 // e2
	VMULPS  Z21, Z1, Z2 // e2·log₂e
	VADDPS  Z22, Z2, Z2 // t
	VSUBPS  Z22, Z2, Z3 // kf = t − 1.5·2²³
	VMULPS  Z23, Z3, Z4 // kf·ln2 high
	VSUBPS  Z4, Z1, Z4  // e2 − kf·ln2 high
	VMULPS  Z24, Z3, Z5 // −kf·ln2 low
	VADDPS  Z5, Z4, Z4  // r
	VMULPS  Z25, Z4, Z5 // r/720
	VADDPS  Z26, Z5, Z5 // 1/120 + …
	VMULPS  Z5, Z4, Z5
	VADDPS  Z27, Z5, Z5 // 1/24 + …
	VMULPS  Z5, Z4, Z5
	VADDPS  Z28, Z5, Z5 // 1/6 + …
	VMULPS  Z5, Z4, Z5
	VADDPS  Z29, Z5, Z5 // 1/2 + …
	VMULPS  Z5, Z4, Z5
	VADDPS  Z30, Z5, Z5 // 1 + …
	VMULPS  Z5, Z4, Z5
	VADDPS  Z30, Z5, Z5 // p = 1 + …
	VPADDD  Z31, Z2, Z6 // bits(t) − 0x4b400000 + 127
	VPSLLD  $23, Z6, Z6 // 2ᵏ
	VMULPS  Z6, Z5, Z5  // p·2ᵏ
	VADDPS  Z30, Z5, Z5 // + 1
	VDIVPS  Z5, Z20, Z5 // 2/(…)
	VSUBPS  Z5, Z30, Z5 // 1 − …
	VMOVUPS Z5, (DI)
	ADDQ    $64, SI
	ADDQ    $64, DI
	SUBQ    $16, CX
	JNZ     loop
	VZEROUPPER
	RET
