package autograd

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

func poolParams(op string, x *T, k, stride, pad int) kernels.PoolParams {
	xs := x.Shape()
	if len(xs) != 4 {
		panic(fmt.Sprintf("autograd: %s of shape %v: want N×C×H×W", op, xs))
	}
	p := kernels.PoolParams{N: xs[0], C: xs[1], H: xs[2], W: xs[3], KH: k, KW: k, SH: stride, SW: stride, PH: pad, PW: pad}
	if k <= 0 || stride <= 0 || pad < 0 || 2*pad > k || p.OutH() <= 0 || p.OutW() <= 0 {
		panic(fmt.Sprintf("autograd: %s of shape %v with kernel %d, stride %d, padding %d has no valid output", op, xs, k, stride, pad))
	}
	return p
}

// MaxPool2d takes the maximum over k×k windows of x (N×C×H×W), padding
// ignored. Its backward recomputes each window's maximum from the saved
// input instead of keeping an index tensor.
func MaxPool2d(x *T, k, stride, pad int) *T {
	p := poolParams("max pool", x, k, stride, pad)
	y := tensor.Empty(x.Device(), x.DType(), p.N, p.C, p.OutH(), p.OutW())
	be := x.Backend()
	be.MaxPool2d(p, x.Buf(), y.Buf())
	if rec := begin("max_pool2d", x); rec != nil {
		xs := rec.save(x)
		rec.finish(y, func(g *T) []*T {
			dx := emptyLike(xs)
			be.MaxPool2dBackward(p, xs.Buf(), g.Buf(), dx.Buf())
			return []*T{dx}
		})
	}
	return y
}

// AvgPool2d averages k×k windows of x, counting padding in the divisor.
func AvgPool2d(x *T, k, stride, pad int) *T {
	p := poolParams("avg pool", x, k, stride, pad)
	return avgPool(x, p)
}

func avgPool(x *T, p kernels.PoolParams) *T {
	y := tensor.Empty(x.Device(), x.DType(), p.N, p.C, p.OutH(), p.OutW())
	be := x.Backend()
	be.AvgPool2d(p, x.Buf(), y.Buf())
	if rec := begin("avg_pool2d", x); rec != nil {
		shape := x.Shape()
		rec.finish(y, func(g *T) []*T {
			dx := tensor.Empty(g.Device(), g.DType(), shape...)
			be.AvgPool2dBackward(p, g.Buf(), dx.Buf())
			return []*T{dx}
		})
	}
	return y
}

// GlobalAvgPool averages each channel of x (N×C×H×W) into an N×C tensor.
func GlobalAvgPool(x *T) *T {
	xs := x.Shape()
	if len(xs) != 4 {
		panic(fmt.Sprintf("autograd: global average pool of shape %v: want N×C×H×W", xs))
	}
	p := kernels.PoolParams{N: xs[0], C: xs[1], H: xs[2], W: xs[3], KH: xs[2], KW: xs[3], SH: 1, SW: 1}
	y := avgPool(x, p)
	out := Reshape(y, xs[0], xs[1])
	y.Release()
	return out
}
