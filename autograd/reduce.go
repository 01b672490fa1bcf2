package autograd

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// axisReduction views shape as (outer, shape[axis], inner).
func axisReduction(shape []int, axis int) (kernels.Reduction, []int) {
	if axis < 0 {
		axis += len(shape)
	}
	if axis < 0 || axis >= len(shape) {
		panic(fmt.Sprintf("autograd: axis out of range for shape %v", shape))
	}
	r := kernels.Reduction{Outer: prod(shape[:axis]), Len: shape[axis], Inner: prod(shape[axis+1:])}
	out := append(append([]int(nil), shape[:axis]...), shape[axis+1:]...)
	return r, out
}

// Sum sums x along axis, dropping it.
func Sum(x *T, axis int) *T { return reduceAxis(kernels.Sum, x, axis) }

// Mean averages x along axis, dropping it.
func Mean(x *T, axis int) *T { return reduceAxis(kernels.Mean, x, axis) }

// Max takes the maximum of x along axis, dropping it. The gradient goes to
// every element equal to the maximum.
func Max(x *T, axis int) *T { return reduceAxis(kernels.Max, x, axis) }

// SumAll sums every element of x into a one-element tensor of shape [1].
func SumAll(x *T) *T { return reduceAll(kernels.Sum, x) }

// MeanAll averages every element of x into a tensor of shape [1].
func MeanAll(x *T) *T { return reduceAll(kernels.Mean, x) }

// reduceAll reduces x as one row.
func reduceAll(op kernels.ReduceOp, x *T) *T {
	required(op.String(), x)
	row := Reshape(x, 1, -1)
	defer row.Release()
	return reduceAxis(op, row, 1)
}

func reduceAxis(op kernels.ReduceOp, x *T, axis int) *T {
	required(op.String(), x)
	if dev := x.Device(); AutocastEnabled(dev) && op != kernels.Max {
		x = autocastTo(dev, x, tensor.F32)
		defer x.Release()
	}
	shape := x.Shape()
	r, outShape := axisReduction(shape, axis)
	y := tensor.Empty(x.Device(), x.DType(), outShape...)
	x.Backend().Reduce(op, y.Buf(), x.Buf(), r)
	rec := begin(op.String(), x)
	if rec == nil {
		return y
	}
	var xs, ys *T
	if op == kernels.Max {
		xs, ys = rec.save(x), rec.save(y)
	}
	rec.finish(y, func(g *T) []*T {
		dx := tensor.Empty(g.Device(), g.DType(), shape...)
		b := g.Backend()
		switch op {
		case kernels.Max:
			b.ReduceMaxBackward(dx.Buf(), g.Buf(), xs.Buf(), ys.Buf(), r)
		default:
			// Broadcast g (outer, 1, inner) over the reduced axis.
			scale := float32(1)
			if op == kernels.Mean {
				scale = 1 / float32(r.Len)
			}
			zero := tensor.Zeros(g.Device(), g.DType(), 1)
			defer zero.Release()
			gs := []int{r.Outer, 1, r.Inner}
			full := []int{r.Outer, r.Len, r.Inner}
			b.Binary(kernels.Add, dx.Buf(), g.Buf(), zero.Buf(), kernels.NewBroadcast(full, gs, []int{1}))
			if scale != 1 {
				b.Affine(dx.Buf(), dx.Buf(), scale, 0)
			}
		}
		return []*T{dx}
	})
	return y
}

// ArgMax returns, as an I32 tensor, the index of the maximum along axis.
// It is not differentiable.
func ArgMax(x *T, axis int) *T {
	r, outShape := axisReduction(x.Shape(), axis)
	y := tensor.Empty(x.Device(), tensor.I32, outShape...)
	x.Backend().ArgMax(y.Buf(), x.Buf(), r)
	return y
}
