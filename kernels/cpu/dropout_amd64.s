#include "textflag.h"

// The lane offsets of the first eight element indices.
DATA dropLanes<>+0(SB)/8, $0
DATA dropLanes<>+8(SB)/8, $1
DATA dropLanes<>+16(SB)/8, $2
DATA dropLanes<>+24(SB)/8, $3
DATA dropLanes<>+32(SB)/8, $4
DATA dropLanes<>+40(SB)/8, $5
DATA dropLanes<>+48(SB)/8, $6
DATA dropLanes<>+56(SB)/8, $7
GLOBL dropLanes<>(SB), RODATA|NOPTR, $64

// MIX64 is splitmix64's finaliser (kernels.mix64) on the eight lanes of
// x, with t a scratch register and Z14, Z15 its two multipliers.
#define MIX64(x, t) \
	VPSRLQ  $30, x, t \
	VPXORQ  t, x, x   \
	VPMULLQ Z14, x, x \
	VPSRLQ  $27, x, t \
	VPXORQ  t, x, x   \
	VPMULLQ Z15, x, x \
	VPSRLQ  $31, x, t \
	VPXORQ  t, x, x

// func dropoutAVX512(out, in *float32, n int, key, first, th uint64, scale float32)
//
// out[i] = in[i]·scale where element first+i is kept, else 0, for i < n
// (a multiple of 8): kernels.Dropout.Keep's hash on eight 64-bit lanes
// (AVX512DQ's VPMULLQ), its top 24 bits compared with th, and the kept
// lanes multiplied and the others zeroed in one masked VMULPS (AVX512VL).
// out may alias in.
TEXT ·dropoutAVX512(SB), NOSPLIT, $0-52
	MOVQ out+0(FP), DI
	MOVQ in+8(FP), SI
	MOVQ n+16(FP), CX
	VPBROADCASTQ key+24(FP), Z10
	VPBROADCASTQ first+32(FP), Z0
	VPBROADCASTQ th+40(FP), Z11
	VBROADCASTSS scale+48(FP), Y12
	MOVQ $0x9e3779b97f4a7c15, AX
	VPBROADCASTQ AX, Z13
	MOVQ $0xbf58476d1ce4e5b9, AX
	VPBROADCASTQ AX, Z14
	MOVQ $0x94d049bb133111eb, AX
	VPBROADCASTQ AX, Z15
	MOVQ $8, AX
	VPBROADCASTQ AX, Z9
	VPADDQ dropLanes<>(SB), Z0, Z0 // the lanes' element indices
	VPADDQ Z13, Z0, Z0             // … + 0x9e3779b97f4a7c15, mix64's input

loop:
	VMOVDQA64 Z0, Z1
	MIX64(Z1, Z2)
	VPXORQ    Z10, Z1, Z1
	MIX64(Z1, Z2)
	VPSRLQ    $40, Z1, Z1
	VPCMPUQ   $5, Z11, Z1, K1 // kept: top 24 bits ≥ th
	VMOVUPS   (SI), Y3
	VMULPS.Z  Y12, Y3, K1, Y4
	VMOVUPS   Y4, (DI)
	VPADDQ    Z9, Z0, Z0
	ADDQ      $32, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JNZ       loop
	VZEROUPPER
	RET
