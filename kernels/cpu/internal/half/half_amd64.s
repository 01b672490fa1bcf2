//go:build amd64 && !purego

#include "textflag.h"

// ROWMASK sets K1 to the low n mod 16 bits (n in R10; AX and CX scratch)
// and R10 to n/16: a row's whole vectors of sixteen and its tail.
#define ROWMASK \
	MOVQ R10, CX; ANDQ $15, CX; MOVL $1, AX; SHLL CX, AX; DECL AX; KMOVW AX, K1; \
	SHRQ $4, R10

// Sixteen values loaded into z as float32 or stored from it, whole or under
// K1 (zeros in the lanes a load leaves out): halves (through Y1) ...
#define LOADH(z, addr) VCVTPH2PS addr, z
#define MLOADH(z, addr) VMOVDQU16.Z addr, K1, Y1; VCVTPH2PS Y1, z
#define STOREH(z, addr) VCVTPS2PH $0, z, Y1; VMOVDQU Y1, addr
#define MSTOREH(z, addr) VCVTPS2PH $0, z, Y1; VMOVDQU16 Y1, K1, addr

// ... and float32.
#define LOADF(z, addr) VMOVUPS addr, z
#define MLOADF(z, addr) VMOVUPS.Z addr, K1, z
#define STOREF(z, addr) VMOVUPS z, addr
#define MSTOREF(z, addr) VMOVUPS z, K1, addr

// ROWS: func(dst *D, ldd int, src *S, lds int, rows, n int): dst[r·ldd + j]
// = src[r·lds + j] converted, for r < rows and j < n (strides in elements),
// sixteen at a time (AVX-512F and BW), the last n mod 16 of a row by masked
// loads and stores, so nothing past a row is read or written. Values of S
// and D take 1<<SLOG and 1<<DLOG bytes.
#define ROWS(LOAD, MLOAD, STORE, MSTORE, SLOG, DLOG) \
	MOVQ dst+0(FP), DI; MOVQ ldd+8(FP), R8; SHLQ $DLOG, R8; \
	MOVQ src+16(FP), SI; MOVQ lds+24(FP), R9; SHLQ $SLOG, R9; \
	MOVQ rows+32(FP), DX; MOVQ n+40(FP), R10; ROWMASK; \
	TESTQ DX, DX; JZ done; \
row: \
	MOVQ DI, AX; MOVQ SI, BX; MOVQ R10, CX; TESTQ CX, CX; JZ tail; \
body: \
	LOAD(Z0, (BX)); STORE(Z0, (AX)); ADDQ $(16<<SLOG), BX; ADDQ $(16<<DLOG), AX; DECQ CX; JNZ body; \
tail: \
	KORTESTW K1, K1; JZ next; \
	MLOAD(Z0, (BX)); MSTORE(Z0, (AX)); \
next: \
	ADDQ R8, DI; ADDQ R9, SI; DECQ DX; JNZ row; \
done: \
	VZEROUPPER; RET

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

// func toFloatRows16(dst *float32, ldd int, src *uint16, lds int, rows, n int)
TEXT ·toFloatRows16(SB), NOSPLIT, $0-48
	ROWS(LOADH, MLOADH, STOREF, MSTOREF, 1, 2)

// func fromFloatRows16(dst *uint16, ldd int, src *float32, lds int, rows, n int)
//
// Rounding to nearest even.
TEXT ·fromFloatRows16(SB), NOSPLIT, $0-48
	ROWS(LOADF, MLOADF, STOREH, MSTOREH, 2, 1)

// func copyRows16(dst *float32, ldd int, src *float32, lds int, rows, n int)
TEXT ·copyRows16(SB), NOSPLIT, $0-48
	ROWS(LOADF, MLOADF, STOREF, MSTOREF, 2, 2)

// ... and BF16: loaded by zero-extending each value's bits into the top
// half of a lane; stored rounded to nearest even as BF16Bits rounds (a
// NaN's top bits with its quiet bit set), through Z2-Z4 and K2, from the
// constants BF16CONSTS sets.
#define LOADB(z, addr) VPMOVZXWD addr, z; VPSLLD $16, z, z
#define MLOADB(z, addr) VMOVDQU16.Z addr, K1, Y1; VPMOVZXWD Y1, z; VPSLLD $16, z, z
#define ROUNDB(z) \
	VPSRLD $16, z, Z3; VPANDD Z21, Z3, Z2; VPADDD Z2, z, Z2; VPADDD Z20, Z2, Z2; VPSRLD $16, Z2, Z2; \
	VPANDD Z22, z, Z4; VPCMPUD $6, Z23, Z4, K2; VPORD Z24, Z3, K2, Z2
#define STOREB(z, addr) ROUNDB(z); VPMOVDW Z2, addr
#define MSTOREB(z, addr) ROUNDB(z); VPMOVDW Z2, K1, addr

// BF16CONSTS sets Z20-Z24 to 0x7fff, 1, 0x7fffffff, 0x7f800000 (the
// largest bits below a NaN's) and 0x40 (BF16's quiet bit) in every lane.
#define BF16CONSTS \
	MOVL $0x7fff, AX; VPBROADCASTD AX, Z20; MOVL $1, AX; VPBROADCASTD AX, Z21; \
	MOVL $0x7fffffff, AX; VPBROADCASTD AX, Z22; MOVL $0x7f800000, AX; VPBROADCASTD AX, Z23; \
	MOVL $0x40, AX; VPBROADCASTD AX, Z24

// func bf16ToFloatRows16(dst *float32, ldd int, src *uint16, lds int, rows, n int)
TEXT ·bf16ToFloatRows16(SB), NOSPLIT, $0-48
	ROWS(LOADB, MLOADB, STOREF, MSTOREF, 1, 2)

// func bf16FromFloatRows16(dst *uint16, ldd int, src *float32, lds int, rows, n int)
TEXT ·bf16FromFloatRows16(SB), NOSPLIT, $0-48
	BF16CONSTS
	ROWS(LOADF, MLOADF, STOREB, MSTOREB, 2, 1)
