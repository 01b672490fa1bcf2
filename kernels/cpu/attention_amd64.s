//go:build amd64 && !purego

#include "textflag.h"
#include "vec_amd64.h"

// func dot16(a, b *float32, n int) float32
//
// Σ a[i]·b[i] as dotLanes defines it: sixteen lanes, lane l summing the
// products of the indices ≡ l mod 16 in order (each product rounded, then
// added: VMULPS and VADDPS, not a fused multiply-add), the last n mod 16
// added under K2 so the lanes they miss are untouched, then the lanes
// summed as HSUM pairs them (AVX-512F).
TEXT ·dot16(SB), NOSPLIT, $0-28
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DX
	MOVQ n+16(FP), CX
	TAILMASK
	VPXORD Z0, Z0, Z0
	TESTQ CX, CX
	JZ tail
loop:
	VMOVUPS (SI), Z1
	VMULPS (DX), Z1, Z1
	VADDPS Z1, Z0, Z0
	ADDQ $64, SI
	ADDQ $64, DX
	DECQ CX
	JNZ loop
tail:
	KORTESTW K2, K2
	JZ sum
	VMOVUPS.Z (SI), K2, Z1
	VMOVUPS.Z (DX), K2, Z2
	VMULPS Z2, Z1, Z1
	VADDPS Z1, Z0, K2, Z0
sum:
	HSUM(Z0, Z1)
	VMOVSS X0, ret+24(FP)
	VZEROUPPER
	RET

// PASS runs BODY over CX values sixteen at a time, then the last CX mod 16
// under K2 (TAILMASK), BODY(LOAD, STORE) reading its operands with LOAD
// and writing its result with STORE (vec_amd64.h's LOAD32 and STORE32, or
// their masked MLOAD32 and MSTORE32); ADVANCE steps the pointers by 64
// bytes.
#define PASS(BODY, ADVANCE) \
	TAILMASK; TESTQ CX, CX; JZ tail; \
loop: \
	BODY(LOAD32, STORE32); ADVANCE; DECQ CX; JNZ loop; \
tail: \
	KORTESTW K2, K2; JZ done; \
	BODY(MLOAD32, MSTORE32); \
done: \
	VZEROUPPER; RET

// func axpy16(y, x *float32, w float32, n int)
//
// y[i] += w·x[i] over n values, the product rounded and then added (the
// same bits as axpy's Go loop), sixteen an instruction (AVX-512F).
#define AXPY(LOAD, STORE) LOAD(Z1, (SI)); VMULPS Z1, Z2, Z1; LOAD(Z3, (DI)); VADDPS Z3, Z1, Z1; STORE(Z1, (DI))
#define STEP2 ADDQ $64, SI; ADDQ $64, DI
TEXT ·axpy16(SB), NOSPLIT, $0-32
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	VBROADCASTSS w+16(FP), Z2
	MOVQ n+24(FP), CX
	PASS(AXPY, STEP2)

// func geluIn16(t, x *float32, n int, c1, c3 float32)
//
// t = c1·(x + ((c3·x)·x)·x) over n values, each operation rounded as
// geluRow's Go loop rounds it (its −2·√(2/π) and 0.044715 in c1 and c3),
// sixteen an instruction (AVX-512F).
#define GELUIN(LOAD, STORE) LOAD(Z0, (SI)); VMULPS Z0, Z5, Z1; VMULPS Z0, Z1, Z1; VMULPS Z0, Z1, Z1; VADDPS Z1, Z0, Z1; VMULPS Z1, Z4, Z1; STORE(Z1, (DI))
TEXT ·geluIn16(SB), NOSPLIT, $0-32
	MOVQ t+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS c1+24(FP), Z4
	VBROADCASTSS c3+28(FP), Z5
	PASS(GELUIN, STEP2)

// func geluOut16(y, x, t *float32, n int)
//
// y = x / (1 + t) over n values (y may be x), as geluRow's Go loop
// rounds it, sixteen an instruction (AVX-512F).
#define STEP3 ADDQ $64, SI; ADDQ $64, DI; ADDQ $64, DX
#define GELUOUT(LOAD, STORE) LOAD(Z1, (DX)); VADDPS Z1, Z3, Z1; LOAD(Z0, (SI)); VDIVPS Z1, Z0, Z0; STORE(Z0, (DI))
TEXT ·geluOut16(SB), NOSPLIT, $0-32
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ t+16(FP), DX
	MOVQ n+24(FP), CX
	MOVL $0x3f800000, AX
	VPBROADCASTD AX, Z3
	PASS(GELUOUT, STEP3)
