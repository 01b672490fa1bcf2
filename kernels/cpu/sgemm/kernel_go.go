package sgemm

import "unsafe"

// kernelGo is the plain Go microkernel, 4×4: C[i·ldc+j] (+)= Σₚ a[p·4+i]·b[p·4+j].
// Sixteen accumulators in locals keep it in registers on any architecture.
func kernelGo(kc int, a, b, c *float32, ldc int, add bool) {
	as, bs := unsafe.Slice(a, 4*kc), unsafe.Slice(b, 4*kc)
	var c00, c01, c02, c03, c10, c11, c12, c13 float32
	var c20, c21, c22, c23, c30, c31, c32, c33 float32
	for p := 0; p < kc; p++ {
		ap, bp := as[4*p:4*p+4], bs[4*p:4*p+4]
		b0, b1, b2, b3 := bp[0], bp[1], bp[2], bp[3]
		a0 := ap[0]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		a1 := ap[1]
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		a2 := ap[2]
		c20 += a2 * b0
		c21 += a2 * b1
		c22 += a2 * b2
		c23 += a2 * b3
		a3 := ap[3]
		c30 += a3 * b0
		c31 += a3 * b1
		c32 += a3 * b2
		c33 += a3 * b3
	}
	cs := unsafe.Slice(c, 3*ldc+4)
	if !add {
		clear(cs[0:4])
		clear(cs[ldc : ldc+4])
		clear(cs[2*ldc : 2*ldc+4])
		clear(cs[3*ldc : 3*ldc+4])
	}
	r := cs[0:4]
	r[0], r[1], r[2], r[3] = r[0]+c00, r[1]+c01, r[2]+c02, r[3]+c03
	r = cs[ldc : ldc+4]
	r[0], r[1], r[2], r[3] = r[0]+c10, r[1]+c11, r[2]+c12, r[3]+c13
	r = cs[2*ldc : 2*ldc+4]
	r[0], r[1], r[2], r[3] = r[0]+c20, r[1]+c21, r[2]+c22, r[3]+c23
	r = cs[3*ldc : 3*ldc+4]
	r[0], r[1], r[2], r[3] = r[0]+c30, r[1]+c31, r[2]+c32, r[3]+c33
}
