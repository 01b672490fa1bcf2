//go:build amd64 && !purego

#include "textflag.h"

// MASK sets k to the low CX bits (CX ≤ 16), with BX as scratch.
#define MASK(k) MOVL $1, BX; SHLL CX, BX; DECL BX; KMOVW BX, k

// func deal2(dst *float32, wp, plane int, src *float32, w, h int)
//
// Deals an h×w image at src out to its four stride-2 phases: pixel (y, x)
// to dst[((y&1)·2 + (x&1))·plane + (y>>1)·wp + (x>>1)], a row at a time,
// thirty-two pixels a step (two loads, two VPERMI2PS with the lanes of
// dealEven and dealOdd, two stores), the last few of a row by masked loads
// and stores (AVX-512F).
TEXT ·deal2(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ wp+8(FP), R8
	SHLQ $2, R8
	MOVQ plane+16(FP), R9
	SHLQ $2, R9
	MOVQ src+24(FP), SI
	MOVQ w+32(FP), AX
	VMOVDQU32 ·dealEven(SB), Z28
	VMOVDQU32 ·dealOdd(SB), Z29
	XORQ DX, DX

row:
	CMPQ DX, h+40(FP)
	JGE done
	MOVQ DX, R13 // R13, R14: the row's even and odd phase
	SHRQ $1, R13
	IMULQ R8, R13
	ADDQ DI, R13
	TESTQ $1, DX
	JZ phases
	LEAQ (R13)(R9*2), R13

phases:
	LEAQ (R13)(R9*1), R14
	MOVQ SI, R12
	MOVQ AX, R11 // pixels left in the row

chunk:
	MOVQ R11, R10 // R10: this step's pixels, at most 32
	CMPQ R10, $32
	JLE counted
	MOVQ $32, R10

counted:
	// K1, K2: the lanes of the two loads; K3, K4: of the even and odd stores.
	MOVQ R10, CX
	CMPQ CX, $16
	JLE lo
	MOVQ $16, CX

lo:
	MASK(K1)
	MOVQ R10, CX
	SUBQ $16, CX
	JGE hi
	XORQ CX, CX

hi:
	MASK(K2)
	MOVQ R10, CX
	INCQ CX
	SHRQ $1, CX
	MASK(K3)
	MOVQ R10, CX
	SHRQ $1, CX
	MASK(K4)
	VMOVUPS.Z (R12), K1, Z0
	VMOVUPS.Z 64(R12), K2, Z1
	VMOVAPS Z28, Z2
	VPERMI2PS Z1, Z0, Z2
	VMOVAPS Z29, Z3
	VPERMI2PS Z1, Z0, Z3
	VMOVUPS Z2, K3, (R13)
	VMOVUPS Z3, K4, (R14)
	ADDQ $128, R12
	ADDQ $64, R13
	ADDQ $64, R14
	SUBQ $32, R11
	JG chunk
	LEAQ (SI)(AX*4), SI
	INCQ DX
	JMP row

done:
	VZEROUPPER
	RET
