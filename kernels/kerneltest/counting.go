package kerneltest

import "github.com/leangrad/leangrad/kernels"

// Products is a backend that counts the matrix products it runs, with and
// without epilogues, for tests that assert what a step computes (what a
// checkpoint's recomputation runs again).
type Products struct {
	kernels.Backend
	N int // products run
}

// Gemm counts the product and runs it.
func (c *Products) Gemm(p kernels.GemmParams, a, b, out kernels.Buf) {
	c.N++
	c.Backend.Gemm(p, a, b, out)
}

// GemmEpilogue counts the product and runs it.
func (c *Products) GemmEpilogue(p kernels.GemmParams, e kernels.Epilogue, a, b, out kernels.Buf) {
	c.N++
	c.Backend.GemmEpilogue(p, e, a, b, out)
}
