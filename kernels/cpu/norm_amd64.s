//go:build amd64 && !purego

#include "textflag.h"
#include "vec_amd64.h"

// The batch-norm passes over one channel of an N×C×HW array: planes planes
// of n values, ld values apart, sixteen values an instruction (AVX-512F and
// BW). Every value of a plane is taken: the last n mod 16 by masked loads
// and stores (K2), which read and write nothing past the plane and load
// zeros into the lanes they leave out. Sums are taken in float32 lanes over
// a plane and added up in float64 over the planes. Each pass is written once
// and assembled twice: over float32 planes, and over F16 planes (AMP's
// activations) loaded with VCVTPH2PS and stored with VCVTPS2PH (rounding to
// nearest even), so that both run the same float32 arithmetic in the same
// order. The Go callers (norm.go) run the same loops in Go on other CPUs.

// PLANES sets, for n in CX and ld in R9, K2 and R10 to the tail's mask and
// whole vectors of a plane (TAILMASK), and R9 to the bytes from where a
// plane's whole vectors end to the next plane, for values of 1<<LOG bytes.
#define PLANES(LOG) \
	TAILMASK; MOVQ CX, R10; \
	SHLQ $LOG, R9; MOVQ R10, R11; SHLQ $(LOG+4), R11; SUBQ R11, R9

// NEXT moves the optional pointer r on by R9, unless it is nil.
#define NEXT(r, skip) TESTQ r, r; JZ skip; ADDQ R9, r; skip:

// ADDPLANE adds the sixteen lanes of z, in float64, to the low value of x
// (Z31 scratch).
#define ADDPLANE(z, zx, x) HSUM(z, Z31); VCVTSS2SD zx, zx, zx; VADDSD zx, x, x

// SUM: func(x *T, planes, ld, n int) float64 = Σ x.
#define SUM(LOAD, MLOAD, STEP, LOG) \
	MOVQ x+0(FP), SI; MOVQ planes+8(FP), R8; MOVQ ld+16(FP), R9; MOVQ n+24(FP), CX; PLANES(LOG); \
	VXORPD X12, X12, X12; TESTQ R8, R8; JZ done; \
plane: \
	VPXORD Z0, Z0, Z0; VPXORD Z1, Z1, Z1; MOVQ R10, CX; TESTQ CX, CX; JZ tail; \
loop: \
	LOAD(Z2, (SI)); VADDPS Z2, Z0, Z0; ADDQ $STEP, SI; DECQ CX; JZ tail; \
	LOAD(Z3, (SI)); VADDPS Z3, Z1, Z1; ADDQ $STEP, SI; DECQ CX; JNZ loop; \
tail: \
	KORTESTW K2, K2; JZ planedone; \
	MLOAD(Z2, (SI)); VADDPS Z2, Z0, Z0; \
planedone: \
	VADDPS Z1, Z0, Z0; ADDPLANE(Z0, X0, X12); \
	ADDQ R9, SI; DECQ R8; JNZ plane; \
done: \
	VMOVSD X12, ret+32(FP); VZEROUPPER; RET

// SUMSQDEV: func(x *T, planes, ld, n int, mean float32) float64 =
// Σ (x − mean)², the tail's left-out lanes zeroed after the subtraction.
#define SUMSQDEV(LOAD, MLOAD, STEP, LOG) \
	MOVQ x+0(FP), SI; MOVQ planes+8(FP), R8; MOVQ ld+16(FP), R9; MOVQ n+24(FP), CX; PLANES(LOG); \
	VBROADCASTSS mean+32(FP), Z2; VXORPD X12, X12, X12; TESTQ R8, R8; JZ done; \
plane: \
	VPXORD Z0, Z0, Z0; VPXORD Z1, Z1, Z1; MOVQ R10, CX; TESTQ CX, CX; JZ tail; \
loop: \
	LOAD(Z3, (SI)); VSUBPS Z2, Z3, Z3; VFMADD231PS Z3, Z3, Z0; ADDQ $STEP, SI; DECQ CX; JZ tail; \
	LOAD(Z4, (SI)); VSUBPS Z2, Z4, Z4; VFMADD231PS Z4, Z4, Z1; ADDQ $STEP, SI; DECQ CX; JNZ loop; \
tail: \
	KORTESTW K2, K2; JZ planedone; \
	MLOAD(Z3, (SI)); VSUBPS.Z Z2, Z3, K2, Z3; VFMADD231PS Z3, Z3, Z0; \
planedone: \
	VADDPS Z1, Z0, Z0; ADDPLANE(Z0, X0, X12); \
	ADDQ R9, SI; DECQ R8; JNZ plane; \
done: \
	VMOVSD X12, ret+40(FP); VZEROUPPER; RET

// AFFINE: func(y, x, res *T, planes, ld, n int, scale, shift float32, relu
// bool): y = x·scale + shift (+ res when res is not nil), through the ReLU
// with relu.
#define AFFINE(LOAD, MLOAD, STORE, MSTORE, STEP, LOG) \
	MOVQ y+0(FP), DI; MOVQ x+8(FP), SI; MOVQ res+16(FP), DX; \
	MOVQ planes+24(FP), R8; MOVQ ld+32(FP), R9; MOVQ n+40(FP), CX; PLANES(LOG); \
	VBROADCASTSS scale+48(FP), Z1; VBROADCASTSS shift+52(FP), Z2; VPXORD Z3, Z3, Z3; \
	MOVBLZX relu+56(FP), AX; TESTQ R8, R8; JZ done; \
plane: \
	MOVQ R10, CX; TESTQ CX, CX; JZ tail; \
loop: \
	LOAD(Z4, (SI)); VMOVAPS Z2, Z0; VFMADD231PS Z4, Z1, Z0; \
	TESTQ DX, DX; JZ nores; LOAD(Z5, (DX)); VADDPS Z5, Z0, Z0; ADDQ $STEP, DX; \
nores: \
	TESTQ AX, AX; JZ store; VMAXPS Z0, Z3, Z0; \
store: \
	STORE(Z0, (DI)); ADDQ $STEP, SI; ADDQ $STEP, DI; DECQ CX; JNZ loop; \
tail: \
	KORTESTW K2, K2; JZ planedone; \
	MLOAD(Z4, (SI)); VMOVAPS Z2, Z0; VFMADD231PS Z4, Z1, Z0; \
	TESTQ DX, DX; JZ tnores; MLOAD(Z5, (DX)); VADDPS Z5, Z0, Z0; \
tnores: \
	TESTQ AX, AX; JZ tstore; VMAXPS Z0, Z3, Z0; \
tstore: \
	MSTORE(Z0, (DI)); \
planedone: \
	ADDQ R9, SI; ADDQ R9, DI; NEXT(DX, nextres); DECQ R8; JNZ plane; \
done: \
	VZEROUPPER; RET

// MASKG sets z (dy) to zero where y (at DX) is not > 0: the ReLU's mask
// (Z6 zero, Z4 and K1 scratch).
#define MASKG(LOAD, z) \
	LOAD(Z4, (DX)); VCMPPS $6, Z6, Z4, K1; VMOVAPS.Z z, K1, z

// BNGRAD: func(dy, y, x *T, planes, ld, n int, mean float32, gout *T)
// (sumG, sumGX float64): with g = dy, or dy where y > 0 when y is not nil,
// Σ g and Σ g·(x − mean), storing g into gout when it is not nil. The
// tail's left-out lanes load zero, so their g is zero.
#define BNGRAD(LOAD, MLOAD, STORE, MSTORE, STEP, LOG) \
	MOVQ dy+0(FP), SI; MOVQ y+8(FP), DX; MOVQ x+16(FP), BX; MOVQ gout+56(FP), DI; \
	MOVQ planes+24(FP), R8; MOVQ ld+32(FP), R9; MOVQ n+40(FP), CX; PLANES(LOG); \
	VBROADCASTSS mean+48(FP), Z5; VPXORD Z6, Z6, Z6; VXORPD X12, X12, X12; VXORPD X13, X13, X13; \
	TESTQ R8, R8; JZ done; \
plane: \
	VPXORD Z0, Z0, Z0; VPXORD Z1, Z1, Z1; MOVQ R10, CX; TESTQ CX, CX; JZ tail; \
loop: \
	LOAD(Z2, (SI)); \
	TESTQ DX, DX; JZ nomask; MASKG(LOAD, Z2); ADDQ $STEP, DX; \
nomask: \
	TESTQ DI, DI; JZ nostore; STORE(Z2, (DI)); ADDQ $STEP, DI; \
nostore: \
	VADDPS Z2, Z0, Z0; LOAD(Z3, (BX)); VSUBPS Z5, Z3, Z3; VFMADD231PS Z3, Z2, Z1; \
	ADDQ $STEP, SI; ADDQ $STEP, BX; DECQ CX; JNZ loop; \
tail: \
	KORTESTW K2, K2; JZ planedone; \
	MLOAD(Z2, (SI)); \
	TESTQ DX, DX; JZ tnomask; MASKG(MLOAD, Z2); \
tnomask: \
	TESTQ DI, DI; JZ tnostore; MSTORE(Z2, (DI)); \
tnostore: \
	VADDPS Z2, Z0, Z0; MLOAD(Z3, (BX)); VSUBPS Z5, Z3, Z3; VFMADD231PS Z3, Z2, Z1; \
planedone: \
	ADDPLANE(Z0, X0, X12); ADDPLANE(Z1, X1, X13); \
	ADDQ R9, SI; ADDQ R9, BX; NEXT(DX, nexty); NEXT(DI, nextg); DECQ R8; JNZ plane; \
done: \
	VMOVSD X12, sumG+64(FP); VMOVSD X13, sumGX+72(FP); VZEROUPPER; RET

// BNAPPLY: func(dx, dy, y, x *T, planes, ld, n int, a, b, c float32):
// dx = a·g + b·x + c with g as in BNGRAD.
#define BNAPPLY(LOAD, MLOAD, STORE, MSTORE, STEP, LOG) \
	MOVQ dx+0(FP), DI; MOVQ dy+8(FP), SI; MOVQ y+16(FP), DX; MOVQ x+24(FP), BX; \
	MOVQ planes+32(FP), R8; MOVQ ld+40(FP), R9; MOVQ n+48(FP), CX; PLANES(LOG); \
	VBROADCASTSS a+56(FP), Z5; VBROADCASTSS b+60(FP), Z7; VBROADCASTSS c+64(FP), Z8; VPXORD Z6, Z6, Z6; \
	TESTQ R8, R8; JZ done; \
plane: \
	MOVQ R10, CX; TESTQ CX, CX; JZ tail; \
loop: \
	LOAD(Z2, (SI)); \
	TESTQ DX, DX; JZ nomask; MASKG(LOAD, Z2); ADDQ $STEP, DX; \
nomask: \
	VMOVAPS Z8, Z0; VFMADD231PS Z2, Z5, Z0; LOAD(Z3, (BX)); VFMADD231PS Z3, Z7, Z0; STORE(Z0, (DI)); \
	ADDQ $STEP, SI; ADDQ $STEP, BX; ADDQ $STEP, DI; DECQ CX; JNZ loop; \
tail: \
	KORTESTW K2, K2; JZ planedone; \
	MLOAD(Z2, (SI)); \
	TESTQ DX, DX; JZ tnomask; MASKG(MLOAD, Z2); \
tnomask: \
	VMOVAPS Z8, Z0; VFMADD231PS Z2, Z5, Z0; MLOAD(Z3, (BX)); VFMADD231PS Z3, Z7, Z0; MSTORE(Z0, (DI)); \
planedone: \
	ADDQ R9, SI; ADDQ R9, BX; ADDQ R9, DI; NEXT(DX, nexty); DECQ R8; JNZ plane; \
done: \
	VZEROUPPER; RET

// func sum16(x *float32, planes, ld, n int) float64
TEXT ·sum16(SB), NOSPLIT, $0-40
	SUM(LOAD32, MLOAD32, STEP32, LOG32)

// func sum16h(x *uint16, planes, ld, n int) float64
TEXT ·sum16h(SB), NOSPLIT, $0-40
	SUM(LOAD16, MLOAD16, STEP16, LOG16)

// func sumSqDev16(x *float32, planes, ld, n int, mean float32) float64
TEXT ·sumSqDev16(SB), NOSPLIT, $0-48
	SUMSQDEV(LOAD32, MLOAD32, STEP32, LOG32)

// func sumSqDev16h(x *uint16, planes, ld, n int, mean float32) float64
TEXT ·sumSqDev16h(SB), NOSPLIT, $0-48
	SUMSQDEV(LOAD16, MLOAD16, STEP16, LOG16)

// func affine16(y, x, res *float32, planes, ld, n int, scale, shift float32, relu bool)
TEXT ·affine16(SB), NOSPLIT, $0-57
	AFFINE(LOAD32, MLOAD32, STORE32, MSTORE32, STEP32, LOG32)

// func affine16h(y, x, res *uint16, planes, ld, n int, scale, shift float32, relu bool)
TEXT ·affine16h(SB), NOSPLIT, $0-57
	AFFINE(LOAD16, MLOAD16, STORE16, MSTORE16, STEP16, LOG16)

// func bnGrad16(dy, y, x *float32, planes, ld, n int, mean float32, gout *float32) (sumG, sumGX float64)
TEXT ·bnGrad16(SB), NOSPLIT, $0-80
	BNGRAD(LOAD32, MLOAD32, STORE32, MSTORE32, STEP32, LOG32)

// func bnGrad16h(dy, y, x *uint16, planes, ld, n int, mean float32, gout *uint16) (sumG, sumGX float64)
TEXT ·bnGrad16h(SB), NOSPLIT, $0-80
	BNGRAD(LOAD16, MLOAD16, STORE16, MSTORE16, STEP16, LOG16)

// func bnApply16(dx, dy, y, x *float32, planes, ld, n int, a, b, c float32)
TEXT ·bnApply16(SB), NOSPLIT, $0-68
	BNAPPLY(LOAD32, MLOAD32, STORE32, MSTORE32, STEP32, LOG32)

// func bnApply16h(dx, dy, y, x *uint16, planes, ld, n int, a, b, c float32)
TEXT ·bnApply16h(SB), NOSPLIT, $0-68
	BNAPPLY(LOAD16, MLOAD16, STORE16, MSTORE16, STEP16, LOG16)
