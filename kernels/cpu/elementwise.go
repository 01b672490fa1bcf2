package cpu

import (
	"math"

	"github.com/leangrad/leangrad/kernels"
)

const elemGrain = 1 << 16

// chunkLen is how many values of each operand an elementwise operation or a
// reduction holds as float32 at a time. F32 operands are read and written
// in place; F16 ones are converted a chunk at a time on the stack, hot in
// L1, so no operation makes a float32 copy of a whole F16 tensor.
const chunkLen = 2048

// Unary computes dst = op(x).
func (c *Backend) Unary(op kernels.UnaryOp, dst, x kernels.Buf) {
	kernels.CheckLen("unary "+op.String(), x.N, dst)
	f := op.Def().F
	mapChunks(valuesOf(dst), valuesOf(x), x.N, func(y, x []float32) {
		switch op { // the common ones, without a call per element
		case kernels.ReLU:
			n := reluVec(y, x)
			for i, v := range x[n:] {
				y[n+i] = max(v, 0)
			}
			return
		case kernels.GELU:
			geluRow(y, x)
			return
		}
		for i, v := range x {
			y[i] = f(v)
		}
	})
}

// geluRow writes GELU of x into y, which may be x: the tanh form
// (kernels.GELU) as x·σ(2u) = x / (1 + e^(−2u)), u = √(2/π)(x +
// 0.044715x³), in float32 with expf's exponentials (eight an instruction
// with AVX2) and u and the quotient sixteen an instruction with AVX-512
// (geluInVec, geluOutVec: the Go loops' bits), a stretch at a time, within
// a few ulp of the float64 definition where GELU's F rounds it, and
// several times cheaper.
func geluRow(y, x []float32) {
	var t [geluStretch]float32
	for len(x) > 0 {
		n := min(len(x), len(t))
		if !geluInVec(t[:n], x[:n]) {
			for i, v := range x[:n] {
				t[i] = -2 * geluC * (v + 0.044715*v*v*v)
			}
		}
		k, _ := expShiftVec(t[:n], 0)
		for i := k; i < n; i++ {
			t[i] = expf(t[i])
		}
		if !geluOutVec(y[:n], x[:n], t[:n]) {
			for i, v := range x[:n] {
				y[i] = v / (1 + t[i])
			}
		}
		x, y = x[n:], y[n:]
	}
}

// geluStretch is the values geluRow takes at a time: a stretch on the
// stack, zeroed at each call, and the epilogue calls it a tile's row (a
// few dozen values) at a time.
const geluStretch = 256

// geluC is √(2/π), GELU's tanh form's scale.
const geluC = 0.7978845608028654

// mapChunks runs f(y, x) over n values of x and y a chunk at a time (see
// chunkLen), over goroutines: in place for F32, through float32 scratch
// for F16 and BF16.
func mapChunks(yv, xv values, n int, f func(y, x []float32)) {
	parallel(n, elemGrain, func(lo, hi int) {
		xb, yb := getScratch(chunkLen), getScratch(chunkLen)
		defer putScratch(xb)
		defer putScratch(yb)
		for at := lo; at < hi; at += chunkLen {
			k := min(chunkLen, hi-at)
			y := yv.target(at, k, yb)
			f(y, xv.span(at, k, xb))
			yv.commit(at, y)
		}
	})
}

// UnaryBackward computes dx = dy·op'(x). Only the one of x and y that op's
// derivative needs must be valid.
func (c *Backend) UnaryBackward(op kernels.UnaryOp, dx, dy, x, y kernels.Buf) {
	kernels.CheckLen("unary backward "+op.String(), dy.N, dx)
	if x.Valid() {
		kernels.CheckLen("unary backward x", dy.N, x)
	}
	if y.Valid() {
		kernels.CheckLen("unary backward y", dy.N, y)
	}
	g := op.Def().Grad
	dyv, xv, yv, dxv := valuesOf(dy), optValuesOf(x), optValuesOf(y), valuesOf(dx)
	parallel(dy.N, elemGrain, func(lo, hi int) {
		if op == kernels.ReLU && dxv.f16 != nil && dyv.f16 != nil && yv.f16 != nil &&
			reluGradHalf(dxv.f16[lo:hi], dyv.f16[lo:hi], yv.f16[lo:hi]) {
			return // on the F16 bits, nothing converted
		}
		var gb, xb, yb, db [chunkLen]float32
		for at := lo; at < hi; at += chunkLen {
			k := min(chunkLen, hi-at)
			dy, xs, ys, d := dyv.span(at, k, gb[:]), xv.span(at, k, xb[:]), yv.span(at, k, yb[:]), dxv.target(at, k, db[:])
			if op == kernels.ReLU && ys != nil { // the common one, without a call per element
				reluGrad(d, dy, ys)
			} else {
				for i, v := range dy {
					var xi, yi float32
					if xs != nil {
						xi = xs[i]
					}
					if ys != nil {
						yi = ys[i]
					}
					d[i] = g(v, xi, yi)
				}
			}
			dxv.commit(at, d)
		}
	})
}

// reluGrad writes d = dy where y > 0 and 0 elsewhere (a NaN y passes no
// gradient, as ReLU's Grad).
func reluGrad(d, dy, y []float32) {
	n := reluGradVec(d, dy, y)
	for i, v := range dy[n:] {
		// A mask rather than a branch: the signs are random, and a
		// mispredicted branch costs more than the rest of the loop.
		var keep uint32
		if y[n+i] > 0 {
			keep = ^uint32(0)
		}
		d[n+i] = math.Float32frombits(math.Float32bits(v) & keep)
	}
}

// Affine computes dst = alpha·x + beta.
func (c *Backend) Affine(dst, x kernels.Buf, alpha, beta float32) {
	kernels.CheckLen("affine", x.N, dst)
	mapChunks(valuesOf(dst), valuesOf(x), x.N, func(y, x []float32) {
		for i, v := range x {
			y[i] = alpha*v + beta
		}
	})
}

// Binary computes dst = a op b with broadcasting.
func (c *Backend) Binary(op kernels.BinaryOp, dst, a, b kernels.Buf, bc kernels.Broadcast) {
	kernels.CheckLen("binary "+op.String(), bc.Len(), dst)
	f := op.Def().F
	av, bv, yv := valuesOf(a), valuesOf(b), valuesOf(dst)
	if bc.Same() {
		kernels.CheckLen("binary "+op.String(), dst.N, a, b)
		parallel(dst.N, elemGrain, func(lo, hi int) {
			if binaryVec(op, yv, av, bv, lo, lo, lo, hi-lo) {
				return
			}
			var xb, zb, yb [chunkLen]float32
			for at := lo; at < hi; at += chunkLen {
				k := min(chunkLen, hi-at)
				y := yv.target(at, k, yb[:])
				binarySame(op, f, y, av.span(at, k, xb[:]), bv.span(at, k, zb[:]))
				yv.commit(at, y)
			}
		})
		return
	}
	// Broadcast: walk the last (collapsed) dimension with strides, compute
	// the offsets of each row once.
	last := bc.NDim - 1
	rowLen := bc.Shape[last]
	sa, sb := bc.StrideA[last], bc.StrideB[last]
	rows := dst.N / rowLen
	parallel(rows, max(1, elemGrain/rowLen), func(lo, hi int) {
		var xb, zb, yb [chunkLen]float32
		for r := lo; r < hi; r++ {
			oa, ob := bc.Offsets(r * rowLen)
			if sa == 1 && sb == 1 && binaryVec(op, yv, av, bv, r*rowLen, oa, ob, rowLen) {
				continue // rows of both operands in place (a bias added to each row)
			}
			for j := 0; j < rowLen; j += chunkLen {
				k, at := min(chunkLen, rowLen-j), r*rowLen+j
				y := yv.target(at, k, yb[:])
				binarySame(op, f, y, av.strided(oa+j*sa, sa, k, xb[:]), bv.strided(ob+j*sb, sb, k, zb[:]))
				yv.commit(at, y)
			}
		}
	})
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
