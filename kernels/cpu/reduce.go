package cpu

import (
	"fmt"
	"math"

	"github.com/leangrad/leangrad/kernels"
)

// Reduce reduces x along the middle axis of r. Sums accumulate in float64.
func (c *Backend) Reduce(op kernels.ReduceOp, dst, x kernels.Buf, r kernels.Reduction) {
	kernels.CheckReduction("reduce "+op.String(), r, x, dst)
	xs, doneX := view(x)
	defer doneX()
	ys, done := out(dst)
	parallel(r.Outer*r.Inner, max(1, elemGrain/r.Len), func(lo, hi int) {
		if (op == kernels.Sum || op == kernels.Mean) && r.Inner > 1 {
			// Rows at a time: outputs [o, o+n) of one outer index are
			// contiguous in every row, so the sums run along memory and
			// do not wait on each other.
			acc := make([]float64, min(hi-lo, r.Inner))
			for o := lo; o < hi; {
				outer, in := o/r.Inner, o%r.Inner
				n := min(hi-o, r.Inner-in)
				a := acc[:n]
				clear(a)
				for j := 0; j < r.Len; j++ {
					for i, v := range xs[(outer*r.Len+j)*r.Inner+in:][:n] {
						a[i] += float64(v)
					}
				}
				for i, v := range a {
					if op == kernels.Mean {
						v /= float64(r.Len)
					}
					ys[o+i] = float32(v)
				}
				o += n
			}
			return
		}
		for o := lo; o < hi; o++ {
			base := o/r.Inner*r.Len*r.Inner + o%r.Inner
			switch op {
			case kernels.Sum, kernels.Mean:
				var s float64
				for j := 0; j < r.Len; j++ {
					s += float64(xs[base+j*r.Inner])
				}
				if op == kernels.Mean {
					s /= float64(r.Len)
				}
				ys[o] = float32(s)
			case kernels.Max:
				m := float32(math.Inf(-1))
				for j := 0; j < r.Len; j++ {
					m = max(m, xs[base+j*r.Inner])
				}
				ys[o] = m
			default:
				panic(fmt.Sprintf("cpu: unknown reduction %v", op))
			}
		}
	})
	done()
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
