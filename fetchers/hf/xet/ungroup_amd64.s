//go:build !purego

#include "textflag.h"

// func ungroupSSE2(dst, a, b, c, d *byte, blocks int)
// Each block: 16 bytes of each group in, 64 bytes out
// (a0 b0 c0 d0 a1 b1 c1 d1 ...): bytes of a and b interleaved, then of
// c and d, then the two pairs by 16-bit words.
TEXT ·ungroupSSE2(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), R8
	MOVQ c+24(FP), R9
	MOVQ d+32(FP), R10
	MOVQ blocks+40(FP), CX

loop:
	MOVOU (SI), X0
	MOVOU (R8), X1
	MOVOU (R9), X2
	MOVOU (R10), X3
	MOVO  X0, X4
	PUNPCKLBW X1, X0 // a0 b0 ... a7 b7
	PUNPCKHBW X1, X4 // a8 b8 ... a15 b15
	MOVO  X2, X5
	PUNPCKLBW X3, X2 // c0 d0 ... c7 d7
	PUNPCKHBW X3, X5 // c8 d8 ... c15 d15
	MOVO  X0, X6
	PUNPCKLWL X2, X0 // a0 b0 c0 d0 ... a3 b3 c3 d3
	PUNPCKHWL X2, X6 // 4 to 7
	MOVO  X4, X7
	PUNPCKLWL X5, X4 // 8 to 11
	PUNPCKHWL X5, X7 // 12 to 15
	MOVOU X0, (DI)
	MOVOU X6, 16(DI)
	MOVOU X4, 32(DI)
	MOVOU X7, 48(DI)
	ADDQ  $16, SI
	ADDQ  $16, R8
	ADDQ  $16, R9
	ADDQ  $16, R10
	ADDQ  $64, DI
	DECQ  CX
	JNZ   loop
	RET
