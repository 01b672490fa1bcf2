//go:build amd64 && !purego

#include "textflag.h"

// HSUM leaves the sum of z's sixteen lanes in its lowest (AVX-512F
// shuffles only), with tmp as scratch.
#define HSUM(z, tmp) \
	VSHUFF32X4 $0x4E, z, z, tmp; VADDPS tmp, z, z \
	VSHUFF32X4 $0xB1, z, z, tmp; VADDPS tmp, z, z \
	VPERMILPS $0x4E, z, tmp; VADDPS tmp, z, z \
	VPERMILPS $0xB1, z, tmp; VADDPS tmp, z, z

// The batch-norm passes over one image's plane of a channel, sixteen
// values an instruction (AVX-512F). n is a multiple of 16; the Go callers
// (norm.go) do the tail and run the same loops in Go on other CPUs.

// func sum16(x *float32, n int) float32
TEXT ·sum16(SB), NOSPLIT, $0-20
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	SHRQ $4, CX
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	TESTQ CX, CX
	JZ sumdone
sumloop:
	VADDPS (SI), Z0, Z0
	ADDQ $64, SI
	DECQ CX
	JZ sumdone
	VADDPS (SI), Z1, Z1
	ADDQ $64, SI
	DECQ CX
	JNZ sumloop
sumdone:
	VADDPS Z1, Z0, Z0
	HSUM(Z0, Z31)
	VMOVSS X0, ret+16(FP)
	VZEROUPPER
	RET

// func sumSqDev16(x *float32, n int, mean float32) float32
TEXT ·sumSqDev16(SB), NOSPLIT, $0-28
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	SHRQ $4, CX
	VBROADCASTSS mean+16(FP), Z2
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	TESTQ CX, CX
	JZ sqdone
sqloop:
	VMOVUPS (SI), Z3
	VSUBPS Z2, Z3, Z3
	VFMADD231PS Z3, Z3, Z0
	ADDQ $64, SI
	DECQ CX
	JZ sqdone
	VMOVUPS (SI), Z4
	VSUBPS Z2, Z4, Z4
	VFMADD231PS Z4, Z4, Z1
	ADDQ $64, SI
	DECQ CX
	JNZ sqloop
sqdone:
	VADDPS Z1, Z0, Z0
	HSUM(Z0, Z31)
	VMOVSS X0, ret+24(FP)
	VZEROUPPER
	RET

// func affine16(y, x, res *float32, n int, scale, shift float32, relu bool)
//
// y = x·scale + shift (+ res when res is not nil), through the ReLU with relu.
TEXT ·affine16(SB), NOSPLIT, $0-41
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ res+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $4, CX
	VBROADCASTSS scale+32(FP), Z1
	VBROADCASTSS shift+36(FP), Z2
	VPXORD Z3, Z3, Z3
	MOVBLZX relu+40(FP), AX
	TESTQ CX, CX
	JZ affdone
affloop:
	VMOVAPS Z2, Z0
	VFMADD231PS (SI), Z1, Z0
	TESTQ DX, DX
	JZ affnores
	VADDPS (DX), Z0, Z0
	ADDQ $64, DX
affnores:
	TESTQ AX, AX
	JZ affstore
	VMAXPS Z0, Z3, Z0
affstore:
	VMOVUPS Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ affloop
affdone:
	VZEROUPPER
	RET

// func bnGrad16(dy, y, x *float32, n int, mean float32, gout *float32) (sumG, sumGX float32)
//
// With g = dy, or dy where y > 0 when y is not nil: Σ g and Σ g·(x − mean),
// storing g into gout when it is not nil.
TEXT ·bnGrad16(SB), NOSPLIT, $0-56
	MOVQ dy+0(FP), SI
	MOVQ y+8(FP), DX
	MOVQ x+16(FP), BX
	MOVQ n+24(FP), CX
	SHRQ $4, CX
	VBROADCASTSS mean+32(FP), Z5
	MOVQ gout+40(FP), DI
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z6, Z6, Z6
	TESTQ CX, CX
	JZ graddone
gradloop:
	VMOVUPS (SI), Z2
	TESTQ DX, DX
	JZ gradnomask
	VMOVUPS (DX), Z4
	VCMPPS $6, Z6, Z4, K1
	VMOVAPS.Z Z2, K1, Z2
	ADDQ $64, DX
gradnomask:
	TESTQ DI, DI
	JZ gradnostore
	VMOVUPS Z2, (DI)
	ADDQ $64, DI
gradnostore:
	VADDPS Z2, Z0, Z0
	VMOVUPS (BX), Z3
	VSUBPS Z5, Z3, Z3
	VFMADD231PS Z3, Z2, Z1
	ADDQ $64, SI
	ADDQ $64, BX
	DECQ CX
	JNZ gradloop
graddone:
	HSUM(Z0, Z31)
	HSUM(Z1, Z31)
	VMOVSS X0, sumG+48(FP)
	VMOVSS X1, sumGX+52(FP)
	VZEROUPPER
	RET

// func bnApply16(dx, dy, y, x *float32, n int, a, b, c float32)
//
// dx = a·g + b·x + c with g = dy, or dy where y > 0 when y is not nil.
TEXT ·bnApply16(SB), NOSPLIT, $0-52
	MOVQ dx+0(FP), DI
	MOVQ dy+8(FP), SI
	MOVQ y+16(FP), DX
	MOVQ x+24(FP), BX
	MOVQ n+32(FP), CX
	SHRQ $4, CX
	VBROADCASTSS a+40(FP), Z5
	VBROADCASTSS b+44(FP), Z6
	VBROADCASTSS c+48(FP), Z7
	VPXORD Z8, Z8, Z8
	TESTQ CX, CX
	JZ applydone
applyloop:
	VMOVUPS (SI), Z2
	TESTQ DX, DX
	JZ applynomask
	VMOVUPS (DX), Z4
	VCMPPS $6, Z8, Z4, K1
	VMOVAPS.Z Z2, K1, Z2
	ADDQ $64, DX
applynomask:
	VMOVAPS Z7, Z0
	VFMADD231PS Z2, Z5, Z0
	VFMADD231PS (BX), Z6, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, BX
	ADDQ $64, DI
	DECQ CX
	JNZ applyloop
applydone:
	VZEROUPPER
	RET

// The same passes over F16 planes (AMP's activations), loaded with
// VCVTPH2PS and stored with VCVTPS2PH (rounding to nearest even): the same
// float32 arithmetic as on float32 planes converted first, without the
// converted copy.

// func sum16h(x *uint16, n int) float32
TEXT ·sum16h(SB), NOSPLIT, $0-20
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	SHRQ $4, CX
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	TESTQ CX, CX
	JZ hsumdone
hsumloop:
	VCVTPH2PS (SI), Z2
	VADDPS Z2, Z0, Z0
	ADDQ $32, SI
	DECQ CX
	JZ hsumdone
	VCVTPH2PS (SI), Z3
	VADDPS Z3, Z1, Z1
	ADDQ $32, SI
	DECQ CX
	JNZ hsumloop
hsumdone:
	VADDPS Z1, Z0, Z0
	HSUM(Z0, Z31)
	VMOVSS X0, ret+16(FP)
	VZEROUPPER
	RET

// func sumSqDev16h(x *uint16, n int, mean float32) float32
TEXT ·sumSqDev16h(SB), NOSPLIT, $0-28
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	SHRQ $4, CX
	VBROADCASTSS mean+16(FP), Z2
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	TESTQ CX, CX
	JZ hsqdone
hsqloop:
	VCVTPH2PS (SI), Z3
	VSUBPS Z2, Z3, Z3
	VFMADD231PS Z3, Z3, Z0
	ADDQ $32, SI
	DECQ CX
	JZ hsqdone
	VCVTPH2PS (SI), Z4
	VSUBPS Z2, Z4, Z4
	VFMADD231PS Z4, Z4, Z1
	ADDQ $32, SI
	DECQ CX
	JNZ hsqloop
hsqdone:
	VADDPS Z1, Z0, Z0
	HSUM(Z0, Z31)
	VMOVSS X0, ret+24(FP)
	VZEROUPPER
	RET

// func affine16h(y, x, res *uint16, n int, scale, shift float32, relu bool)
TEXT ·affine16h(SB), NOSPLIT, $0-41
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ res+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $4, CX
	VBROADCASTSS scale+32(FP), Z1
	VBROADCASTSS shift+36(FP), Z2
	VPXORD Z3, Z3, Z3
	MOVBLZX relu+40(FP), AX
	TESTQ CX, CX
	JZ haffdone
haffloop:
	VCVTPH2PS (SI), Z4
	VMOVAPS Z2, Z0
	VFMADD231PS Z4, Z1, Z0
	TESTQ DX, DX
	JZ haffnores
	VCVTPH2PS (DX), Z5
	VADDPS Z5, Z0, Z0
	ADDQ $32, DX
haffnores:
	TESTQ AX, AX
	JZ haffstore
	VMAXPS Z0, Z3, Z0
haffstore:
	VCVTPS2PH $0, Z0, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	DECQ CX
	JNZ haffloop
haffdone:
	VZEROUPPER
	RET

// func bnGrad16h(dy, y, x *uint16, n int, mean float32, gout *uint16) (sumG, sumGX float32)
TEXT ·bnGrad16h(SB), NOSPLIT, $0-56
	MOVQ dy+0(FP), SI
	MOVQ y+8(FP), DX
	MOVQ x+16(FP), BX
	MOVQ n+24(FP), CX
	SHRQ $4, CX
	VBROADCASTSS mean+32(FP), Z5
	MOVQ gout+40(FP), DI
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z6, Z6, Z6
	TESTQ CX, CX
	JZ hgraddone
hgradloop:
	VCVTPH2PS (SI), Z2
	TESTQ DX, DX
	JZ hgradnomask
	VCVTPH2PS (DX), Z4
	VCMPPS $6, Z6, Z4, K1
	VMOVAPS.Z Z2, K1, Z2
	ADDQ $32, DX
hgradnomask:
	TESTQ DI, DI
	JZ hgradnostore
	VCVTPS2PH $0, Z2, (DI)
	ADDQ $32, DI
hgradnostore:
	VADDPS Z2, Z0, Z0
	VCVTPH2PS (BX), Z3
	VSUBPS Z5, Z3, Z3
	VFMADD231PS Z3, Z2, Z1
	ADDQ $32, SI
	ADDQ $32, BX
	DECQ CX
	JNZ hgradloop
hgraddone:
	HSUM(Z0, Z31)
	HSUM(Z1, Z31)
	VMOVSS X0, sumG+48(FP)
	VMOVSS X1, sumGX+52(FP)
	VZEROUPPER
	RET

// func bnApply16h(dx, dy, y, x *uint16, n int, a, b, c float32)
TEXT ·bnApply16h(SB), NOSPLIT, $0-52
	MOVQ dx+0(FP), DI
	MOVQ dy+8(FP), SI
	MOVQ y+16(FP), DX
	MOVQ x+24(FP), BX
	MOVQ n+32(FP), CX
	SHRQ $4, CX
	VBROADCASTSS a+40(FP), Z5
	VBROADCASTSS b+44(FP), Z6
	VBROADCASTSS c+48(FP), Z7
	VPXORD Z8, Z8, Z8
	TESTQ CX, CX
	JZ happlydone
happlyloop:
	VCVTPH2PS (SI), Z2
	TESTQ DX, DX
	JZ happlynomask
	VCVTPH2PS (DX), Z4
	VCMPPS $6, Z8, Z4, K1
	VMOVAPS.Z Z2, K1, Z2
	ADDQ $32, DX
happlynomask:
	VMOVAPS Z7, Z0
	VFMADD231PS Z2, Z5, Z0
	VCVTPH2PS (BX), Z3
	VFMADD231PS Z3, Z6, Z0
	VCVTPS2PH $0, Z0, (DI)
	ADDQ $32, SI
	ADDQ $32, BX
	ADDQ $32, DI
	DECQ CX
	JNZ happlyloop
happlydone:
	VZEROUPPER
	RET
