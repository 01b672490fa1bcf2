package cpu

import (
	"fmt"
	"math"

	"github.com/leangrad/leangrad/kernels"
)

const elemGrain = 1 << 16

func unaryFunc(op kernels.UnaryOp) func(float32) float32 {
	switch op {
	case kernels.Neg:
		return func(x float32) float32 { return -x }
	case kernels.Exp:
		return func(x float32) float32 { return float32(math.Exp(float64(x))) }
	case kernels.Log:
		return func(x float32) float32 { return float32(math.Log(float64(x))) }
	case kernels.Sqrt:
		return func(x float32) float32 { return float32(math.Sqrt(float64(x))) }
	case kernels.Abs:
		return func(x float32) float32 { return float32(math.Abs(float64(x))) }
	case kernels.Square:
		return func(x float32) float32 { return x * x }
	case kernels.ReLU:
		return func(x float32) float32 { return max(x, 0) }
	case kernels.Sigmoid:
		return func(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }
	case kernels.Tanh:
		return func(x float32) float32 { return float32(math.Tanh(float64(x))) }
	case kernels.Recip:
		return func(x float32) float32 { return 1 / x }
	}
	panic(fmt.Sprintf("cpu: unknown unary op %v", op))
}

// unaryGrad returns op'(·) as a function of the forward's input x and output y.
func unaryGrad(op kernels.UnaryOp) func(dy, x, y float32) float32 {
	switch op {
	case kernels.Neg:
		return func(dy, x, y float32) float32 { return -dy }
	case kernels.Exp:
		return func(dy, x, y float32) float32 { return dy * y }
	case kernels.Log:
		return func(dy, x, y float32) float32 { return dy / x }
	case kernels.Sqrt:
		return func(dy, x, y float32) float32 { return dy * 0.5 / y }
	case kernels.Abs:
		return func(dy, x, y float32) float32 {
			switch {
			case x > 0:
				return dy
			case x < 0:
				return -dy
			}
			return 0
		}
	case kernels.Square:
		return func(dy, x, y float32) float32 { return 2 * x * dy }
	case kernels.ReLU:
		return func(dy, x, y float32) float32 {
			if y > 0 {
				return dy
			}
			return 0
		}
	case kernels.Sigmoid:
		return func(dy, x, y float32) float32 { return dy * y * (1 - y) }
	case kernels.Tanh:
		return func(dy, x, y float32) float32 { return dy * (1 - y*y) }
	case kernels.Recip:
		return func(dy, x, y float32) float32 { return -dy * y * y }
	}
	panic(fmt.Sprintf("cpu: unknown unary op %v", op))
}

// Unary computes dst = op(x).
func (c *Backend) Unary(op kernels.UnaryOp, dst, x kernels.Buf) {
	kernels.CheckLen("unary "+op.String(), x.N, dst)
	f := unaryFunc(op)
	xs, doneX := view(x)
	defer doneX()
	ys, done := out(dst)
	parallel(len(ys), elemGrain, func(lo, hi int) {
		y, x := ys[lo:hi], xs[lo:hi]
		if op == kernels.ReLU { // the common one, without a call per element
			n := reluVec(y, x)
			y, x = y[n:], x[n:]
			for i, v := range x {
				y[i] = max(v, 0)
			}
			return
		}
		for i, v := range x {
			y[i] = f(v)
		}
	})
	done()
}

// UnaryBackward computes dx = dy·op'(x). Only the one of x and y that op's
// derivative needs must be valid.
func (c *Backend) UnaryBackward(op kernels.UnaryOp, dx, dy, x, y kernels.Buf) {
	kernels.CheckLen("unary backward "+op.String(), dy.N, dx)
	g := unaryGrad(op)
	dys, doneDY := view(dy)
	defer doneDY()
	xs, doneX := optView(x)
	defer doneX()
	ys, doneY := optView(y)
	defer doneY()
	if x.Valid() {
		kernels.CheckLen("unary backward x", dy.N, x)
	}
	if y.Valid() {
		kernels.CheckLen("unary backward y", dy.N, y)
	}
	dxs, done := out(dx)
	parallel(len(dxs), elemGrain, func(lo, hi int) {
		if op == kernels.ReLU && len(ys) > 0 { // the common one, without a call per element
			d, g, y := dxs[lo:hi], dys[lo:hi], ys[lo:hi]
			n := reluGradVec(d, g, y)
			d, g, y = d[n:], g[n:], y[n:]
			for i, v := range g {
				// A mask rather than a branch: the signs are random, and a
				// mispredicted branch costs more than the rest of the loop.
				// As unaryGrad, a NaN y passes no gradient.
				var keep uint32
				if y[i] > 0 {
					keep = ^uint32(0)
				}
				d[i] = math.Float32frombits(math.Float32bits(v) & keep)
			}
			return
		}
		for i := lo; i < hi; i++ {
			var xv, yv float32
			if len(xs) > 0 {
				xv = xs[i]
			}
			if len(ys) > 0 {
				yv = ys[i]
			}
			dxs[i] = g(dys[i], xv, yv)
		}
	})
	done()
}

// Affine computes dst = alpha·x + beta.
func (c *Backend) Affine(dst, x kernels.Buf, alpha, beta float32) {
	kernels.CheckLen("affine", x.N, dst)
	xs, doneX := view(x)
	defer doneX()
	ys, done := out(dst)
	parallel(len(ys), elemGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			ys[i] = alpha*xs[i] + beta
		}
	})
	done()
}

// Binary computes dst = a op b with broadcasting.
func (c *Backend) Binary(op kernels.BinaryOp, dst, a, b kernels.Buf, bc kernels.Broadcast) {
	kernels.CheckLen("binary "+op.String(), bc.Len(), dst)
	var f func(x, y float32) float32
	switch op {
	case kernels.Add:
		f = func(x, y float32) float32 { return x + y }
	case kernels.Sub:
		f = func(x, y float32) float32 { return x - y }
	case kernels.Mul:
		f = func(x, y float32) float32 { return x * y }
	case kernels.Div:
		f = func(x, y float32) float32 { return x / y }
	default:
		panic(fmt.Sprintf("cpu: unknown binary op %v", op))
	}
	if bc.Same() && a.DType == kernels.F16 && b.DType == kernels.F16 && dst.DType == kernels.F16 {
		// AMP's sums of F16 gradients: converted a few thousand values at a
		// time on the stack, not each operand into a float32 copy.
		kernels.CheckLen("binary "+op.String(), dst.N, a, b)
		av, bv, yv := valuesOf(a), valuesOf(b), valuesOf(dst)
		parallel(dst.N, elemGrain, func(lo, hi int) {
			var x, z [2048]float32
			for at := lo; at < hi; at += len(x) {
				k := min(len(x), hi-at)
				av.read(x[:k], at)
				bv.read(z[:k], at)
				binarySame(op, f, x[:k], x[:k], z[:k])
				yv.write(at, x[:k])
			}
		})
		return
	}
	as, doneA := view(a)
	defer doneA()
	bs, doneB := view(b)
	defer doneB()
	ys, done := out(dst)
	if bc.Same() {
		kernels.CheckLen("binary "+op.String(), len(ys), a, b)
		parallel(len(ys), elemGrain, func(lo, hi int) { binarySame(op, f, ys[lo:hi], as[lo:hi], bs[lo:hi]) })
		done()
		return
	}
	// Broadcast: walk the last (collapsed) dimension with strides, compute
	// the offsets of each row once.
	last := bc.NDim - 1
	rowLen := bc.Shape[last]
	sa, sb := bc.StrideA[last], bc.StrideB[last]
	rows := len(ys) / rowLen
	parallel(rows, max(1, elemGrain/rowLen), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			oa, ob := bc.Offsets(r * rowLen)
			binaryRow(op, f, ys[r*rowLen:(r+1)*rowLen], as, oa, sa, bs, ob, sb)
		}
	})
	done()
}

// binarySame writes y = x op z, element by element: one loop per op,
// without a call per element where it can.
func binarySame(op kernels.BinaryOp, f func(x, y float32) float32, y, x, z []float32) {
	switch op {
	case kernels.Add:
		for i, v := range x {
			y[i] = v + z[i]
		}
	case kernels.Sub:
		for i, v := range x {
			y[i] = v - z[i]
		}
	case kernels.Mul:
		for i, v := range x {
			y[i] = v * z[i]
		}
	default:
		for i, v := range x {
			y[i] = f(v, z[i])
		}
	}
}

// binaryRow computes y[j] = a[oa+j·sa] op b[ob+j·sb]: one loop per common
// op, without a call per element (a bias added to every row of a batch).
func binaryRow(op kernels.BinaryOp, f func(x, y float32) float32, y, a []float32, oa, sa int, b []float32, ob, sb int) {
	switch op {
	case kernels.Add:
		for j := range y {
			y[j] = a[oa+j*sa] + b[ob+j*sb]
		}
	case kernels.Mul:
		for j := range y {
			y[j] = a[oa+j*sa] * b[ob+j*sb]
		}
	default:
		for j := range y {
			y[j] = f(a[oa+j*sa], b[ob+j*sb])
		}
	}
}
