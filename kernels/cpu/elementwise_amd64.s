//go:build amd64 && !purego

#include "textflag.h"

// func reluGrad16(dx, dy, y *float32, n int)
//
// dx = dy where y > 0, else 0 (a NaN y passes nothing), sixteen values an
// instruction (AVX-512F); n is a multiple of 16.
TEXT ·reluGrad16(SB), NOSPLIT, $0-32
	MOVQ dx+0(FP), DI
	MOVQ dy+8(FP), SI
	MOVQ y+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $4, CX
	VPXORD Z1, Z1, Z1
	TESTQ CX, CX
	JZ done
loop:
	VMOVUPS (DX), Z0
	VCMPPS $14, Z1, Z0, K1
	VMOVUPS.Z (SI), K1, Z2
	VMOVUPS Z2, (DI)
	ADDQ $64, DI
	ADDQ $64, SI
	ADDQ $64, DX
	DECQ CX
	JNZ loop
done:
	VZEROUPPER
	RET

// func relu16(y, x *float32, n int)
//
// y = max(x, 0) with NaN passed through (MAXPS returns its second source
// when either is NaN), sixteen values an instruction (AVX-512F); n is a
// multiple of 16.
TEXT ·relu16(SB), NOSPLIT, $0-24
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	VPXORD Z1, Z1, Z1
	TESTQ CX, CX
	JZ rdone
rloop:
	VMOVUPS (SI), Z0
	VMAXPS Z0, Z1, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, DI
	ADDQ $64, SI
	DECQ CX
	JNZ rloop
rdone:
	VZEROUPPER
	RET
