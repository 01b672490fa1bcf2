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
// the data, forward and backward. It saves x and, with relu, its output
// (whose sign is the ReLU's mask): what the unfused operations would save.
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
	var ySaved *T
	if relu {
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
		if rec.needs(3) {
			dres = emptyLike(g)
		}
		be.BatchNormBackward(p, xSaved.Buf(), bufOf(ySaved), g.Buf(), gSaved.Buf(), mean.Buf(), invStd.Buf(), dx.Buf(), bufOf(dres), dgamma.Buf(), dbeta.Buf())
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
