package autograd

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// Conv2d returns the 2-D convolution of x (N×C×H×W) with w (K×C×R×S), with
// the given stride and zero padding (the same along both axes), plus an
// optional bias b of K.
//
// Under Autocast the convolution runs in its dtype on copies of x, w and b.
func Conv2d(x, w, b *T, stride, pad int) *T {
	dev := ModeOf(x, w, b)
	if AutocastEnabled(dev) {
		defer autocastIn(dev, AutocastDType(dev), &x, &w, &b)()
	}
	xs, ws := x.Shape(), w.Shape()
	if len(xs) != 4 || len(ws) != 4 || xs[1] != ws[1] {
		panic(fmt.Sprintf("autograd: conv2d of input %v with weight %v: want N×C×H×W and K×C×R×S with equal C", xs, ws))
	}
	if x.DType() != w.DType() {
		panic(fmt.Sprintf("autograd: conv2d of a %v input with a %v weight", x.DType(), w.DType()))
	}
	sameDevice("conv2d", x, w)
	p := kernels.ConvParams{N: xs[0], C: xs[1], H: xs[2], W: xs[3], K: ws[0], R: ws[2], S: ws[3],
		StrideH: stride, StrideW: stride, PadH: pad, PadW: pad}
	if stride <= 0 || pad < 0 || p.OutH() <= 0 || p.OutW() <= 0 {
		panic(fmt.Sprintf("autograd: conv2d of input %v with weight %v, stride %d, padding %d has no output", xs, ws, stride, pad))
	}
	be := x.Backend()
	y := tensor.Empty(dev, x.DType(), p.N, p.K, p.OutH(), p.OutW())
	be.Conv2d(p, x.Buf(), w.Buf(), y.Buf())
	if b != nil {
		if b.NDim() != 1 || b.Dim(0) != p.K {
			panic(fmt.Sprintf("autograd: conv2d bias of shape %v for %d filters", b.Shape(), p.K))
		}
		addBias(y, b, []int{p.K, 1, 1})
	}
	rec := begin("conv2d", x, w, b)
	if rec == nil {
		return y
	}
	var xSaved, wSaved *T
	var xAgain func() *T // x written again for the filter gradient, instead of saved
	if rec.needs(1) {
		if xAgain = writtenAgain(x); xAgain == nil {
			xSaved = rec.save(x)
		}
	}
	if rec.needs(0) {
		wSaved = rec.save(w)
	}
	hasBias := b != nil
	var bType tensor.DType
	if hasBias {
		bType = b.DType()
	}
	rec.finish(y, func(g *T) []*T {
		grads := make([]*T, 3)
		if xAgain != nil { // first, so that x is freed before dx exists
			x := xAgain()
			dw := tensor.Empty(g.Device(), g.DType(), ws...)
			be.Conv2dBackwardFilter(p, x.Buf(), g.Buf(), dw.Buf())
			x.Release()
			grads[1] = dw
		}
		if wSaved != nil {
			dx := tensor.Empty(g.Device(), g.DType(), xs...)
			be.Conv2dBackwardData(p, g.Buf(), wSaved.Buf(), dx.Buf())
			grads[0] = dx
		}
		if xSaved != nil {
			dw := tensor.Empty(g.Device(), g.DType(), ws...)
			be.Conv2dBackwardFilter(p, xSaved.Buf(), g.Buf(), dw.Buf())
			grads[1] = dw
		}
		if hasBias && rec.needs(2) {
			grads[2] = biasGrad(g, []int{p.K, 1, 1}, bType)
		}
		return grads
	})
	return y
}
