//go:build amd64 && !purego

#include "textflag.h"
#include "vec_amd64.h"

// BINARY: func(y, a, b *T, n int): y = a OP b over n values, sixteen an
// instruction (AVX-512F and BW), the last n mod 16 by masked loads and
// stores; over float32 values or F16 ones (converted as they are loaded and
// stored), the same float32 arithmetic.
#define BINARY(OP, LOAD, MLOAD, STORE, MSTORE, STEP) \
	MOVQ y+0(FP), DI; MOVQ a+8(FP), SI; MOVQ b+16(FP), DX; MOVQ n+24(FP), CX; TAILMASK; \
	TESTQ CX, CX; JZ tail; \
loop: \
	LOAD(Z0, (SI)); LOAD(Z1, (DX)); OP Z1, Z0, Z0; STORE(Z0, (DI)); \
	ADDQ $STEP, SI; ADDQ $STEP, DX; ADDQ $STEP, DI; DECQ CX; JNZ loop; \
tail: \
	KORTESTW K2, K2; JZ done; \
	MLOAD(Z0, (SI)); MLOAD(Z1, (DX)); OP Z1, Z0, Z0; MSTORE(Z0, (DI)); \
done: \
	VZEROUPPER; RET

// SUMROWS: func(acc *float64, x *T, rows, ld, n int): acc[j] += x[r·ld + j]
// for each row r in turn and j < n, each value widened to float64 and
// added in row order (as Go's loop would), sixteen columns at a time; the
// last n mod 16 columns are loaded masked and added into acc's padding of
// sixteen past n.
#define SUMROWS(LOAD, MLOAD, STEP, LOG) \
	MOVQ acc+0(FP), DI; MOVQ x+8(FP), SI; MOVQ rows+16(FP), R8; MOVQ ld+24(FP), R9; SHLQ $LOG, R9; \
	MOVQ n+32(FP), CX; TAILMASK; MOVQ CX, R10; \
	TESTQ R8, R8; JZ done; \
row: \
	MOVQ DI, AX; MOVQ SI, BX; MOVQ R10, CX; TESTQ CX, CX; JZ tail; \
loop: \
	LOAD(Z0, (BX)); SUMCOLS; ADDQ $STEP, BX; ADDQ $128, AX; DECQ CX; JNZ loop; \
tail: \
	KORTESTW K2, K2; JZ next; \
	MLOAD(Z0, (BX)); SUMCOLS; \
next: \
	ADDQ R9, SI; DECQ R8; JNZ row; \
done: \
	VZEROUPPER; RET

// SUMCOLS adds Z0's sixteen values, widened, to the sixteen float64 at AX.
#define SUMCOLS \
	VCVTPS2PD Y0, Z1; VEXTRACTF32X8 $1, Z0, Y2; VCVTPS2PD Y2, Z2; \
	VADDPD (AX), Z1, Z1; VADDPD 64(AX), Z2, Z2; VMOVUPD Z1, (AX); VMOVUPD Z2, 64(AX)

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

// func add16(y, a, b *float32, n int)
TEXT ·add16(SB), NOSPLIT, $0-32
	BINARY(VADDPS, LOAD32, MLOAD32, STORE32, MSTORE32, STEP32)

// func sub16(y, a, b *float32, n int)
TEXT ·sub16(SB), NOSPLIT, $0-32
	BINARY(VSUBPS, LOAD32, MLOAD32, STORE32, MSTORE32, STEP32)

// func mul16(y, a, b *float32, n int)
TEXT ·mul16(SB), NOSPLIT, $0-32
	BINARY(VMULPS, LOAD32, MLOAD32, STORE32, MSTORE32, STEP32)

// func div16(y, a, b *float32, n int)
TEXT ·div16(SB), NOSPLIT, $0-32
	BINARY(VDIVPS, LOAD32, MLOAD32, STORE32, MSTORE32, STEP32)

// func add16h(y, a, b *uint16, n int)
TEXT ·add16h(SB), NOSPLIT, $0-32
	BINARY(VADDPS, LOAD16, MLOAD16, STORE16, MSTORE16, STEP16)

// func sub16h(y, a, b *uint16, n int)
TEXT ·sub16h(SB), NOSPLIT, $0-32
	BINARY(VSUBPS, LOAD16, MLOAD16, STORE16, MSTORE16, STEP16)

// func mul16h(y, a, b *uint16, n int)
TEXT ·mul16h(SB), NOSPLIT, $0-32
	BINARY(VMULPS, LOAD16, MLOAD16, STORE16, MSTORE16, STEP16)

// func div16h(y, a, b *uint16, n int)
TEXT ·div16h(SB), NOSPLIT, $0-32
	BINARY(VDIVPS, LOAD16, MLOAD16, STORE16, MSTORE16, STEP16)

// func reluGrad32h(dx, dy, y *uint16, n int)
//
// ReLU's gradient on F16 bits, thirty-two values an instruction (AVX-512BW),
// nothing converted: dx = dy where 0 < y ≤ +Inf (bits 0x0001 to 0x7C00,
// tested as y − 1 ≤ 0x7BFF unsigned, so that a NaN y passes nothing), +0
// elsewhere; the last n mod 32 by masked loads and stores.
TEXT ·reluGrad32h(SB), NOSPLIT, $0-32
	MOVQ dx+0(FP), DI
	MOVQ dy+8(FP), SI
	MOVQ y+16(FP), DX
	MOVQ n+24(FP), CX
	MOVQ CX, R11
	ANDQ $31, CX
	MOVQ $1, R12
	SHLQ CX, R12
	DECQ R12
	KMOVD R12, K2
	MOVQ R11, CX
	SHRQ $5, CX
	MOVL $1, AX
	VPBROADCASTW AX, Z3
	MOVL $0x7BFF, AX
	VPBROADCASTW AX, Z4
	TESTQ CX, CX
	JZ htail
hloop:
	VMOVDQU16 (DX), Z0
	VPSUBW Z3, Z0, Z0
	VPCMPUW $2, Z4, Z0, K1
	VMOVDQU16.Z (SI), K1, Z1
	VMOVDQU16 Z1, (DI)
	ADDQ $64, DI
	ADDQ $64, SI
	ADDQ $64, DX
	DECQ CX
	JNZ hloop
htail:
	KORTESTD K2, K2
	JZ hdone
	VMOVDQU16.Z (DX), K2, Z0
	VPSUBW Z3, Z0, Z0
	VPCMPUW $2, Z4, Z0, K2, K1
	VMOVDQU16.Z (SI), K1, Z1
	VMOVDQU16 Z1, K2, (DI)
hdone:
	VZEROUPPER
	RET

// func sumRows16(acc *float64, x *float32, rows, ld, n int)
TEXT ·sumRows16(SB), NOSPLIT, $0-40
	SUMROWS(LOAD32, MLOAD32, STEP32, LOG32)

// func sumRows16h(acc *float64, x *uint16, rows, ld, n int)
TEXT ·sumRows16h(SB), NOSPLIT, $0-40
	SUMROWS(LOAD16, MLOAD16, STEP16, LOG16)

// func expShift8(z *float32, n int, shift float32, c *[13][8]float32) (sum float32)
//
// z ← exp(z − shift) in place, eight values an instruction (AVX2 and FMA),
// and the sum of the results; n is a multiple of 8. The exponential is
// expf's (expf.go): x = k·ln 2 + r with k = ⌊x·log2 e + ½⌋, the same
// polynomial in r, 2^k built in the exponent bits. x is clamped to
// [−87.34, 88.38], where k stays in float32's normal exponents: the
// softmaxes that call it have x ≤ 0. c holds the constants (expConsts).
TEXT ·expShift8(SB), NOSPLIT, $0-36
	MOVQ z+0(FP), DI
	MOVQ n+8(FP), CX
	VBROADCASTSS shift+16(FP), Y15
	MOVQ c+24(FP), R8
	VMOVUPS 0(R8), Y14   // the low clamp
	VMOVUPS 32(R8), Y13  // the high clamp
	VMOVUPS 64(R8), Y12  // log2 e
	VMOVUPS 96(R8), Y11  // ½
	VMOVUPS 128(R8), Y10 // ln 2, high part
	VMOVUPS 160(R8), Y9  // ln 2, low part
	VMOVUPS 352(R8), Y8  // 1
	VXORPS Y7, Y7, Y7    // the sum
	SHRQ $3, CX
	TESTQ CX, CX
	JZ edone
eloop:
	VMOVUPS (DI), Y0
	VSUBPS Y15, Y0, Y0
	VMAXPS Y14, Y0, Y0
	VMINPS Y13, Y0, Y0
	VMOVAPS Y0, Y1
	VFMADD213PS Y11, Y12, Y1 // x·log2 e + ½
	VROUNDPS $1, Y1, Y1      // k = floor
	VFNMADD231PS Y10, Y1, Y0 // r = x − k·ln2hi
	VFNMADD231PS Y9, Y1, Y0  //     − k·ln2lo
	VMOVUPS 192(R8), Y2
	VFMADD213PS 224(R8), Y0, Y2
	VFMADD213PS 256(R8), Y0, Y2
	VFMADD213PS 288(R8), Y0, Y2
	VFMADD213PS 320(R8), Y0, Y2
	VFMADD213PS Y11, Y0, Y2 // p (its last coefficient is ½ to float32's precision)
	VMULPS Y0, Y0, Y3       // r²
	VADDPS Y8, Y0, Y4       // r + 1
	VFMADD231PS Y3, Y2, Y4  // p·r² + r + 1
	VCVTTPS2DQ Y1, Y1       // 2^k: (k + 127) << 23 as bits
	VPADDD 384(R8), Y1, Y1
	VPSLLD $23, Y1, Y1
	VMULPS Y1, Y4, Y4
	VMOVUPS Y4, (DI)
	VADDPS Y4, Y7, Y7
	ADDQ $32, DI
	DECQ CX
	JNZ eloop
edone:
	VEXTRACTF128 $1, Y7, X6
	VADDPS X6, X7, X7
	VHADDPS X7, X7, X7
	VHADDPS X7, X7, X7
	VMOVSS X7, sum+32(FP)
	VZEROUPPER
	RET
