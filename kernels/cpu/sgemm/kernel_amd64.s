//go:build amd64 && !purego

#include "textflag.h"

// Macros shared by the plain kernels and the shifted ones (which differ only
// in where a row of B comes from), and by the dot-product kernel.

// The 8×48 AVX-512 tile: Z0-Z23 hold C (three vectors a row), Z24-Z26 the
// row of B, Z27-Z30 the broadcast elements of A (SI).
#define ZERO_8x48 \
	VPXORD Z0, Z0, Z0; VPXORD Z1, Z1, Z1; VPXORD Z2, Z2, Z2; VPXORD Z3, Z3, Z3 \
	VPXORD Z4, Z4, Z4; VPXORD Z5, Z5, Z5; VPXORD Z6, Z6, Z6; VPXORD Z7, Z7, Z7 \
	VPXORD Z8, Z8, Z8; VPXORD Z9, Z9, Z9; VPXORD Z10, Z10, Z10; VPXORD Z11, Z11, Z11 \
	VPXORD Z12, Z12, Z12; VPXORD Z13, Z13, Z13; VPXORD Z14, Z14, Z14; VPXORD Z15, Z15, Z15 \
	VPXORD Z16, Z16, Z16; VPXORD Z17, Z17, Z17; VPXORD Z18, Z18, Z18; VPXORD Z19, Z19, Z19 \
	VPXORD Z20, Z20, Z20; VPXORD Z21, Z21, Z21; VPXORD Z22, Z22, Z22; VPXORD Z23, Z23, Z23

// FMA_ROW_48 adds A's element at off(SI) times the row of B into one row of C.
#define FMA_ROW_48(off, bc, c0, c1, c2) \
	VBROADCASTSS off(SI), bc \
	VFMADD231PS Z24, bc, c0 \
	VFMADD231PS Z25, bc, c1 \
	VFMADD231PS Z26, bc, c2

// STEP_8x48 is one step of k: the row of B already in Z24-Z26.
#define STEP_8x48 \
	FMA_ROW_48(0, Z27, Z0, Z1, Z2) \
	FMA_ROW_48(4, Z28, Z3, Z4, Z5) \
	FMA_ROW_48(8, Z29, Z6, Z7, Z8) \
	FMA_ROW_48(12, Z30, Z9, Z10, Z11) \
	FMA_ROW_48(16, Z27, Z12, Z13, Z14) \
	FMA_ROW_48(20, Z28, Z15, Z16, Z17) \
	FMA_ROW_48(24, Z29, Z18, Z19, Z20) \
	FMA_ROW_48(28, Z30, Z21, Z22, Z23) \
	ADDQ $32, SI

// ADD_ROW_48 adds a row of the tile into C at DX and moves DX down a row
// (R8 bytes); PUT_ROW_48 overwrites it.
#define ADD_ROW_48(c0, c1, c2) \
	VADDPS (DX), c0, c0; VMOVUPS c0, (DX) \
	VADDPS 64(DX), c1, c1; VMOVUPS c1, 64(DX) \
	VADDPS 128(DX), c2, c2; VMOVUPS c2, 128(DX) \
	ADDQ R8, DX
#define PUT_ROW_48(c0, c1, c2) \
	VMOVUPS c0, (DX); VMOVUPS c1, 64(DX); VMOVUPS c2, 128(DX) \
	ADDQ R8, DX

// STORE_8x48 adds the tile into C, or overwrites C when add+off(FP) is
// false, and returns.
#define STORE_8x48(addflag, put) \
	CMPB addflag, $0 \
	JEQ put \
	ADD_ROW_48(Z0, Z1, Z2); ADD_ROW_48(Z3, Z4, Z5); ADD_ROW_48(Z6, Z7, Z8); ADD_ROW_48(Z9, Z10, Z11) \
	ADD_ROW_48(Z12, Z13, Z14); ADD_ROW_48(Z15, Z16, Z17); ADD_ROW_48(Z18, Z19, Z20); ADD_ROW_48(Z21, Z22, Z23) \
	VZEROUPPER; RET \
put: \
	PUT_ROW_48(Z0, Z1, Z2); PUT_ROW_48(Z3, Z4, Z5); PUT_ROW_48(Z6, Z7, Z8); PUT_ROW_48(Z9, Z10, Z11) \
	PUT_ROW_48(Z12, Z13, Z14); PUT_ROW_48(Z15, Z16, Z17); PUT_ROW_48(Z18, Z19, Z20); PUT_ROW_48(Z21, Z22, Z23) \
	VZEROUPPER; RET

// The 6×16 AVX2 tile: Y0-Y11 hold C (two vectors a row), Y12-Y13 the row
// of B, Y14-Y15 the broadcast elements of A (SI).
#define ZERO_6x16 \
	VXORPS Y0, Y0, Y0; VXORPS Y1, Y1, Y1; VXORPS Y2, Y2, Y2; VXORPS Y3, Y3, Y3 \
	VXORPS Y4, Y4, Y4; VXORPS Y5, Y5, Y5; VXORPS Y6, Y6, Y6; VXORPS Y7, Y7, Y7 \
	VXORPS Y8, Y8, Y8; VXORPS Y9, Y9, Y9; VXORPS Y10, Y10, Y10; VXORPS Y11, Y11, Y11

#define FMA_ROW_16(off, bc, c0, c1) \
	VBROADCASTSS off(SI), bc \
	VFMADD231PS Y12, bc, c0 \
	VFMADD231PS Y13, bc, c1

#define STEP_6x16 \
	FMA_ROW_16(0, Y14, Y0, Y1) \
	FMA_ROW_16(4, Y15, Y2, Y3) \
	FMA_ROW_16(8, Y14, Y4, Y5) \
	FMA_ROW_16(12, Y15, Y6, Y7) \
	FMA_ROW_16(16, Y14, Y8, Y9) \
	FMA_ROW_16(20, Y15, Y10, Y11) \
	ADDQ $24, SI

#define ADD_ROW_16(c0, c1) \
	VADDPS (DX), c0, c0; VMOVUPS c0, (DX) \
	VADDPS 32(DX), c1, c1; VMOVUPS c1, 32(DX) \
	ADDQ R8, DX
#define PUT_ROW_16(c0, c1) \
	VMOVUPS c0, (DX); VMOVUPS c1, 32(DX) \
	ADDQ R8, DX

#define STORE_6x16(addflag, put) \
	CMPB addflag, $0 \
	JEQ put \
	ADD_ROW_16(Y0, Y1); ADD_ROW_16(Y2, Y3); ADD_ROW_16(Y4, Y5) \
	ADD_ROW_16(Y6, Y7); ADD_ROW_16(Y8, Y9); ADD_ROW_16(Y10, Y11) \
	VZEROUPPER; RET \
put: \
	PUT_ROW_16(Y0, Y1); PUT_ROW_16(Y2, Y3); PUT_ROW_16(Y4, Y5) \
	PUT_ROW_16(Y6, Y7); PUT_ROW_16(Y8, Y9); PUT_ROW_16(Y10, Y11) \
	VZEROUPPER; RET

// HSUM leaves the sum of z's sixteen lanes in its lowest (AVX-512F
// shuffles only), with tmp as scratch.
#define HSUM(z, tmp) \
	VSHUFF32X4 $0x4E, z, z, tmp; VADDPS tmp, z, z \
	VSHUFF32X4 $0xB1, z, z, tmp; VADDPS tmp, z, z \
	VPERMILPS $0x4E, z, tmp; VADDPS tmp, z, z \
	VPERMILPS $0xB1, z, tmp; VADDPS tmp, z, z

// ROWS8 points AX, BX, DX, SI, R8-R11 at the eight rows src+at[i]·size
// (src in R13, at in CX), for elements of size bytes.
#define ROWS8(size) \
	MOVQ (CX), AX; LEAQ (R13)(AX*size), AX; \
	MOVQ 8(CX), BX; LEAQ (R13)(BX*size), BX; \
	MOVQ 16(CX), DX; LEAQ (R13)(DX*size), DX; \
	MOVQ 24(CX), SI; LEAQ (R13)(SI*size), SI; \
	MOVQ 32(CX), R8; LEAQ (R13)(R8*size), R8; \
	MOVQ 40(CX), R9; LEAQ (R13)(R9*size), R9; \
	MOVQ 48(CX), R10; LEAQ (R13)(R10*size), R10; \
	MOVQ 56(CX), R11; LEAQ (R13)(R11*size), R11

// NEXT8 moves the eight row pointers on by bytes.
#define NEXT8(bytes) \
	ADDQ $bytes, AX; ADDQ $bytes, BX; ADDQ $bytes, DX; ADDQ $bytes, SI; \
	ADDQ $bytes, R8; ADDQ $bytes, R9; ADDQ $bytes, R10; ADDQ $bytes, R11

// TRANSPOSE_STORE8 transposes the 8×8 block of rows Y0-Y7 (unpack,
// shuffle, then swap 128-bit halves; Y8-Y15 scratch) and stores its
// columns at DI, DI+R12, ..., leaving DI eight rows on.
#define TRANSPOSE_STORE8 \
	VUNPCKLPS Y1, Y0, Y8; VUNPCKHPS Y1, Y0, Y9; \
	VUNPCKLPS Y3, Y2, Y10; VUNPCKHPS Y3, Y2, Y11; \
	VUNPCKLPS Y5, Y4, Y12; VUNPCKHPS Y5, Y4, Y13; \
	VUNPCKLPS Y7, Y6, Y14; VUNPCKHPS Y7, Y6, Y15; \
	VSHUFPS $0x44, Y10, Y8, Y0; VSHUFPS $0xEE, Y10, Y8, Y1; \
	VSHUFPS $0x44, Y11, Y9, Y2; VSHUFPS $0xEE, Y11, Y9, Y3; \
	VSHUFPS $0x44, Y14, Y12, Y4; VSHUFPS $0xEE, Y14, Y12, Y5; \
	VSHUFPS $0x44, Y15, Y13, Y6; VSHUFPS $0xEE, Y15, Y13, Y7; \
	VPERM2F128 $0x20, Y4, Y0, Y8; VPERM2F128 $0x20, Y5, Y1, Y9; \
	VPERM2F128 $0x20, Y6, Y2, Y10; VPERM2F128 $0x20, Y7, Y3, Y11; \
	VPERM2F128 $0x31, Y4, Y0, Y12; VPERM2F128 $0x31, Y5, Y1, Y13; \
	VPERM2F128 $0x31, Y6, Y2, Y14; VPERM2F128 $0x31, Y7, Y3, Y15; \
	VMOVUPS Y8, (DI); ADDQ R12, DI; VMOVUPS Y9, (DI); ADDQ R12, DI; \
	VMOVUPS Y10, (DI); ADDQ R12, DI; VMOVUPS Y11, (DI); ADDQ R12, DI; \
	VMOVUPS Y12, (DI); ADDQ R12, DI; VMOVUPS Y13, (DI); ADDQ R12, DI; \
	VMOVUPS Y14, (DI); ADDQ R12, DI; VMOVUPS Y15, (DI); ADDQ R12, DI

// TRANSPOSE8(LOAD, SIZE, STEP): func(dst *float32, ldd int, src *T,
// at *[8]int, n int): dst[p·ldd + i] = src[at[i] + p] for i < 8 and p < n,
// n a multiple of 8, for values of T (SIZE bytes; eight of them STEP)
// loaded as float32 by LOAD: eight rows written across eight lanes of a
// panel, an 8×8 block at a time.
#define TRANSPOSE8(LOAD, SIZE, STEP) \
	MOVQ dst+0(FP), DI; MOVQ ldd+8(FP), R12; SHLQ $2, R12; \
	MOVQ src+16(FP), R13; MOVQ at+24(FP), CX; ROWS8(SIZE); \
	MOVQ n+32(FP), CX; SHRQ $3, CX; JZ done; \
loop: \
	LOAD((AX), Y0); LOAD((BX), Y1); LOAD((DX), Y2); LOAD((SI), Y3); \
	LOAD((R8), Y4); LOAD((R9), Y5); LOAD((R10), Y6); LOAD((R11), Y7); \
	TRANSPOSE_STORE8; NEXT8(STEP); DECQ CX; JNZ loop; \
done: \
	VZEROUPPER; RET

#define LOADF(addr, y) VMOVUPS addr, y
#define LOADH(addr, y) VCVTPH2PS addr, y

// func kernel8x48(kc int, a, b, c *float32, ldc int, add bool)
//
// C[i·ldc+j] (+)= Σₚ a[p·8+i]·b[p·48+j] for i < 8, j < 48 (adding to C when
// add, overwriting it otherwise): the AVX-512 microkernel.
TEXT ·kernel8x48(SB), NOSPLIT, $0-41
	MOVQ kc+0(FP), CX
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DI
	MOVQ c+24(FP), DX
	MOVQ ldc+32(FP), R8
	SHLQ $2, R8
	ZERO_8x48
	TESTQ CX, CX
	JZ store512
loop512:
	VMOVUPS (DI), Z24
	VMOVUPS 64(DI), Z25
	VMOVUPS 128(DI), Z26
	STEP_8x48
	ADDQ $192, DI
	DECQ CX
	JNZ loop512
store512:
	STORE_8x48(add+40(FP), put512)

// func kernel8x48s(kc int, a, b *float32, offs *int, c *float32, ldc int, add bool)
//
// As kernel8x48, with row p of B read in place at b[offs[p]+j]:
// C[i·ldc+j] (+)= Σₚ a[p·8+i]·b[offs[p]+j].
TEXT ·kernel8x48s(SB), NOSPLIT, $0-49
	MOVQ kc+0(FP), CX
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DI
	MOVQ offs+24(FP), R9
	MOVQ c+32(FP), DX
	MOVQ ldc+40(FP), R8
	SHLQ $2, R8
	ZERO_8x48
	TESTQ CX, CX
	JZ store512s
loop512s:
	MOVQ (R9), R10
	VMOVUPS (DI)(R10*4), Z24
	VMOVUPS 64(DI)(R10*4), Z25
	VMOVUPS 128(DI)(R10*4), Z26
	STEP_8x48
	ADDQ $8, R9
	DECQ CX
	JNZ loop512s
store512s:
	STORE_8x48(add+48(FP), put512s)

// func kernel6x16(kc int, a, b, c *float32, ldc int, add bool)
//
// C[i·ldc+j] (+)= Σₚ a[p·6+i]·b[p·16+j] for i < 6, j < 16 (adding to C when
// add, overwriting it otherwise): the AVX2+FMA microkernel.
TEXT ·kernel6x16(SB), NOSPLIT, $0-41
	MOVQ kc+0(FP), CX
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DI
	MOVQ c+24(FP), DX
	MOVQ ldc+32(FP), R8
	SHLQ $2, R8
	ZERO_6x16
	TESTQ CX, CX
	JZ store256
loop256:
	VMOVUPS (DI), Y12
	VMOVUPS 32(DI), Y13
	STEP_6x16
	ADDQ $64, DI
	DECQ CX
	JNZ loop256
store256:
	STORE_6x16(add+40(FP), put256)

// func kernel6x16s(kc int, a, b *float32, offs *int, c *float32, ldc int, add bool)
//
// As kernel6x16, with row p of B read in place at b[offs[p]+j].
TEXT ·kernel6x16s(SB), NOSPLIT, $0-49
	MOVQ kc+0(FP), CX
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DI
	MOVQ offs+24(FP), R9
	MOVQ c+32(FP), DX
	MOVQ ldc+40(FP), R8
	SHLQ $2, R8
	ZERO_6x16
	TESTQ CX, CX
	JZ store256s
loop256s:
	MOVQ (R9), R10
	VMOVUPS (DI)(R10*4), Y12
	VMOVUPS 32(DI)(R10*4), Y13
	STEP_6x16
	ADDQ $8, R9
	DECQ CX
	JNZ loop256s
store256s:
	STORE_6x16(add+48(FP), put256s)

// func fmaLoop512(n int)
//
// Runs n rounds of 24 independent AVX-512 FMAs (n·24·32 flops): the core's
// FMA peak, with no loads to wait on.
TEXT ·fmaLoop512(SB), NOSPLIT, $0-8
	MOVQ n+0(FP), CX
	ZERO_8x48
	VPXORD Z24, Z24, Z24
	VPXORD Z25, Z25, Z25
peak512:
	VFMADD231PS Z24, Z25, Z0; VFMADD231PS Z24, Z25, Z1; VFMADD231PS Z24, Z25, Z2; VFMADD231PS Z24, Z25, Z3
	VFMADD231PS Z24, Z25, Z4; VFMADD231PS Z24, Z25, Z5; VFMADD231PS Z24, Z25, Z6; VFMADD231PS Z24, Z25, Z7
	VFMADD231PS Z24, Z25, Z8; VFMADD231PS Z24, Z25, Z9; VFMADD231PS Z24, Z25, Z10; VFMADD231PS Z24, Z25, Z11
	VFMADD231PS Z24, Z25, Z12; VFMADD231PS Z24, Z25, Z13; VFMADD231PS Z24, Z25, Z14; VFMADD231PS Z24, Z25, Z15
	VFMADD231PS Z24, Z25, Z16; VFMADD231PS Z24, Z25, Z17; VFMADD231PS Z24, Z25, Z18; VFMADD231PS Z24, Z25, Z19
	VFMADD231PS Z24, Z25, Z20; VFMADD231PS Z24, Z25, Z21; VFMADD231PS Z24, Z25, Z22; VFMADD231PS Z24, Z25, Z23
	DECQ CX
	JNZ peak512
	VZEROUPPER
	RET

// func fmaLoop256(n int)
//
// Runs n rounds of 12 independent AVX2 FMAs (n·12·16 flops).
TEXT ·fmaLoop256(SB), NOSPLIT, $0-8
	MOVQ n+0(FP), CX
	ZERO_6x16
	VXORPS Y12, Y12, Y12
	VXORPS Y13, Y13, Y13
peak256:
	VFMADD231PS Y12, Y13, Y0; VFMADD231PS Y12, Y13, Y1; VFMADD231PS Y12, Y13, Y2; VFMADD231PS Y12, Y13, Y3
	VFMADD231PS Y12, Y13, Y4; VFMADD231PS Y12, Y13, Y5; VFMADD231PS Y12, Y13, Y6; VFMADD231PS Y12, Y13, Y7
	VFMADD231PS Y12, Y13, Y8; VFMADD231PS Y12, Y13, Y9; VFMADD231PS Y12, Y13, Y10; VFMADD231PS Y12, Y13, Y11
	DECQ CX
	JNZ peak256
	VZEROUPPER
	RET

// DOT_ROW adds the sixteen products of a row of B (bp at SI) with the four
// rows of A in Z24-Z27 into accumulators c0-c3.
#define DOT_ROW(bp, c0, c1, c2, c3) \
	VMOVUPS (bp)(SI*1), Z28 \
	VFMADD231PS Z28, Z24, c0; VFMADD231PS Z28, Z25, c1 \
	VFMADD231PS Z28, Z26, c2; VFMADD231PS Z28, Z27, c3

// ROWPTR sets reg to base + 4·offs[i] (offs at DI).
#define ROWPTR(i, base, reg) MOVQ (i*8)(DI), reg; LEAQ (base)(reg*4), reg

// func dot4x6(steps int, a *float32, aoffs *[4]int, b *float32, boffs *[6]int, out *[24]float32)
//
// out[i·6+j] = Σ a[aoffs[i]+p]·b[boffs[j]+p] over p < 16·steps: a 4×6 tile
// of dot products along rows of A and B read in place (AVX-512). Z0-Z23
// accumulate sixteen partial sums each (row i of A, row j of B in Z(i·6+j)),
// reduced at the end; Z24-Z27 hold the rows of A, Z28 a row of B.
TEXT ·dot4x6(SB), NOSPLIT, $0-48
	MOVQ steps+0(FP), CX
	MOVQ a+8(FP), SI
	MOVQ aoffs+16(FP), DI
	ROWPTR(0, SI, R8)
	ROWPTR(1, SI, R9)
	ROWPTR(2, SI, R10)
	ROWPTR(3, SI, R11)
	MOVQ b+24(FP), SI
	MOVQ boffs+32(FP), DI
	ROWPTR(0, SI, R12)
	ROWPTR(1, SI, R13)
	ROWPTR(2, SI, AX)
	ROWPTR(3, SI, BX)
	ROWPTR(4, SI, DX)
	ROWPTR(5, SI, DI)
	XORQ SI, SI
	ZERO_8x48
	TESTQ CX, CX
	JZ reduce
loop:
	VMOVUPS (R8)(SI*1), Z24
	VMOVUPS (R9)(SI*1), Z25
	VMOVUPS (R10)(SI*1), Z26
	VMOVUPS (R11)(SI*1), Z27
	DOT_ROW(R12, Z0, Z6, Z12, Z18)
	DOT_ROW(R13, Z1, Z7, Z13, Z19)
	DOT_ROW(AX, Z2, Z8, Z14, Z20)
	DOT_ROW(BX, Z3, Z9, Z15, Z21)
	DOT_ROW(DX, Z4, Z10, Z16, Z22)
	DOT_ROW(DI, Z5, Z11, Z17, Z23)
	ADDQ $64, SI
	DECQ CX
	JNZ loop
reduce:
	MOVQ out+40(FP), SI

	HSUM(Z0, Z30); VMOVSS X0, 0(SI)
	HSUM(Z1, Z30); VMOVSS X1, 4(SI)
	HSUM(Z2, Z30); VMOVSS X2, 8(SI)
	HSUM(Z3, Z30); VMOVSS X3, 12(SI)
	HSUM(Z4, Z30); VMOVSS X4, 16(SI)
	HSUM(Z5, Z30); VMOVSS X5, 20(SI)
	HSUM(Z6, Z30); VMOVSS X6, 24(SI)
	HSUM(Z7, Z30); VMOVSS X7, 28(SI)
	HSUM(Z8, Z30); VMOVSS X8, 32(SI)
	HSUM(Z9, Z30); VMOVSS X9, 36(SI)
	HSUM(Z10, Z30); VMOVSS X10, 40(SI)
	HSUM(Z11, Z30); VMOVSS X11, 44(SI)
	HSUM(Z12, Z30); VMOVSS X12, 48(SI)
	HSUM(Z13, Z30); VMOVSS X13, 52(SI)
	HSUM(Z14, Z30); VMOVSS X14, 56(SI)
	HSUM(Z15, Z30); VMOVSS X15, 60(SI)
	HSUM(Z16, Z30); VMOVSS X16, 64(SI)
	HSUM(Z17, Z30); VMOVSS X17, 68(SI)
	HSUM(Z18, Z30); VMOVSS X18, 72(SI)
	HSUM(Z19, Z30); VMOVSS X19, 76(SI)
	HSUM(Z20, Z30); VMOVSS X20, 80(SI)
	HSUM(Z21, Z30); VMOVSS X21, 84(SI)
	HSUM(Z22, Z30); VMOVSS X22, 88(SI)
	HSUM(Z23, Z30); VMOVSS X23, 92(SI)
	VZEROUPPER
	RET

// func transpose8x8(dst *float32, ldd int, src *float32, at *[8]int, n int)
TEXT ·transpose8x8(SB), NOSPLIT, $0-40
	TRANSPOSE8(LOADF, 4, 32)

// func transpose8x8h(dst *float32, ldd int, src *uint16, at *[8]int, n int)
//
// transpose8x8 from rows of IEEE halves, converted as they are loaded
// (VCVTPH2PS, F16C, exact).
TEXT ·transpose8x8h(SB), NOSPLIT, $0-40
	TRANSPOSE8(LOADH, 2, 16)
