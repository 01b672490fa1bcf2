package cpu

import (
	"fmt"
	"math"

	"github.com/leangrad/leangrad/kernels"
)

// Reduce reduces x along the middle axis of r. Sums accumulate in float64.
// An F16 x is converted a chunk at a time as the reduction reads it
// (chunkLen).
func (c *Backend) Reduce(op kernels.ReduceOp, dst, x kernels.Buf, r kernels.Reduction) {
	kernels.CheckReduction("reduce "+op.String(), r, x, dst)
	if x.DType == kernels.I32 {
		panic(fmt.Sprintf("cpu: reduce %v of an i32 buffer", op))
	}
	xv := valuesOf(x)
	ys, done := out(dst)
	parallel(r.Outer*r.Inner, max(1, elemGrain/r.Len), func(lo, hi int) {
		var buf [chunkLen]float32
		if r.Inner > 1 {
			// Rows at a time: outputs [o, o+n) of one outer index are
			// contiguous in every row, so the reduction runs along
			// memory and its sums do not wait on each other.
			var acc [chunkLen + 16]float64
			for o := lo; o < hi; {
				outer, in := o/r.Inner, o%r.Inner
				n := min(hi-o, r.Inner-in, chunkLen)
				reduceRows(op, ys[o:o+n], acc[:n+16], buf[:n], xv, (outer*r.Len)*r.Inner+in, r.Inner, r.Len)
				o += n
			}
			return
		}
		for o := lo; o < hi; o++ {
			ys[o] = reduceRow(op, xv, o*r.Len, r.Len, buf[:])
		}
	})
	done()
}

// reduceRows reduces len(y) adjacent columns of rows rows of x, the first at
// off, row stride ld, into y, with buf (len(y)) and acc (len(y)+16: the
// assembly's padding) as scratch. Sums run in assembly where the CPU has it
// (sumRowsVec), in the same order as the Go loop.
func reduceRows(op kernels.ReduceOp, y []float32, acc []float64, buf []float32, x values, off, ld, rows int) {
	switch op {
	case kernels.Sum, kernels.Mean:
		clear(acc)
		if !sumRowsVec(acc, x, off, ld, rows) {
			for j := range rows {
				for i, v := range x.span(off+j*ld, len(y), buf) {
					acc[i] += float64(v)
				}
			}
		}
		for i, v := range acc[:len(y)] {
			if op == kernels.Mean {
				v /= float64(rows)
			}
			y[i] = float32(v)
		}
	case kernels.Max:
		for i := range y {
			y[i] = float32(math.Inf(-1))
		}
		for j := range rows {
			for i, v := range x.span(off+j*ld, len(y), buf) {
				y[i] = max(y[i], v)
			}
		}
	default:
		panic(fmt.Sprintf("cpu: unknown reduction %v", op))
	}
}

// reduceRow reduces the n contiguous values of x at off, reading them
// len(buf) at a time.
func reduceRow(op kernels.ReduceOp, x values, off, n int, buf []float32) float32 {
	var s float64
	m := float32(math.Inf(-1))
	for c := 0; c < n; c += len(buf) {
		for _, v := range x.span(off+c, min(len(buf), n-c), buf) {
			s += float64(v)
			m = max(m, v)
		}
	}
	switch op {
	case kernels.Sum:
		return float32(s)
	case kernels.Mean:
		return float32(s / float64(n))
	case kernels.Max:
		return m
	}
	panic(fmt.Sprintf("cpu: unknown reduction %v", op))
}

// ReduceMaxBackward routes dy to every element equal to its row's maximum.
func (c *Backend) ReduceMaxBackward(dx, dy, x, y kernels.Buf, r kernels.Reduction) {
	kernels.CheckReduction("reduce max backward", r, x, dy)
	kernels.CheckLen("reduce max backward", x.N, dx)
	kernels.CheckLen("reduce max backward", dy.N, y)
	xs, doneX := view(x)
	defer doneX()
	ys, doneY := view(y)
	defer doneY()
	dys, doneDY := view(dy)
	defer doneDY()
	dxs, done := out(dx)
	for i := range dxs {
		o := i/(r.Len*r.Inner)*r.Inner + i%r.Inner
		if xs[i] == ys[o] {
			dxs[i] = dys[o]
		} else {
			dxs[i] = 0
		}
	}
	done()
}

// ArgMax writes the index of the first maximum along the middle axis.
func (c *Backend) ArgMax(dst, x kernels.Buf, r kernels.Reduction) {
	kernels.CheckReduction("argmax", r, x, dst)
	xs, doneX := view(x)
	defer doneX()
	d := i32s(dst)
	for o := range d {
		base := o/r.Inner*r.Len*r.Inner + o%r.Inner
		best, bi := float32(math.Inf(-1)), 0
		for j := 0; j < r.Len; j++ {
			if v := xs[base+j*r.Inner]; v > best {
				best, bi = v, j
			}
		}
		d[o] = int32(bi)
	}
}
