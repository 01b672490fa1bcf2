//go:build amd64 && !purego

#include "textflag.h"

// func toFloat8(dst *float32, src *uint16, n int)
//
// dst[i] = float32(src[i]) for n a multiple of 8: VCVTPH2PS (F16C), exact.
TEXT ·toFloat8(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JZ   done1
loop1:
	VCVTPH2PS (SI), Y0
	VMOVUPS   Y0, (DI)
	ADDQ $16, SI
	ADDQ $32, DI
	DECQ CX
	JNZ  loop1
done1:
	VZEROUPPER
	RET

// func fromFloat8(dst *uint16, src *float32, n int)
//
// dst[i] = half(src[i]) for n a multiple of 8: VCVTPS2PH (F16C) rounding to
// nearest even, as IEEE 754 and x448/float16 round.
TEXT ·fromFloat8(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JZ   done2
loop2:
	VMOVUPS   (SI), Y0
	VCVTPS2PH $0, Y0, X1
	VMOVDQU   X1, (DI)
	ADDQ $32, SI
	ADDQ $16, DI
	DECQ CX
	JNZ  loop2
done2:
	VZEROUPPER
	RET

// func toFloatRows8(dst *float32, ldd int, src *uint16, lds int, rows, n int)
//
// dst[r·ldd + j] = float32(src[r·lds + j]) for r < rows and j < n, n a
// positive multiple of 8 (strides in elements).
TEXT ·toFloatRows8(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ ldd+8(FP), R8
	SHLQ $2, R8
	MOVQ src+16(FP), SI
	MOVQ lds+24(FP), R9
	SHLQ $1, R9
	MOVQ rows+32(FP), DX
	MOVQ n+40(FP), R10
	SHRQ $3, R10
	TESTQ DX, DX
	JZ   rdone
rrow:
	MOVQ DI, AX
	MOVQ SI, BX
	MOVQ R10, CX
rloop:
	VCVTPH2PS (BX), Y0
	VMOVUPS   Y0, (AX)
	ADDQ $16, BX
	ADDQ $32, AX
	DECQ CX
	JNZ  rloop
	ADDQ R8, DI
	ADDQ R9, SI
	DECQ DX
	JNZ  rrow
rdone:
	VZEROUPPER
	RET
