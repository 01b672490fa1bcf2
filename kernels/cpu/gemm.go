package cpu

import (
	"github.com/leangrad/leangrad/kernels"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
)

// sgemm computes c = alpha·op(a)·op(b) + beta·c on row-major float32 slices
// with gonum's BLAS.
func sgemm(transA, transB bool, m, n, k int, alpha float32, a, b []float32, beta float32, c []float32) {
	ta, tb := blas.NoTrans, blas.NoTrans
	ar, ac := m, k
	if transA {
		ta, ar, ac = blas.Trans, k, m
	}
	br, bcols := k, n
	if transB {
		tb, br, bcols = blas.Trans, n, k
	}
	blas32.Gemm(ta, tb, alpha,
		blas32.General{Rows: ar, Cols: ac, Stride: ac, Data: a[:ar*ac]},
		blas32.General{Rows: br, Cols: bcols, Stride: bcols, Data: b[:br*bcols]},
		beta,
		blas32.General{Rows: m, Cols: n, Stride: n, Data: c[:m*n]})
}

// Gemm computes a (batched) matrix product; see kernels.GemmParams.
func (c *Backend) Gemm(p kernels.GemmParams, a, b, cb kernels.Buf) {
	kernels.CheckGemm(p, a, b, cb)
	batch := max(p.Batch, 1)
	as, bs := in(a), in(b)
	var cs []float32
	var done func()
	if p.Beta != 0 {
		cs, done = inout(cb)
	} else {
		cs, done = out(cb)
	}
	if batch == 1 {
		sgemm(p.TransA, p.TransB, p.M, p.N, p.K, p.Alpha, as, bs, p.Beta, cs)
	} else {
		parallel(batch, 1, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				sgemm(p.TransA, p.TransB, p.M, p.N, p.K, p.Alpha,
					as[i*p.StrideA:], bs[i*p.StrideB:], p.Beta, cs[i*p.StrideC:])
			}
		})
	}
	done()
}
