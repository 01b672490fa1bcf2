//go:build amd64 && !purego

#include "textflag.h"

// func halfToFloat8(dst *float32, src *uint16, n int)
//
// dst[i] = float32(src[i]) for n a multiple of 8: VCVTPH2PS (F16C), exact.
TEXT ·halfToFloat8(SB), NOSPLIT, $0-24
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

// func floatToHalf8(dst *uint16, src *float32, n int)
//
// dst[i] = half(src[i]) for n a multiple of 8: VCVTPS2PH (F16C) rounding to
// nearest even, as IEEE 754 and x448/float16 round.
TEXT ·floatToHalf8(SB), NOSPLIT, $0-24
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
