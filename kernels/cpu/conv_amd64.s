//go:build amd64 && !purego

#include "textflag.h"

// MASK sets k to the low CX bits (CX ≤ 16), with BX as scratch.
#define MASK(k) MOVL $1, BX; SHLL CX, BX; DECL BX; KMOVW BX, k

// The lanes of thirty-two pixels that go to the even and the odd phase.
DATA ·dealEven+0(SB)/4, $0
DATA ·dealEven+4(SB)/4, $2
DATA ·dealEven+8(SB)/4, $4
DATA ·dealEven+12(SB)/4, $6
DATA ·dealEven+16(SB)/4, $8
DATA ·dealEven+20(SB)/4, $10
DATA ·dealEven+24(SB)/4, $12
DATA ·dealEven+28(SB)/4, $14
DATA ·dealEven+32(SB)/4, $16
DATA ·dealEven+36(SB)/4, $18
DATA ·dealEven+40(SB)/4, $20
DATA ·dealEven+44(SB)/4, $22
DATA ·dealEven+48(SB)/4, $24
DATA ·dealEven+52(SB)/4, $26
DATA ·dealEven+56(SB)/4, $28
DATA ·dealEven+60(SB)/4, $30
GLOBL ·dealEven(SB), RODATA|NOPTR, $64
DATA ·dealOdd+0(SB)/4, $1
DATA ·dealOdd+4(SB)/4, $3
DATA ·dealOdd+8(SB)/4, $5
DATA ·dealOdd+12(SB)/4, $7
DATA ·dealOdd+16(SB)/4, $9
DATA ·dealOdd+20(SB)/4, $11
DATA ·dealOdd+24(SB)/4, $13
DATA ·dealOdd+28(SB)/4, $15
DATA ·dealOdd+32(SB)/4, $17
DATA ·dealOdd+36(SB)/4, $19
DATA ·dealOdd+40(SB)/4, $21
DATA ·dealOdd+44(SB)/4, $23
DATA ·dealOdd+48(SB)/4, $25
DATA ·dealOdd+52(SB)/4, $27
DATA ·dealOdd+56(SB)/4, $29
DATA ·dealOdd+60(SB)/4, $31
GLOBL ·dealOdd(SB), RODATA|NOPTR, $64

// func deal2(dst *float32, wp, plane int, src *float32, w, h int)
//
// Deals an h×w image at src out to its four stride-2 phases: pixel (y, x)
// to dst[((y&1)·2 + (x&1))·plane + (y>>1)·wp + (x>>1)], a row at a time,
// thirty-two pixels a step (two loads, two VPERMI2PS, two stores), the
// last few of a row by masked loads and stores (AVX-512F).
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
