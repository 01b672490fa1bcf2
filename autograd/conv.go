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
func Conv2d(x, w, b *T, stride, pad int) *T { return conv2d(x, w, b, stride, pad, false) }

// Conv2dNHWC is Conv2d of a channels-last x (N×H×W×C) into a channels-last
// result (N×OH×OW×K). The filters w are K×C×R×S as for Conv2d; the
// convolution reads a K×R×S×C copy of them (of their autocast copy, under
// Autocast), whose gradient returns to w transposed back.
func Conv2dNHWC(x, w, b *T, stride, pad int) *T { return conv2d(x, w, b, stride, pad, true) }

// conv2d is Conv2d, or Conv2dNHWC when last.
func conv2d(x, w, b *T, stride, pad int, last bool) *T {
	required("Conv2d", x, w)
	dev := ModeOf(x, w, b)
	if AutocastEnabled(dev) {
		defer autocastIn(dev, AutocastDType(dev), &x, &w, &b)()
	}
	xs, ws := x.Shape(), w.Shape()
	c := 1
	if len(xs) == 4 {
		c = xs[1]
		if last {
			c = xs[3]
		}
	}
	if len(xs) != 4 || len(ws) != 4 || c != ws[1] {
		want := "N×C×H×W"
		if last {
			want = "N×H×W×C"
		}
		panic(fmt.Sprintf("autograd: conv2d of input %v with weight %v: want %s and K×C×R×S with equal C", xs, ws, want))
	}
	if x.DType() != w.DType() {
		panic(fmt.Sprintf("autograd: conv2d of a %v input with a %v weight", x.DType(), w.DType()))
	}
	sameDevice("conv2d", x, w)
	p := kernels.ConvParams{N: xs[0], C: c, H: xs[2], W: xs[3], K: ws[0], R: ws[2], S: ws[3],
		StrideH: stride, StrideW: stride, PadH: pad, PadW: pad, ChannelsLast: last}
	if last {
		p.H, p.W = xs[1], xs[2]
	}
	if stride <= 0 || pad < 0 || p.OutH() <= 0 || p.OutW() <= 0 {
		panic(fmt.Sprintf("autograd: conv2d of input %v with weight %v, stride %d, padding %d has no output", xs, ws, stride, pad))
	}
	outShape, biasShape := []int{p.N, p.K, p.OutH(), p.OutW()}, []int{p.K, 1, 1}
	if last {
		outShape, biasShape = []int{p.N, p.OutH(), p.OutW(), p.K}, []int{p.K}
		w = filterNHWC(w)
		defer w.Release()
		ws = w.Shape()
	}
	be := x.Backend()
	y := tensor.Empty(dev, x.DType(), outShape...)
	be.Conv2d(p, x.Buf(), w.Buf(), y.Buf())
	if b != nil {
		if b.NDim() != 1 || b.Dim(0) != p.K {
			panic(fmt.Sprintf("autograd: conv2d bias of shape %v for %d filters", b.Shape(), p.K))
		}
		addBias(y, b, biasShape)
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
	if xSaved != nil && x.GradNode() == nil && !x.RequiresGrad() {
		// A convolution of the data: its output is written again from what
		// it keeps (Note [a convolution of the data written again]).
		if wSaved == nil {
			wSaved = rec.save(w)
		}
		var bSaved *T
		if hasBias {
			bSaved = rec.save(b)
		}
		rec.n.again = func() *T {
			y := tensor.Empty(xSaved.Device(), xSaved.DType(), outShape...)
			be.Conv2d(p, xSaved.Buf(), wSaved.Buf(), y.Buf())
			if bSaved != nil {
				addBias(y, bSaved, biasShape)
			}
			return y
		}
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
		if rec.needs(0) {
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
			grads[2] = biasGrad(g, biasShape, bType)
		}
		return grads
	})
	return y
}

// Note [a convolution of the data written again]: a network's first
// convolution reads the data (a tensor no gradient flows to, which the
// caller holds through the step) and keeps it for its filter gradient, so
// its output is one convolution away from what it keeps anyway, and that
// convolution is the network's cheapest: its input has the data's few
// channels (a ResNet stem's 3 or 1 against 64 and more). So its node can
// write the output again (node.again, with its weight kept too, a
// parameter or under autocast its small cast copy), and the batch norm
// that reads it keeps that recipe instead of its input: the stem's
// output is then not alive through the backward, only at the two moments
// it is read again (the stem's batch norm's backward, and the first
// block's input written again, by a checkpoint or a convolution). On a
// ResNet that is one activation of the first stage's size off every
// moment of the backward, for one or two convolutions of the data a step
// (the written-again output takes the forward's algorithm in an eager
// step; a planned step may choose another per call, as it does for a
// checkpoint's recomputation).
