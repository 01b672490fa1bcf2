//go:build amd64 && !purego

#include "textflag.h"

// func sgdMomentum16(p, grad, buf *float32, n int, lr, wd, mom, damp float32, nesterov bool)
//
// SGD with momentum past the first step, sixteen parameters an instruction
// (AVX-512F); n is a multiple of 16:
//
//	d = g + wd·p;  buf = mom·buf + damp·d;  d = d + mom·buf (Nesterov) or buf;  p -= lr·d
TEXT ·sgdMomentum16(SB), NOSPLIT, $0-49
	MOVQ p+0(FP), DI
	MOVQ grad+8(FP), SI
	MOVQ buf+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $4, CX
	VBROADCASTSS lr+32(FP), Z4
	VBROADCASTSS wd+36(FP), Z5
	VBROADCASTSS mom+40(FP), Z6
	VBROADCASTSS damp+44(FP), Z7
	MOVBLZX nesterov+48(FP), AX
	TESTQ CX, CX
	JZ done
loop:
	VMOVUPS (DI), Z0
	VMOVUPS (SI), Z1
	VFMADD231PS Z0, Z5, Z1
	VMULPS (DX), Z6, Z2
	VFMADD231PS Z1, Z7, Z2
	VMOVUPS Z2, (DX)
	TESTQ AX, AX
	JZ plain
	VFMADD231PS Z2, Z6, Z1
	JMP update
plain:
	VMOVAPS Z2, Z1
update:
	VFNMADD231PS Z1, Z4, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, DI
	ADDQ $64, SI
	ADDQ $64, DX
	DECQ CX
	JNZ loop
done:
	VZEROUPPER
	RET

// func unscale16(grad *float32, n int, inv float32) (bad bool)
//
// grad ← grad·inv, sixteen values an instruction (AVX-512F); n is a multiple of
// 16. bad reports whether any product is infinite or NaN: v·0 is 0 for
// every finite v and NaN otherwise, summed in one register and tested once.
TEXT ·unscale16(SB), NOSPLIT, $0-25
	MOVQ grad+0(FP), DI
	MOVQ n+8(FP), CX
	VBROADCASTSS inv+16(FP), Z2
	VPXORD Z1, Z1, Z1
	VPXORD Z3, Z3, Z3
	SHRQ $4, CX
	TESTQ CX, CX
	JZ udone
uloop:
	VMULPS (DI), Z2, Z0
	VMOVUPS Z0, (DI)
	VFMADD231PS Z3, Z0, Z1
	ADDQ $64, DI
	DECQ CX
	JNZ uloop
udone:
	VCMPPS $3, Z1, Z1, K1
	KMOVW K1, AX
	TESTW AX, AX
	SETNE bad+24(FP)
	VZEROUPPER
	RET

// func adamw16(p, grad, m, v *float32, n int, a *adamw)
//
// AdamW's update (adamw.update), sixteen parameters an instruction
// (AVX-512F); n is a multiple of 16. Each operation rounds as Go's loop
// does (no fused multiply-add, the square root and quotients correctly
// rounded), so the two give the same bits wherever a stretch ends.
TEXT ·adamw16(SB), NOSPLIT, $0-48
	MOVQ p+0(FP), DI
	MOVQ grad+8(FP), SI
	MOVQ m+16(FP), DX
	MOVQ v+24(FP), R8
	MOVQ n+32(FP), CX
	MOVQ a+40(FP), AX
	SHRQ $4, CX
	VBROADCASTSS 0(AX), Z10  // decay
	VBROADCASTSS 4(AX), Z11  // b1
	VBROADCASTSS 8(AX), Z12  // b2
	VBROADCASTSS 12(AX), Z13 // c1
	VBROADCASTSS 16(AX), Z14 // c2
	VBROADCASTSS 20(AX), Z15 // eps
	VBROADCASTSS 24(AX), Z16 // stepSize
	VBROADCASTSS 28(AX), Z17 // bc2Sqrt
	VBROADCASTSS 32(AX), Z18 // gs
	TESTQ CX, CX
	JZ adone
aloop:
	VMULPS (SI), Z18, Z1  // gi = g·gs
	VMULPS (DX), Z11, Z2  // b1·m
	VMULPS Z1, Z13, Z3    // c1·gi
	VADDPS Z3, Z2, Z2     // m = b1·m + c1·gi
	VMOVUPS Z2, (DX)
	VMULPS (R8), Z12, Z4  // b2·v
	VMULPS Z1, Z14, Z5    // c2·gi
	VMULPS Z1, Z5, Z5     // c2·gi·gi
	VADDPS Z5, Z4, Z4     // v = b2·v + c2·gi·gi
	VMOVUPS Z4, (R8)
	VSQRTPS Z4, Z6
	VDIVPS Z17, Z6, Z6    // √v / √(1−β2ᵗ)
	VADDPS Z15, Z6, Z6    // + ε
	VMULPS Z2, Z16, Z7    // stepSize·m
	VDIVPS Z6, Z7, Z7     // stepSize·m / (√v/√(1−β2ᵗ) + ε)
	VMULPS (DI), Z10, Z0  // p·decay
	VSUBPS Z7, Z0, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, DI
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, R8
	DECQ CX
	JNZ aloop
adone:
	VZEROUPPER
	RET
