package cpu

import (
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu/internal/half"
	"github.com/leangrad/leangrad/kernels/cpu/sgemm"
)

// Gemm computes a (batched) matrix product; see kernels.GemmParams. One
// product runs on every core; a batch of products runs one product per core.
// 16-bit operands are converted as their blocks are packed (sgemm.Half,
// sgemm.BF16), not into a float32 copy of the whole matrix first, and a
// 16-bit C is computed
// in float32 scratch and rounded into C a column of tiles at a time, as
// each is finished (sgemm's GemmOpTiles), hot in cache.
func (c *Backend) Gemm(p kernels.GemmParams, a, b, cb kernels.Buf) {
	kernels.CheckGemm(p, a, b, cb)
	batch := max(p.Batch, 1)
	var cs []float32
	var ch []uint16 // a 16-bit C
	if cb.DType.Half() {
		ch, cs = u16s(cb), getScratch(cb.N)
		defer putScratch(cs)
		if p.Beta != 0 {
			convertInto(cs, cb)
		}
	} else {
		cs = f32s(cb)
	}
	roundRows := half.FromFloat32Rows
	if cb.DType == kernels.BF16 {
		roundRows = half.BF16FromFloat32Rows
	}
	lda, ldb := p.K, p.N
	if p.TransA {
		lda = p.M
	}
	if p.TransB {
		ldb = p.K
	}
	product := func(mu *sgemm.Multiplier, i int) {
		a, b := operand(a, i*p.StrideA, lda, p.TransA, true), operand(b, i*p.StrideB, ldb, p.TransB, false)
		c := cs[i*p.StrideC:]
		if ch == nil {
			mu.GemmOp(p.M, p.N, p.K, p.Alpha, a, b, p.Beta, c, p.N)
			return
		}
		h := ch[i*p.StrideC:]
		mu.GemmOpTiles(p.M, p.N, p.K, p.Alpha, a, b, p.Beta, c, p.N, func(i0, i1, j0, j1 int) {
			at := i0*p.N + j0
			roundRows(h[at:], p.N, c[at:], p.N, i1-i0, j1-j0)
		})
	}
	if batch == 1 {
		product(c.mm, 0)
		return
	}
	one := c.mm.WithThreads(1)
	parallel(batch, 1, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			product(one, i)
		}
	})
}

// operand is the product's A (isA) or B from buf's elements from off on,
// stored with row stride ld, transposed when trans, as sgemm.MatrixA and
// MatrixB lay them out (CheckGemm has checked the sizes).
func operand(buf kernels.Buf, off, ld int, trans, isA bool) sgemm.Operand {
	m := sgemm.MatrixB(nil, ld, trans)
	if isA {
		m = sgemm.MatrixA(nil, ld, trans)
	}
	switch buf.DType {
	case kernels.F16:
		return sgemm.Half{Data: u16s(buf)[off:], Free: m.Free, Shared: m.Shared}
	case kernels.BF16:
		return sgemm.BF16{Data: u16s(buf)[off:], Free: m.Free, Shared: m.Shared}
	}
	m.Data = f32s(buf)[off:]
	return m
}
