package cpu

import (
	"fmt"

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
	c.checkGemm(p, a, b, cb)
	c.gemm(c.mm, p, a, b, cb)
}

// checkGemm is kernels.CheckGemm, or CheckGemmPacked for a B that
// Prepack packed.
func (c *Backend) checkGemm(p kernels.GemmParams, a, b, cb kernels.Buf) {
	if p.PackedB {
		kernels.CheckGemmPacked(c.PrepackLen(p.K, p.N), p, a, b, cb)
		return
	}
	kernels.CheckGemm(p, a, b, cb)
}

// checkGemmEpilogue is kernels.CheckGemmEpilogue, for a packed B too.
func (c *Backend) checkGemmEpilogue(p kernels.GemmParams, e kernels.Epilogue, a, b, cb kernels.Buf) {
	c.checkGemm(p, a, b, cb)
	kernels.CheckEpilogue(p, e, cb)
}

// PrepackLen implements kernels.Prepacker.
func (c *Backend) PrepackLen(k, n int) int { return c.mm.PackedLen(k, n) }

// Prepack implements kernels.Prepacker: B in the panels this backend's
// products pack it into (sgemm.Multiplier.PackB), 16-bit values widened
// to float32 as the products widen them.
func (c *Backend) Prepack(dst, b kernels.Buf, k, n int, trans bool) {
	if k <= 0 || n <= 0 {
		panic(fmt.Sprintf("cpu: prepacking a %d×%d B", k, n))
	}
	kernels.CheckF32("prepacked B", dst)
	kernels.CheckLen("prepacked B", c.PrepackLen(k, n), dst)
	kernels.CheckLen("B to prepack", k*n, b)
	ldb := n
	if trans {
		ldb = k
	}
	c.mm.PackB(f32s(dst), operand(b, 0, ldb, trans, false), k, n)
}

// operandB is a product's B, the i-th of a batch: Prepack's panels for a
// PackedB, else the matrix as operand reads it.
func (c *Backend) operandB(p kernels.GemmParams, b kernels.Buf, i int) sgemm.Operand {
	if p.PackedB {
		return c.mm.Packed(f32s(b), p.K, p.N)
	}
	ldb := p.N
	if p.TransB {
		ldb = p.K
	}
	return operand(b, i*p.StrideB, ldb, p.TransB, false)
}

// GemmStoppable is GemmEpilogue, or Gemm for a zero e, that stops part way
// once stop is closed (see kernels.Stoppable): the product's
// goroutines look at stop before each block of A, and a batch before each
// product. It reports whether the product ran whole; when it did not, C
// is partly written.
func (c *Backend) GemmStoppable(p kernels.GemmParams, e kernels.Epilogue, a, b, cb kernels.Buf, stop <-chan struct{}) bool {
	mm := c.mm.WithStop(stop)
	if e == (kernels.Epilogue{}) {
		c.checkGemm(p, a, b, cb)
		c.gemm(mm, p, a, b, cb)
	} else {
		c.checkGemmEpilogue(p, e, a, b, cb)
		c.gemmEpilogue(mm, p, e, a, b, cb)
	}
	return !mm.Stopped()
}

// gemm is Gemm on mm's goroutines.
func (c *Backend) gemm(mm *sgemm.Multiplier, p kernels.GemmParams, a, b, cb kernels.Buf) {
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
	round := roundRows(cb.DType)
	lda := p.K
	if p.TransA {
		lda = p.M
	}
	product := func(mu *sgemm.Multiplier, i int) {
		a, b := operand(a, i*p.StrideA, lda, p.TransA, true), c.operandB(p, b, i)
		c := cs[i*p.StrideC:]
		if ch == nil {
			mu.GemmOp(p.M, p.N, p.K, p.Alpha, a, b, p.Beta, c, p.N)
			return
		}
		h := ch[i*p.StrideC:]
		mu.GemmOpTiles(p.M, p.N, p.K, p.Alpha, a, b, p.Beta, c, p.N, func(i0, i1, j0, j1 int) {
			at := i0*p.N + j0
			round(h[at:], p.N, c[at:], p.N, i1-i0, j1-j0)
		})
	}
	if batch == 1 {
		product(mm, 0)
		return
	}
	one := mm.WithThreads(1)
	parallel(batch, 1, func(lo, hi int) {
		for i := lo; i < hi && !one.Stopped(); i++ {
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

// GemmEpilogue computes a product and its epilogue (kernels.Epilogue):
// the bias, the residual and the activation (or its derivative) are
// applied to each block of C as GemmOpTiles finishes it, in float32 and
// before a 16-bit C is rounded, so C is stored once. A 16-bit pre-activation is rounded into
// Aux before the activation reads it, as the backward will. The bias
// gradients are Reduce's sums.
func (c *Backend) GemmEpilogue(p kernels.GemmParams, e kernels.Epilogue, a, b, cb kernels.Buf) {
	c.checkGemmEpilogue(p, e, a, b, cb)
	c.gemmEpilogue(c.mm, p, e, a, b, cb)
}

// gemmEpilogue is GemmEpilogue on mm's goroutines.
func (c *Backend) gemmEpilogue(mm *sgemm.Multiplier, p kernels.GemmParams, e kernels.Epilogue, a, b, cb kernels.Buf) {
	var cs []float32
	var ch []uint16
	if cb.DType.Half() {
		ch, cs = u16s(cb), getScratch(cb.N)
		defer putScratch(cs)
	} else {
		cs = f32s(cb)
	}
	toF32, fromF32 := half.ToFloat32, half.FromFloat32
	if cb.DType == kernels.BF16 {
		toF32, fromF32 = half.BF16ToFloat32, half.BF16FromFloat32
	}
	var bias []float32 // rounded to a 16-bit C's dtype, as C adds it
	switch {
	case e.Bias.DType.Half(): // C's dtype
		bias = make([]float32, e.Bias.N)
		toF32(bias, u16s(e.Bias))
	case e.Bias.Valid():
		bias = f32s(e.Bias)
		if cb.DType.Half() {
			h := make([]uint16, len(bias))
			fromF32(h, bias)
			bias = make([]float32, len(h))
			toF32(bias, h)
		}
	}
	var act *kernels.UnaryDef
	if e.Act != 0 {
		act = e.Act.Def()
	}
	lda := p.K
	if p.TransA {
		lda = p.M
	}
	mm.GemmOpTiles(p.M, p.N, p.K, p.Alpha, operand(a, 0, lda, p.TransA, true), c.operandB(p, b, 0), 0, cs, p.N,
		func(i0, i1, j0, j1 int) {
			var pre []float32 // a row's 16-bit pre-activation widened, as Aux holds it
			if e.Act != 0 && ch != nil {
				pre = make([]float32, j1-j0)
			}
			for i := i0; i < i1; i++ {
				row, at := cs[i*p.N+j0:i*p.N+j1], i*p.N+j0
				if bias != nil {
					addInto(row, bias[j0:j1])
				}
				if r := e.Residual; r.Valid() {
					addRow(row, r, at)
				}
				if e.Act == 0 {
					continue
				}
				var x []float32 // the activation's input
				switch {
				case e.Grad && ch != nil:
					x = pre
					toF32(x, u16s(e.Aux)[at:at+len(row)])
				case e.Grad:
					x = f32s(e.Aux)[at : at+len(row)]
				case ch != nil:
					aux := u16s(e.Aux)[at : at+len(row)]
					fromF32(aux, row)
					x = pre
					toF32(x, aux)
				default:
					copy(f32s(e.Aux)[at:at+len(row)], row)
					x = row
				}
				switch {
				case e.Grad:
					for j, v := range x {
						row[j] = act.Grad(row[j], v, 0)
					}
				case e.Act == kernels.GELU:
					geluRow(row, x)
				default:
					for j, v := range x {
						row[j] = act.F(v)
					}
				}
			}
			if ch != nil {
				at := i0*p.N + j0
				roundRows(cb.DType)(ch[at:], p.N, cs[at:], p.N, i1-i0, j1-j0)
			}
		})
	if e.BiasGrad.Valid() {
		c.Reduce(kernels.Sum, e.BiasGrad, cb, kernels.Reduction{Outer: 1, Len: p.M, Inner: p.N})
	}
	if e.BiasGradA.Valid() {
		r := kernels.Reduction{Outer: p.M, Len: p.K, Inner: 1} // A stored M×K
		if p.TransA {
			r = kernels.Reduction{Outer: 1, Len: p.K, Inner: p.M} // A stored K×M
		}
		c.Reduce(kernels.Sum, e.BiasGradA, a.Slice(0, p.M*p.K), r)
	}
}

// addRow adds len(row) elements of r from element at on to row.
func addRow(row []float32, r kernels.Buf, at int) {
	if !r.DType.Half() {
		addInto(row, f32s(r)[at:at+len(row)])
		return
	}
	v := make([]float32, len(row))
	if r.DType == kernels.BF16 {
		half.BF16ToFloat32(v, u16s(r)[at:at+len(row)])
	} else {
		half.ToFloat32(v, u16s(r)[at:at+len(row)])
	}
	for j := range row {
		row[j] += v[j]
	}
}

// addInto adds x to y, over y's length.
func addInto(y, x []float32) {
	x = x[:len(y)]
	if addVec(y, x) {
		return
	}
	for j, v := range x {
		y[j] += v
	}
}

// roundRows is the rounding of float32 rows into 16-bit ones of dtype dt.
func roundRows(dt kernels.DType) func(dst []uint16, ldd int, src []float32, lds int, rows, n int) {
	if dt == kernels.BF16 {
		return half.BF16FromFloat32Rows
	}
	return half.FromFloat32Rows
}
