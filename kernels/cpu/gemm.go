package cpu

import (
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu/sgemm"
)

// Gemm computes a (batched) matrix product; see kernels.GemmParams. One
// product runs on every core; a batch of products runs one product per core.
// F16 operands are converted as their blocks are packed (sgemm.Half), not
// into a float32 copy of the whole matrix first.
func (c *Backend) Gemm(p kernels.GemmParams, a, b, cb kernels.Buf) {
	kernels.CheckGemm(p, a, b, cb)
	batch := max(p.Batch, 1)
	var cs []float32
	var done func()
	if p.Beta != 0 {
		cs, done = inout(cb)
	} else {
		cs, done = out(cb)
	}
	lda, ldb := p.K, p.N
	if p.TransA {
		lda = p.M
	}
	if p.TransB {
		ldb = p.K
	}
	if batch == 1 {
		c.mm.GemmOp(p.M, p.N, p.K, p.Alpha, operand(a, 0, lda, p.TransA, true), operand(b, 0, ldb, p.TransB, false), p.Beta, cs, p.N)
	} else {
		one := c.mm.WithThreads(1)
		parallel(batch, 1, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				one.GemmOp(p.M, p.N, p.K, p.Alpha, operand(a, i*p.StrideA, lda, p.TransA, true),
					operand(b, i*p.StrideB, ldb, p.TransB, false), p.Beta, cs[i*p.StrideC:], p.N)
			}
		})
	}
	done()
}

// operand is the product's A (isA) or B from buf's elements from off on,
// stored with row stride ld, transposed when trans, as sgemm.MatrixA and
// MatrixB lay them out (CheckGemm has checked the sizes).
func operand(buf kernels.Buf, off, ld int, trans, isA bool) sgemm.Operand {
	m := sgemm.MatrixB(nil, ld, trans)
	if isA {
		m = sgemm.MatrixA(nil, ld, trans)
	}
	if buf.DType == kernels.F16 {
		return sgemm.Half{Data: u16s(buf)[off:], Free: m.Free, Shared: m.Shared}
	}
	m.Data = f32s(buf)[off:]
	return m
}
