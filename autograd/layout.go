package autograd

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// The channels-last operations (Note [channels last] in package kernels)
// take image batches as N×H×W×C: Conv2dNHWC, BatchNormActNHWC,
// GlobalAvgPoolNHWC, with ToNHWC and ToNCHW between the two layouts. Their
// parameters are the channels-first operations' (a filter is K×C×R×S), so
// a model's state is the same in either layout.

// ToNHWC returns x (N×C×H×W) with its channels last: N×H×W×C. With one
// channel, or one pixel, that is a view of x.
func ToNHWC(x *T) *T {
	xs := x.Shape()
	if len(xs) != 4 {
		panic(fmt.Sprintf("autograd: to channels last of shape %v: want N×C×H×W", xs))
	}
	n, c, h, w := xs[0], xs[1], xs[2], xs[3]
	return permute("to_nhwc", x, kernels.ToChannelsLast(n, c, h*w), n, h, w, c)
}

// ToNCHW returns x (N×H×W×C) with its channels first: N×C×H×W, ToNHWC's
// inverse.
func ToNCHW(x *T) *T {
	xs := x.Shape()
	if len(xs) != 4 {
		panic(fmt.Sprintf("autograd: to channels first of shape %v: want N×H×W×C", xs))
	}
	n, h, w, c := xs[0], xs[1], xs[2], xs[3]
	return permute("to_nchw", x, kernels.ToChannelsFirst(n, c, h*w), n, c, h, w)
}

// filterNHWC is a filter (K×C×R×S) as a channels-last convolution reads it:
// K×R×S×C.
func filterNHWC(w *T) *T {
	ws := w.Shape()
	k, c, r, s := ws[0], ws[1], ws[2], ws[3]
	return permute("filter_nhwc", w, kernels.Transposition{Outer: k, Rows: c, Cols: r * s}, k, r, s, c)
}

// permute writes x transposed by t into a tensor of shape (a reshape where
// one of t's inner sides is 1, so that nothing moves); its gradient is
// transposed back.
func permute(name string, x *T, t kernels.Transposition, shape ...int) *T {
	if t.Len() != x.Numel() {
		panic(fmt.Sprintf("autograd: %s of shape %v by %+v", name, x.Shape(), t))
	}
	if t.Rows == 1 || t.Cols == 1 {
		return Reshape(x, shape...)
	}
	be := x.Backend()
	y := tensor.Empty(x.Device(), x.DType(), shape...)
	be.Transpose(y.Buf(), x.Buf(), t)
	if rec := begin(name, x); rec != nil {
		xs := x.Shape()
		back := kernels.Transposition{Outer: t.Outer, Rows: t.Cols, Cols: t.Rows}
		rec.finish(y, func(g *T) []*T {
			dx := tensor.Empty(g.Device(), g.DType(), xs...)
			be.Transpose(dx.Buf(), g.Buf(), back)
			return []*T{dx}
		})
	}
	return y
}

// GlobalAvgPoolNHWC averages each channel of x (N×H×W×C) into an N×C
// tensor.
func GlobalAvgPoolNHWC(x *T) *T {
	xs := x.Shape()
	if len(xs) != 4 {
		panic(fmt.Sprintf("autograd: global average pool of shape %v: want N×H×W×C", xs))
	}
	rows := Reshape(x, xs[0], xs[1]*xs[2], xs[3])
	defer rows.Release()
	return Mean(rows, 1)
}
