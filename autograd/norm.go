package autograd

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// BatchNorm2d normalises x (N×C×H×W) per channel and applies the affine
// gamma, beta (C each). In training it normalises with the batch statistics
// and updates runMean and runVar (F32, C each) in place: r ← (1−momentum)·r
// + momentum·batch, the variance unbiased. In evaluation it normalises with
// runMean and runVar. x may be F16 (AMP): statistics and parameters stay F32
// and the result has x's dtype.
func BatchNorm2d(x, gamma, beta, runMean, runVar *T, training bool, momentum, eps float32) *T {
	return BatchNormAct(x, nil, gamma, beta, runMean, runVar, training, momentum, eps, false)
}

// BatchNormAct is BatchNorm2d fused with what follows it in a residual
// block: the residual (x's shape; nil for none) is added to the normalised
// value and, with relu, the sum goes through a ReLU, all in one pass over
// the data, forward and backward. It saves x (or how it is written again:
// Note [a convolution of the data written again]) and the batch statistics and,
// where that costs nothing, what its output is written again from (beta,
// the residual): a convolution that reads the output then keeps nothing of
// its own, and the ReLU's mask comes from the same; otherwise it saves its
// output, whose sign is the mask (Note [a batch norm's output written
// again]).
func BatchNormAct(x, residual, gamma, beta, runMean, runVar *T, training bool, momentum, eps float32, relu bool) *T {
	return batchNormAct(x, residual, gamma, beta, runMean, runVar, training, momentum, eps, relu, false)
}

// BatchNormActNHWC is BatchNormAct of a channels-last x (N×H×W×C) and
// residual.
func BatchNormActNHWC(x, residual, gamma, beta, runMean, runVar *T, training bool, momentum, eps float32, relu bool) *T {
	return batchNormAct(x, residual, gamma, beta, runMean, runVar, training, momentum, eps, relu, true)
}

// batchNormAct is BatchNormAct, or BatchNormActNHWC when last: to the
// kernels a channels-last batch is N·H·W images of one pixel.
func batchNormAct(x, residual, gamma, beta, runMean, runVar *T, training bool, momentum, eps float32, relu, last bool) *T {
	required("BatchNorm2d", x, gamma, beta, runMean, runVar)
	xs := x.Shape()
	if len(xs) != 4 {
		want := "N×C×H×W"
		if last {
			want = "N×H×W×C"
		}
		panic(fmt.Sprintf("autograd: batch norm of shape %v: want %s", xs, want))
	}
	p := kernels.BNParams{N: xs[0], C: xs[1], HW: xs[2] * xs[3], Eps: eps, ReLU: relu}
	if last {
		p.N, p.C, p.HW = xs[0]*xs[1]*xs[2], xs[3], 1
	}
	c := p.C
	for _, t := range []*T{gamma, beta, runMean, runVar} {
		if t.NDim() != 1 || t.Dim(0) != c {
			panic(fmt.Sprintf("autograd: batch norm of input %v with a per-channel tensor of shape %v", xs, t.Shape()))
		}
	}
	if residual != nil {
		if !residual.SameShape(x) {
			panic(fmt.Sprintf("autograd: batch norm of input %v with a residual of shape %v", xs, residual.Shape()))
		}
		sameDevice("batch norm residual", x, residual)
		if residual.DType() != x.DType() {
			residual = Cast(residual, x.DType())
			defer residual.Release()
		}
	}
	if Recomputing(ModeOf(x)) {
		momentum = 0 // r ← 1·r + 0·batch: unchanged
	}
	p.Momentum = momentum
	be := x.Backend()
	if !training {
		return batchNormEval(x, residual, gamma, beta, runMean, runVar, p, last)
	}
	y := emptyLike(x)
	mean := tensor.Empty(x.Device(), tensor.F32, c)
	invStd := tensor.Empty(x.Device(), tensor.F32, c)
	be.BatchNormTrain(p, x.Buf(), bufOf(residual), gamma.Buf(), beta.Buf(), y.Buf(), runMean.Buf(), runVar.Buf(), mean.Buf(), invStd.Buf())
	rec := begin("batch_norm", x, gamma, beta, residual)
	if rec == nil {
		mean.Release()
		invStd.Release()
		return y
	}
	// The input, or how it is written again (Note [a convolution of the
	// data written again]); input() is a new reference either way.
	var xSaved *T
	xAgain := writtenAgain(x)
	if xAgain == nil {
		xSaved = rec.save(x)
	}
	input := func() *T {
		if xAgain != nil {
			return xAgain()
		}
		return xSaved.Retain()
	}
	gSaved := rec.save(gamma)
	rec.keep(mean)
	rec.keep(invStd)
	var ySaved, rSaved, bSaved *T
	var rAgain func() *T // the residual written again (Note [a checkpoint's input read again])
	if residual != nil {
		rAgain = rereadAgain(residual)
	}
	res := func() *T { // a new reference on the residual, or nil
		switch {
		case rAgain != nil:
			return rAgain()
		case rSaved != nil:
			return rSaved.Retain()
		}
		return nil
	}
	if residual == nil || rAgain != nil || !residual.Exclusive() {
		bSaved = rec.save(beta)
		if residual != nil && rAgain == nil {
			rSaved = rec.save(residual)
		}
		rec.n.again = func() *T {
			x := input()
			defer x.Release()
			r := res()
			defer releaseAll(r)
			y := emptyLike(x)
			be.BatchNormApply(p, x.Buf(), bufOf(r), gSaved.Buf(), bSaved.Buf(), mean.Buf(), invStd.Buf(), y.Buf())
			return y
		}
	} else if relu {
		ySaved = rec.save(y)
	}
	gType, bType := gamma.DType(), beta.DType()
	rec.finish(y, func(g *T) []*T {
		x := input()
		defer x.Release()
		r := res()
		defer releaseAll(r)
		dgamma := tensor.Empty(g.Device(), tensor.F32, c)
		dbeta := tensor.Empty(g.Device(), tensor.F32, c)
		defer dgamma.Release()
		defer dbeta.Release()
		// dx, or else dresidual, is written over g where nothing else reads
		// it (a convolution's input gradient, the block's output gradient);
		// the reference on g is taken after the last allocation, which may
		// fail.
		overG := g.Exclusive()
		var dx, dres *T
		if !overG || rec.needs(3) {
			dx = emptyLike(g)
		}
		if !overG && rec.needs(3) {
			dres = emptyLike(g)
		}
		dxBuf, dresBuf := bufOf(dx), bufOf(dres)
		switch {
		case overG && rec.needs(3):
			dresBuf = g.Buf()
		case overG:
			dxBuf = g.Buf()
		}
		be.BatchNormBackward(p, x.Buf(), bufOf(ySaved), bufOf(r), g.Buf(), gSaved.Buf(), bufOf(bSaved), mean.Buf(), invStd.Buf(), dxBuf, dresBuf, dgamma.Buf(), dbeta.Buf())
		grads := []*T{nil, nil, nil, nil}
		if rec.needs(1) {
			grads[1] = asDType(dgamma.Device(), dgamma, gType)
		}
		if rec.needs(2) {
			grads[2] = asDType(dbeta.Device(), dbeta, bType)
		}
		switch {
		case overG && rec.needs(3):
			dres = g.Retain()
		case overG:
			dx = g.Retain()
		}
		grads[0], grads[3] = dx, dres
		return grads
	})
	return y
}

// Note [a batch norm's output written again]: a batch norm's output y is
// one elementwise pass from what its backward keeps anyway (x, the batch
// statistics, gamma), given beta and the residual
// (kernels.Backend.BatchNormApply writes it again bit for bit). Two of its
// readers need it in the backward: the ReLU's mask, and a convolution that
// reads y (its filter gradient). Keeping y costs a tensor unless a reader
// keeps it anyway; keeping beta costs nothing (a parameter), and keeping
// the residual costs nothing when other references hold its storage: a
// block's identity shortcut is its input, which the block's first
// convolution or a checkpoint keeps. So, unless its residual's storage is
// exclusive (a projection shortcut's batch norm output, which nothing else
// keeps), BatchNormAct keeps beta and the residual and not y, its backward
// writes the mask again from them (BatchNormBackward without y), and its
// node can write y again (node.again): a convolution reading y (Conv2d)
// keeps nothing of its own and, in its backward, writes y, takes its
// filter gradient and frees y before its input gradient exists; a
// checkpoint whose input y is (a ResNet's stem output, before its first
// block) writes it when its recomputation starts. Otherwise it keeps y,
// and a reader keeps it too at no cost.
//
// In a residual network the greedy rule alternates on its own: a block
// whose input was written again (not kept by its first convolution) sees
// an exclusive shortcut and keeps its output, which the next block's
// convolution keeps as is; that block's output is written again, and so
// on. Of what a block would keep (its input, its two convolutions'
// outputs, its first batch norm's output), the first batch norm's output
// is never kept and every other block's input is not. The price is one
// elementwise pass in the backward per tensor written again; the
// gradients are the same bits.

// bufOf is t's buffer, or the invalid one for nil.
func bufOf(t *T) kernels.Buf {
	if t == nil {
		return kernels.Buf{}
	}
	return t.Buf()
}

// batchNormEval normalises with the running statistics: one fused kernel when
// nothing is recorded, differentiable operations otherwise (fine-tuning with
// frozen statistics).
func batchNormEval(x, residual, gamma, beta, runMean, runVar *T, p kernels.BNParams, last bool) *T {
	if !recording(x, gamma, beta, residual) {
		y := emptyLike(x)
		x.Backend().BatchNormEval(p, x.Buf(), bufOf(residual), gamma.Buf(), beta.Buf(), runMean.Buf(), runVar.Buf(), y.Buf())
		return y
	}
	// y = act(x·s + (β − μ·s) + residual), s = γ/√(σ²+ε)
	dev := ModeOf(x, gamma, beta, residual)
	s := dev.NewScope()
	// The statistics and the affine parameters join x's handle first, so
	// that what they make follows its modes and lands in its scope.
	std := Sqrt(Affine(Detach(runVar).On(dev), 1, p.Eps))
	scale := Div(on(dev, gamma), std)
	shift := Sub(on(dev, beta), Mul(Detach(runMean).On(dev), scale))
	per := []int{p.C, 1, 1} // a per-channel tensor as it broadcasts over x
	if last {
		per = []int{p.C}
	}
	y := Add(Mul(x, Reshape(scale, per...)), Reshape(shift, per...))
	if y.DType() != x.DType() {
		y = Cast(y, x.DType())
	}
	if residual != nil {
		y = Add(y, residual)
	}
	if p.ReLU {
		y = ReLU(y)
	}
	s.Escape(y)
	s.Close()
	return y
}

// on is x on the handle dev (see tensor.Tensor.On), passing gradients
// through.
func on(dev *tensor.Device, x *T) *T {
	y := x.On(dev)
	if rec := beginOn(dev, "on", x); rec != nil {
		rec.finish(y, func(g *T) []*T { return []*T{g.Retain()} })
	}
	return y
}
