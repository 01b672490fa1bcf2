package autograd

import (
	"fmt"
	"slices"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// gemm returns op(a)·op(b) for 2-D or batched 3-D operands, recording nothing.
// The result has a's dtype.
func gemm(a, b *T, transA, transB bool) *T { return gemmTo(a, b, transA, transB, a.DType()) }

// gemmTo is gemm with a result of dtype dt: F32 from F16 operands is the
// product accumulated in float32 and not rounded.
func gemmTo(a, b *T, transA, transB bool, dt tensor.DType) *T {
	return gemmEpilogue(a, b, transA, transB, dt, kernels.Epilogue{})
}

// gemmEpilogue is gemmTo with the epilogue e fused into the product (2-D
// operands only; see kernels.Epilogue).
func gemmEpilogue(a, b *T, transA, transB bool, dt tensor.DType, e kernels.Epilogue) *T {
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
	dev := ModeOf(a, b)
	c := tensor.Empty(dev, dt, shape...)
	p := kernels.GemmParams{TransA: transA, TransB: transB, M: m, N: n, K: k, Alpha: 1, Batch: batch,
		StrideA: m * k, StrideB: k * n, StrideC: m * n}
	bb := b.Buf()
	if pk := packedWeight(dev, b, transB, batch); pk != nil {
		bb, p.PackedB, p.StrideB = pk.Buf(), true, 0
	}
	if sg, ok := a.Backend().(kernels.Stoppable); ok && dev.Stopping() != nil {
		if !sg.GemmStoppable(p, e, a.Buf(), bb, c.Buf(), dev.Stopping()) {
			c.Release()
			panic(fmt.Errorf("autograd: a product of shapes %v and %v stopped part way: %w", a.Shape(), b.Shape(), tensor.ErrInterrupted))
		}
		return c
	}
	if e == (kernels.Epilogue{}) {
		a.Backend().Gemm(p, a.Buf(), bb, c.Buf())
	} else {
		a.Backend().GemmEpilogue(p, e, a.Buf(), bb, c.Buf())
	}
	return c
}

// fusesBias reports whether b is a bias the products add in their
// epilogue: an F32 vector (parameters are; a 16-bit one is added as a
// tensor of the product's dtype instead).
func fusesBias(b *T) bool { return b != nil && b.DType() == tensor.F32 && b.NDim() == 1 }

// MatMul returns the matrix product a·b of an M×K and a K×N tensor, or the
// batched product of B×M×K and B×K×N tensors.
//
// Under Autocast the product runs in its dtype on copies of a and b.
func MatMul(a, b *T) *T {
	required("MatMul", a, b)
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
// and w, and b, rounded to that dtype, is added in the product's epilogue
// (kernels.Epilogue), before the result is rounded. The gradients of w and
// b are computed in their own dtype: the weight's is the product
// accumulated in float32, not rounded to 16 bits and cast back as a
// gradient through a cast would be; the bias's comes with it.
func Linear(x, w, b *T) *T { return linear(nil, x, w, b) }

// AddLinear returns r + x·wᵀ + b for r of N×Out, F32 or x's dtype: a
// residual connection added in the product's epilogue (kernels.Epilogue),
// rounded once into r's dtype, with no pass of its own. b, if not nil, is
// an F32 vector of Out. Under Autocast the product runs in its dtype as
// Linear's does, and its F32 sum with the unrounded bias is added to an
// F32 r without being rounded to 16 bits first. r's gradient is the
// result's; the product's is the result's in the product's dtype.
func AddLinear(r, x, w, b *T) *T {
	if r == nil {
		panic("autograd: add_linear without a residual")
	}
	return linear(r, x, w, b)
}

// checkResidual panics unless r (nil: none) fits a product of n×out in
// dtype dt with the F32 vector bias b (or nil).
func checkResidual(op string, r, b *T, n, out int, dt tensor.DType) {
	if r == nil {
		return
	}
	if rs := r.Shape(); len(rs) != 2 || rs[0] != n || rs[1] != out || (r.DType() != tensor.F32 && r.DType() != dt) {
		panic(fmt.Sprintf("autograd: %s residual %v %v for a %v product of %d×%d: want that shape, in F32 or the product's dtype", op, r.DType(), rs, dt, n, out))
	}
	if b != nil && !fusesBias(b) {
		panic(fmt.Sprintf("autograd: %s bias %v %v with a residual: want an F32 vector", op, b.DType(), b.Shape()))
	}
}

// biasIn is the bias b as an epilogue adds it to a product written in dt:
// b's copy in dt where CastParameters made one (a 16-bit product adds its
// bias rounded to its dtype: the same values, with no cast of its own;
// Note [parameters cast at once]), or b.
func biasIn(dev *tensor.Device, b *T, dt tensor.DType) kernels.Buf {
	if copies, _ := dev.Modes().Copies.(map[*T]*T); copies != nil && dt != b.DType() {
		if c := copies[b]; c != nil && c.DType() == dt {
			return c.Buf()
		}
	}
	return b.Buf()
}

// linear is Linear (r nil) and AddLinear.
func linear(r, x, w, b *T) *T {
	required("Linear", x, w)
	dev := ModeOf(x, w, b)
	wc := w // the weight the product reads: w, or its F16 copy under autocast
	if AutocastEnabled(dev) {
		dt := AutocastDType(dev)
		defer autocastIn(dev, dt, &x)()
		wc = asDType(dev, w, dt)
		defer wc.Release()
	}
	xs, ws := x.Shape(), w.Shape()
	if len(xs) != 2 || len(ws) != 2 || xs[1] != ws[1] {
		panic(fmt.Sprintf("autograd: linear of input %v with weight %v: want N×In and Out×In", xs, ws))
	}
	if b != nil && (b.NDim() != 1 || b.Dim(0) != ws[0]) {
		panic(fmt.Sprintf("autograd: linear bias of shape %v for weight %v", b.Shape(), ws))
	}
	xType := x.DType()
	checkResidual("linear", r, b, xs[0], ws[0], xType)
	var y *T
	yType := xType
	if r != nil {
		yType = r.DType()
	}
	keeps := keepsProducts(dev)
	if keeps {
		if k := recall(dev, 1); k != nil { // a light checkpoint's recomputation (Note [light checkpoints])
			if y = k[0]; !slices.Equal(y.Shape(), []int{xs[0], ws[0]}) || y.DType() != yType {
				panic(fmt.Sprintf("autograd: a light checkpoint's recomputation of a %v product of %v found a kept %v %v: it must run the same ops", yType, xs, y.DType(), y.Shape()))
			}
		}
	}
	switch {
	case y != nil:
	case r != nil:
		e := kernels.Epilogue{Residual: r.Buf()}
		if b != nil {
			e.Bias = biasIn(dev, b, r.DType())
		}
		y = gemmEpilogue(x, wc, false, true, r.DType(), e)
	case fusesBias(b):
		y = gemmEpilogue(x, wc, false, true, xType, kernels.Epilogue{Bias: biasIn(dev, b, xType)})
	default:
		y = gemm(x, wc, false, true)
		if b != nil {
			addBias(y, b, b.Shape())
		}
	}
	if keeps {
		keep(dev, y)
	}
	name := "linear"
	if r != nil {
		name = "linear+residual"
	}
	rec := begin(name, x, w, b, r)
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
	if r != nil && r.DType() != xType {
		rec.readsRounded(xType)
		if fusesBias(b) {
			rec.readsColumnSums()
		}
	}
	rec.finish(y, func(g *T) []*T {
		grads := make([]*T, 4)
		if rec.needs(3) {
			grads[3] = g.View(g.Shape()...)
		}
		if hasBias && rec.needs(2) {
			grads[2] = columnSums(rec, ws[0]) // of the F32 gradient, where the op that finished it summed them
		}
		g = roundedGrad(rec, g, xType) // a residual's dtype: the products'
		defer g.Release()
		if wSaved != nil {
			grads[0] = gemm(g, wSaved, false, false) // dx = dy·w
		}
		if xSaved != nil {
			dw, db := weightGrad(g, xSaved, wType, bType, hasBias && rec.needs(2) && grads[2] == nil) // dw = dyᵀ·x, db = Σ dy
			grads[1] = dw
			if db != nil {
				grads[2] = db
			}
		}
		if hasBias && rec.needs(2) && grads[2] == nil {
			grads[2] = biasGrad(g, []int{ws[0]}, bType)
		}
		return grads
	})
	return y
}

// weightGrad returns a linear layer's weight gradient gᵀ·x in dtype wType
// and, with bias, its F32 bias's gradient (the column sums of g) from the
// same product's epilogue; nil for a bias of another dtype bType.
func weightGrad(g, x *T, wType, bType tensor.DType, bias bool) (dw, db *T) {
	if !bias || bType != tensor.F32 {
		return gemmTo(g, x, true, false, wType), nil
	}
	db = tensor.Empty(ModeOf(g, x), tensor.F32, g.Dim(1))
	return gemmEpilogue(g, x, true, false, wType, kernels.Epilogue{BiasGradA: db.Buf()}), db
}

// MLP returns a transformer's feed-forward block, GELU(x·w1ᵀ + b1)·w2ᵀ +
// b2, for x of N×In, w1 of Hidden×In, w2 of Out×Hidden (PyTorch's layout)
// and F32 biases b1 of Hidden and b2 of Out: Linear, GELU and Linear as one
// op whose GELU runs in the products' epilogues, forward (with the first
// bias) and backward (with the first bias's gradient), as do the second
// bias and its gradient (kernels.Epilogue). Neither the activation nor the
// biases make a pass of their own over the hidden activations. It saves
// what the three ops would: x, GELU's input and its output.
//
// Under Autocast the products run in its dtype on copies of x, w1 and w2,
// as Linear's do; the gradients of the weights and biases are in their own
// dtypes.
func MLP(x, w1, b1, w2, b2 *T) *T { return mlp(nil, x, w1, b1, w2, b2) }

// AddMLP returns r + MLP(x, w1, b1, w2, b2), the residual r added in the
// second product's epilogue as AddLinear adds it.
func AddMLP(r, x, w1, b1, w2, b2 *T) *T {
	if r == nil {
		panic("autograd: add_mlp without a residual")
	}
	return mlp(r, x, w1, b1, w2, b2)
}

// mlp is MLP (r nil) and AddMLP.
func mlp(r, x, w1, b1, w2, b2 *T) *T {
	w1c, w2c := w1, w2
	dev := ModeOf(x, w1, b1, w2, b2)
	if AutocastEnabled(dev) {
		dt := AutocastDType(dev)
		defer autocastIn(dev, dt, &x)()
		w1c, w2c = asDType(dev, w1, dt), asDType(dev, w2, dt)
		defer w1c.Release()
		defer w2c.Release()
	}
	xs, s1, s2 := x.Shape(), w1.Shape(), w2.Shape()
	if len(xs) != 2 || len(s1) != 2 || len(s2) != 2 || xs[1] != s1[1] || s2[1] != s1[0] {
		panic(fmt.Sprintf("autograd: mlp of input %v with weights %v and %v: want N×In, Hidden×In and Out×Hidden", xs, s1, s2))
	}
	if !fusesBias(b1) || !fusesBias(b2) || b1.Dim(0) != s1[0] || b2.Dim(0) != s2[0] {
		panic(fmt.Sprintf("autograd: mlp biases %v and %v for weights %v and %v: want F32 vectors of Hidden and Out", shapeOf(b1), shapeOf(b2), s1, s2))
	}
	dt := x.DType()
	checkResidual("mlp", r, b2, xs[0], s2[0], dt)
	yType, out := dt, kernels.Epilogue{}
	name := "mlp"
	if r != nil {
		yType, out.Residual, name = r.DType(), r.Buf(), "mlp+residual"
	}
	out.Bias = biasIn(dev, b2, yType)
	pre := tensor.Empty(dev, dt, xs[0], s1[0]) // GELU's input
	defer pre.Release()
	h := gemmEpilogue(x, w1c, false, true, dt, kernels.Epilogue{Bias: biasIn(dev, b1, dt), Act: kernels.GELU, Aux: pre.Buf()})
	defer h.Release()
	rec := begin(name, x, w1, b1, w2, b2, r)
	var y *T
	if rec.leavesUnwritten() { // the backward reads pre and h, not y
		y = tensor.Empty(dev, yType, xs[0], s2[0])
	} else {
		y = gemmEpilogue(h, w2c, false, true, yType, out)
	}
	if rec == nil {
		return y
	}
	first := rec.needs(0) || rec.needs(1) || rec.needs(2) // the gradient reaches the first product
	var xS, w1S, preS, hS, w2S *T
	if rec.needs(1) {
		xS = rec.save(x)
	}
	if rec.needs(0) {
		w1S = rec.save(w1c)
	}
	if first {
		preS, w2S = rec.save(pre), rec.save(w2c)
	}
	if rec.needs(3) {
		hS = rec.save(h)
	}
	w1Type, w2Type := w1.DType(), w2.DType()
	if yType != dt {
		rec.readsRounded(dt)
		rec.readsColumnSums()
	}
	rec.finish(y, func(g *T) []*T {
		grads := make([]*T, 6)
		if rec.needs(5) {
			grads[5] = g.View(g.Shape()...)
		}
		if rec.needs(4) {
			grads[4] = columnSums(rec, s2[0]) // of the F32 gradient, where the op that finished it summed them
		}
		g = roundedGrad(rec, g, dt) // a residual's dtype: the products'
		defer g.Release()
		if hS != nil {
			dw, db := weightGrad(g, hS, w2Type, tensor.F32, rec.needs(4) && grads[4] == nil)
			grads[3] = dw
			if db != nil {
				grads[4] = db
			}
		} else if rec.needs(4) && grads[4] == nil {
			grads[4] = biasGrad(g, []int{s2[0]}, tensor.F32)
		}
		if !first {
			return grads
		}
		e := kernels.Epilogue{Act: kernels.GELU, Grad: true, Aux: preS.Buf()}
		if rec.needs(2) {
			grads[2] = tensor.Empty(ModeOf(g, w2S), tensor.F32, s1[0])
			e.BiasGrad = grads[2].Buf()
		}
		dpre := gemmEpilogue(g, w2S, false, false, dt, e) // GELU′(pre)·(dy·w2)
		defer dpre.Release()
		if xS != nil {
			grads[1] = gemmTo(dpre, xS, true, false, w1Type) // dw1 = dpreᵀ·x
		}
		if w1S != nil {
			grads[0] = gemm(dpre, w1S, false, false) // dx = dpre·w1
		}
		return grads
	})
	return y
}

// columnSums returns the F32 column sums of the gradient rec's node's
// backward runs with, where the op that finished the gradient wrote them
// (Note [a gradient rounded where it is finished]) and there are cols of
// them, or nil: a bias's gradient, the caller's.
func columnSums(rec *recorder, cols int) *T {
	s := rec.takeColumnSums()
	if s != nil && s.Numel() != cols {
		s.Release()
		return nil
	}
	return s
}

// roundedGrad returns a new handle on g in dtype dt: g's, the rounding
// the op that finished g wrote for rec's node (Note [a gradient rounded
// where it is finished]), or g cast.
func roundedGrad(rec *recorder, g *T, dt tensor.DType) *T {
	switch r := rec.takeRounded(); {
	case g.DType() == dt:
		return g.View(g.Shape()...)
	case r != nil:
		return r.View(r.Shape()...)
	}
	return castRaw(g, dt)
}

// shapeOf is t's shape, or nil for a nil tensor.
func shapeOf(t *T) []int {
	if t == nil {
		return nil
	}
	return t.Shape()
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
