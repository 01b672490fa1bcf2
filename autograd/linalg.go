package autograd

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// gemm returns op(a)·op(b) for 2-D or batched 3-D operands, recording nothing.
// The result has a's dtype.
func gemm(a, b *T, transA, transB bool) *T { return gemmTo(a, b, transA, transB, a.DType()) }

// gemmTo is gemm with a result of dtype dt: F32 from F16 operands is the
// product accumulated in float32 and not rounded.
func gemmTo(a, b *T, transA, transB bool, dt tensor.DType) *T {
	sameDevice("matmul", a, b)
	if a.DType() != b.DType() {
		panic(fmt.Sprintf("autograd: matmul of %v and %v tensors", a.DType(), b.DType()))
	}
	as, bs := a.Shape(), b.Shape()
	if len(as) != len(bs) || len(as) < 2 || len(as) > 3 {
		panic(fmt.Sprintf("autograd: matmul of shapes %v and %v: want two 2-D or two 3-D tensors", as, bs))
	}
	batch := 1
	if len(as) == 3 {
		if as[0] != bs[0] {
			panic(fmt.Sprintf("autograd: batched matmul of shapes %v and %v: batch sizes differ", as, bs))
		}
		batch = as[0]
		as, bs = as[1:], bs[1:]
	}
	m, k := as[0], as[1]
	if transA {
		m, k = k, m
	}
	k2, n := bs[0], bs[1]
	if transB {
		k2, n = n, k2
	}
	if k != k2 {
		panic(fmt.Sprintf("autograd: matmul of shapes %v and %v (transposed: %v, %v): inner sizes %d and %d differ",
			a.Shape(), b.Shape(), transA, transB, k, k2))
	}
	shape := []int{m, n}
	if batch > 1 || a.NDim() == 3 {
		shape = []int{batch, m, n}
	}
	c := tensor.Empty(ModeOf(a, b), dt, shape...)
	a.Backend().Gemm(kernels.GemmParams{TransA: transA, TransB: transB, M: m, N: n, K: k, Alpha: 1, Batch: batch,
		StrideA: m * k, StrideB: k * n, StrideC: m * n}, a.Buf(), b.Buf(), c.Buf())
	return c
}

// MatMul returns the matrix product a·b of an M×K and a K×N tensor, or the
// batched product of B×M×K and B×K×N tensors.
//
// Under Autocast the product runs in its dtype on copies of a and b.
func MatMul(a, b *T) *T {
	if dev := ModeOf(a, b); AutocastEnabled(dev) {
		defer autocastIn(dev, AutocastDType(dev), &a, &b)()
	}
	c := gemm(a, b, false, false)
	if rec := begin("matmul", a, b); rec != nil {
		var as, bs *T
		if rec.needs(0) {
			bs = rec.save(b)
		}
		if rec.needs(1) {
			as = rec.save(a)
		}
		rec.finish(c, func(g *T) []*T {
			grads := make([]*T, 2)
			if as != nil {
				grads[1] = gemm(as, g, true, false) // dB = Aᵀ·dC
			}
			if bs != nil {
				grads[0] = gemm(g, bs, false, true) // dA = dC·Bᵀ
			}
			return grads
		})
	}
	return c
}

// Linear returns x·wᵀ + b for x of N×In, w of Out×In (PyTorch's layout) and
// an optional bias b of Out.
//
// Under Autocast the product runs in its dtype (F16, BF16) on copies of x
// and w, and b is added in that dtype. The gradients of w and b are
// computed in their own dtype: the weight's is the product accumulated in
// float32, not rounded to 16 bits and cast back as a gradient through a
// cast would be.
func Linear(x, w, b *T) *T {
	wc := w // the weight the product reads: w, or its F16 copy under autocast
	if dev := ModeOf(x, w, b); AutocastEnabled(dev) {
		dt := AutocastDType(dev)
		defer autocastIn(dev, dt, &x)()
		wc = asDType(dev, w, dt)
		defer wc.Release()
	}
	xs, ws := x.Shape(), w.Shape()
	if len(xs) != 2 || len(ws) != 2 || xs[1] != ws[1] {
		panic(fmt.Sprintf("autograd: linear of input %v with weight %v: want N×In and Out×In", xs, ws))
	}
	y := gemm(x, wc, false, true)
	if b != nil {
		if b.NDim() != 1 || b.Dim(0) != ws[0] {
			panic(fmt.Sprintf("autograd: linear bias of shape %v for weight %v", b.Shape(), ws))
		}
		addBias(y, b, b.Shape())
	}
	rec := begin("linear", x, w, b)
	if rec == nil {
		return y
	}
	var xSaved, wSaved *T
	if rec.needs(1) {
		xSaved = rec.save(x)
	}
	if rec.needs(0) {
		wSaved = rec.save(wc)
	}
	hasBias := b != nil
	var bType tensor.DType
	if hasBias {
		bType = b.DType()
	}
	wType := w.DType()
	rec.finish(y, func(g *T) []*T {
		grads := make([]*T, 3)
		if wSaved != nil {
			grads[0] = gemm(g, wSaved, false, false) // dx = dy·w
		}
		if xSaved != nil {
			grads[1] = gemmTo(g, xSaved, true, false, wType) // dw = dyᵀ·x
		}
		if hasBias && rec.needs(2) {
			grads[2] = biasGrad(g, []int{ws[0]}, bType)
		}
		return grads
	})
	return y
}

// addBias adds the bias b, read as shape (its one dimension placed among
// broadcast ones), to y in place, in y's dtype.
func addBias(y, b *T, shape []int) {
	bc := asDType(y.Device(), b, y.DType())
	defer bc.Release()
	y.Backend().Binary(kernels.Add, y.Buf(), y.Buf(), bc.Buf(), kernels.NewBroadcast(y.Shape(), y.Shape(), shape))
}

// biasGrad is the gradient of a bias that addBias added as shape: g summed
// over the broadcast dimensions, in the bias's dtype dt, as a 1-D tensor.
func biasGrad(g *T, shape []int, dt tensor.DType) *T {
	s := sumTo(g, shape)
	defer s.Release()
	c := asDType(s.Device(), s, dt)
	v := c.View(-1)
	c.Release()
	return v
}

// releaseAll releases the non-nil tensors.
func releaseAll(ts ...*T) {
	for _, t := range ts {
		if t != nil {
			t.Release()
		}
	}
}
