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
// the data, forward and backward. It saves x and, with relu, what the
// ReLU's mask is found from: its output (whose sign is the mask), or, when
// other references hold the residual's storage, the residual (Note [where
// a batch norm's mask comes from]).
func BatchNormAct(x, residual, gamma, beta, runMean, runVar *T, training bool, momentum, eps float32, relu bool) *T {
	xs := x.Shape()
	if len(xs) != 4 {
		panic(fmt.Sprintf("autograd: batch norm of shape %v: want N×C×H×W", xs))
	}
	c := xs[1]
	for _, p := range []*T{gamma, beta, runMean, runVar} {
		if p.NDim() != 1 || p.Dim(0) != c {
			panic(fmt.Sprintf("autograd: batch norm of input %v with a per-channel tensor of shape %v", xs, p.Shape()))
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
	p := kernels.BNParams{N: xs[0], C: c, HW: xs[2] * xs[3], Eps: eps, Momentum: momentum, ReLU: relu}
	be := x.Backend()
	if !training {
		return batchNormEval(x, residual, gamma, beta, runMean, runVar, p)
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
	xSaved, gSaved := rec.save(x), rec.save(gamma)
	var ySaved, rSaved, bSaved *T
	switch {
	case !relu:
	case residual != nil && !residual.Exclusive():
		rSaved, bSaved = rec.save(residual), rec.save(beta)
	default:
		ySaved = rec.save(y)
	}
	rec.keep(mean)
	rec.keep(invStd)
	gType, bType := gamma.DType(), beta.DType()
	rec.finish(y, func(g *T) []*T {
		dx := emptyLike(g)
		dgamma := tensor.Empty(g.Device(), tensor.F32, c)
		dbeta := tensor.Empty(g.Device(), tensor.F32, c)
		var dres *T
		switch {
		case !rec.needs(3):
		case g.Exclusive():
			dres = g.Retain() // written over g, which nothing else reads
		default:
			dres = emptyLike(g)
		}
		be.BatchNormBackward(p, xSaved.Buf(), bufOf(ySaved), bufOf(rSaved), g.Buf(), gSaved.Buf(), bufOf(bSaved), mean.Buf(), invStd.Buf(), dx.Buf(), bufOf(dres), dgamma.Buf(), dbeta.Buf())
		grads := []*T{dx, nil, nil, dres}
		if rec.needs(1) {
			grads[1] = asDType(dgamma.Device(), dgamma, gType)
		}
		if rec.needs(2) {
			grads[2] = asDType(dbeta.Device(), dbeta, bType)
		}
		dgamma.Release()
		dbeta.Release()
		return grads
	})
	return y
}

// Note [where a batch norm's mask comes from]: the backward of a batch
// norm with a ReLU masks its gradient where the output y was not positive.
// y is one pass from what the backward keeps anyway (x, the batch
// statistics, beta and the residual), so the mask can come from y itself or
// be written again from those (kernels.Backend.BatchNormBackward without y:
// the same bits). Keeping y costs nothing when y's readers keep it (the
// next convolution saves its input) and a whole tensor when they do not: a
// network's last block, and a checkpointed block's recomputation, whose
// output the pass frees as soon as it holds the graph. Keeping the residual
// costs nothing when other references hold it: a block's identity shortcut
// is its input, which the block's first convolution, or the checkpoint,
// keeps. So BatchNormAct keeps the residual when its storage is not
// exclusive, and y otherwise (a projection shortcut's batch norm output,
// which nothing else keeps, or no residual). In a checkpointed block's
// backward that leaves the recomputed output out of the peak.

// BatchNormReLUConv is Conv2d(BatchNormAct(x, nil, gamma, beta, runMean,
// runVar, training, momentum, eps, true), w, nil, stride, pad), a residual
// block's first batch norm and ReLU and its second convolution, with the
// same results bit for bit, keeping less for the backward (Note [what a
// batch norm and its convolution keep]). In evaluation, with nothing to
// record, or with x and w (after autocast) of two dtypes, it is those two
// operations.
func BatchNormReLUConv(x, gamma, beta, runMean, runVar *T, training bool, momentum, eps float32, w *T, stride, pad int) *T {
	unfused := func() *T {
		y := BatchNormAct(x, nil, gamma, beta, runMean, runVar, training, momentum, eps, true)
		defer y.Release()
		return Conv2d(y, w, nil, stride, pad)
	}
	dev := ModeOf(x, gamma, beta, w)
	if !training || !recordingOn(dev, x, gamma, beta, w) {
		return unfused()
	}
	if AutocastEnabled(dev) {
		if x.DType() != AutocastDType(dev) {
			return unfused()
		}
		defer autocastIn(dev, AutocastDType(dev), &w)()
	}
	xs, ws := x.Shape(), w.Shape()
	if len(xs) != 4 || len(ws) != 4 || xs[1] != ws[1] || x.DType() != w.DType() {
		return unfused() // whose checks name what is wrong
	}
	sameDevice("batch norm and conv2d", x, w)
	c := xs[1]
	for _, p := range []*T{gamma, beta, runMean, runVar} {
		if p.NDim() != 1 || p.Dim(0) != c {
			panic(fmt.Sprintf("autograd: batch norm of input %v with a per-channel tensor of shape %v", xs, p.Shape()))
		}
	}
	cp := kernels.ConvParams{N: xs[0], C: c, H: xs[2], W: xs[3], K: ws[0], R: ws[2], S: ws[3],
		StrideH: stride, StrideW: stride, PadH: pad, PadW: pad}
	if stride <= 0 || pad < 0 || cp.OutH() <= 0 || cp.OutW() <= 0 {
		panic(fmt.Sprintf("autograd: conv2d of input %v with weight %v, stride %d, padding %d has no output", xs, ws, stride, pad))
	}
	if Recomputing(dev) {
		momentum = 0 // r ← 1·r + 0·batch: unchanged
	}
	bp := kernels.BNParams{N: xs[0], C: c, HW: xs[2] * xs[3], Eps: eps, Momentum: momentum, ReLU: true}
	be := x.Backend()
	y := emptyLike(x)
	mean := tensor.Empty(x.Device(), tensor.F32, c)
	invStd := tensor.Empty(x.Device(), tensor.F32, c)
	be.BatchNormTrain(bp, x.Buf(), kernels.Buf{}, gamma.Buf(), beta.Buf(), y.Buf(), runMean.Buf(), runVar.Buf(), mean.Buf(), invStd.Buf())
	out := tensor.Empty(dev, x.DType(), cp.N, cp.K, cp.OutH(), cp.OutW())
	be.Conv2d(cp, y.Buf(), w.Buf(), out.Buf())
	y.Release()
	rec := beginOn(dev, "batch_norm_conv2d", x, gamma, beta, w)
	xSaved, gSaved, bSaved, wSaved := rec.save(x), rec.save(gamma), rec.save(beta), rec.save(w)
	rec.keep(mean)
	rec.keep(invStd)
	gType, bType := gamma.DType(), beta.DType()
	rec.finish(out, func(g *T) []*T {
		grads := make([]*T, 4)
		if rec.needs(3) {
			y := emptyLike(xSaved)
			be.BatchNormApply(bp, xSaved.Buf(), kernels.Buf{}, gSaved.Buf(), bSaved.Buf(), mean.Buf(), invStd.Buf(), y.Buf())
			dw := tensor.Empty(g.Device(), g.DType(), ws...)
			be.Conv2dBackwardFilter(cp, y.Buf(), g.Buf(), dw.Buf())
			y.Release() // before dx exists: the batch norm's backward masks without it
			grads[3] = dw
		}
		if !rec.needs(0) && !rec.needs(1) && !rec.needs(2) {
			return grads
		}
		// dx is written over dy, conv2's input gradient, which only the
		// batch norm's backward reads.
		dx := emptyLike(xSaved)
		be.Conv2dBackwardData(cp, g.Buf(), wSaved.Buf(), dx.Buf())
		dgamma := tensor.Empty(g.Device(), tensor.F32, c)
		dbeta := tensor.Empty(g.Device(), tensor.F32, c)
		defer dgamma.Release()
		defer dbeta.Release()
		be.BatchNormBackward(bp, xSaved.Buf(), kernels.Buf{}, kernels.Buf{}, dx.Buf(), gSaved.Buf(), bSaved.Buf(), mean.Buf(), invStd.Buf(), dx.Buf(), kernels.Buf{}, dgamma.Buf(), dbeta.Buf())
		grads[0] = dx
		if rec.needs(1) {
			grads[1] = asDType(dgamma.Device(), dgamma, gType)
		}
		if rec.needs(2) {
			grads[2] = asDType(dbeta.Device(), dbeta, bType)
		}
		return grads
	})
	return out
}

// Note [what a batch norm and its convolution keep]: in a residual block
// conv1 → batch norm + ReLU → conv2, the two operations keep the batch
// norm's input x and its output y (the ReLU's mask is y's sign, and y is
// conv2's input, which its filter gradient reads): two activations. y is
// one elementwise pass from x and the batch statistics the batch norm
// keeps anyway, so BatchNormReLUConv keeps x alone and, in the backward,
// writes y again (kernels.Backend.BatchNormApply, the training forward's
// own arithmetic, so the gradients are the unfused operations' bit for
// bit) for conv2's filter gradient and frees it before conv2's input
// gradient exists: the batch norm's backward finds the ReLU's mask from x,
// as y was written (kernels.Backend.BatchNormBackward without y), so the
// backward holds two tensors of x's size at once, not three. That leaves
// one of the block's four saved activations out, for one elementwise pass
// in the backward. The block's other batch norm keeps its
// output: it is the block's, which the next block reads anyway.

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
func batchNormEval(x, residual, gamma, beta, runMean, runVar *T, p kernels.BNParams) *T {
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
	c := p.C
	y := Add(Mul(x, Reshape(scale, c, 1, 1)), Reshape(shift, c, 1, 1))
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
