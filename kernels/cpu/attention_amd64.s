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

// func axpy16(y, x *float32, w float32, n int)
//
// y[i] += w·x[i] over n values, the product rounded and then added (the
// same bits as axpy's Go loop), sixteen an instruction, the last n mod 16
// under K2 (AVX-512F).
TEXT ·axpy16(SB), NOSPLIT, $0-32
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	VBROADCASTSS w+16(FP), Z2
	MOVQ n+24(FP), CX
	TAILMASK
	TESTQ CX, CX
	JZ tail
loop:
	VMULPS (SI), Z2, Z1
	VADDPS (DI), Z1, Z1
	VMOVUPS Z1, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ loop
tail:
	KORTESTW K2, K2
	JZ done
	VMOVUPS.Z (SI), K2, Z1
	VMULPS Z1, Z2, Z1
	VMOVUPS.Z (DI), K2, Z3
	VADDPS Z3, Z1, Z1
	VMOVUPS Z1, K2, (DI)
done:
	VZEROUPPER
	RET

// func geluIn16(t, x *float32, n int, c1, c3 float32)
//
// t = c1·(x + ((c3·x)·x)·x) over n values, each operation rounded as
// geluRow's Go loop rounds it (its −2·√(2/π) and 0.044715 in c1 and c3),
// sixteen an instruction, the last n mod 16 under K2 (AVX-512F).
TEXT ·geluIn16(SB), NOSPLIT, $0-32
	MOVQ t+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS c1+24(FP), Z4
	VBROADCASTSS c3+28(FP), Z5
	TAILMASK
	TESTQ CX, CX
	JZ tail
loop:
	VMOVUPS (SI), Z0
	VMULPS Z0, Z5, Z1
	VMULPS Z0, Z1, Z1
	VMULPS Z0, Z1, Z1
	VADDPS Z1, Z0, Z1
	VMULPS Z1, Z4, Z1
	VMOVUPS Z1, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ loop
tail:
	KORTESTW K2, K2
	JZ done
	VMOVUPS.Z (SI), K2, Z0
	VMULPS Z0, Z5, Z1
	VMULPS Z0, Z1, Z1
	VMULPS Z0, Z1, Z1
	VADDPS Z1, Z0, Z1
	VMULPS Z1, Z4, Z1
	VMOVUPS Z1, K2, (DI)
done:
	VZEROUPPER
	RET

// func geluOut16(y, x, t *float32, n int)
//
// y = x / (1 + t) over n values (y may be x), as geluRow's Go loop
// rounds it, sixteen an instruction, the last n mod 16 under K2
// (AVX-512F).
TEXT ·geluOut16(SB), NOSPLIT, $0-32
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ t+16(FP), DX
	MOVQ n+24(FP), CX
	MOVL $0x3f800000, AX
	VPBROADCASTD AX, Z3
	TAILMASK
	TESTQ CX, CX
	JZ tail
loop:
	VADDPS (DX), Z3, Z1
	VMOVUPS (SI), Z0
	VDIVPS Z1, Z0, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, DI
	DECQ CX
	JNZ loop
tail:
	KORTESTW K2, K2
	JZ done
	VMOVUPS.Z (DX), K2, Z1
	VADDPS Z1, Z3, Z1
	VMOVUPS.Z (SI), K2, Z0
	VDIVPS Z1, Z0, Z0
	VMOVUPS Z0, K2, (DI)
done:
	VZEROUPPER
	RET
