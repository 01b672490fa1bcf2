package cpu

import (
	"github.com/leangrad/leangrad/kernels"
)

// Gemm computes a (batched) matrix product; see kernels.GemmParams. One
// product runs on every core; a batch of products runs one product per core.
func (c *Backend) Gemm(p kernels.GemmParams, a, b, cb kernels.Buf) {
	kernels.CheckGemm(p, a, b, cb)
	batch := max(p.Batch, 1)
	as, doneA := view(a)
	defer doneA()
	bs, doneB := view(b)
	defer doneB()
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
		c.mm.Gemm(p.TransA, p.TransB, p.M, p.N, p.K, p.Alpha, as, lda, bs, ldb, p.Beta, cs, p.N)
	} else {
		one := c.mm.WithThreads(1)
		parallel(batch, 1, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				one.Gemm(p.TransA, p.TransB, p.M, p.N, p.K, p.Alpha,
					as[i*p.StrideA:], lda, bs[i*p.StrideB:], ldb, p.Beta, cs[i*p.StrideC:], p.N)
			}
		})
	}
	done()
}
