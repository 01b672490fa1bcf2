package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/leangrad/leangrad/kernels"
)

// swapInner is the float64 reference of a transposition: dst[o][c][r] =
// src[o][r][c].
func swapInner(src []float64, outer, rows, cols int) []float64 {
	dst := make([]float64, len(src))
	for o := 0; o < outer; o++ {
		for r := 0; r < rows; r++ {
			for c := 0; c < cols; c++ {
				dst[(o*cols+c)*rows+r] = src[(o*rows+r)*cols+c]
			}
		}
	}
	return dst
}

func TestTranspose(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 1))
	for _, tr := range []kernels.Transposition{{Outer: 1, Rows: 1, Cols: 1}, {Outer: 3, Rows: 5, Cols: 7}, {Outer: 2, Rows: 33, Cols: 65}, {Outer: 128, Rows: 16, Cols: 9}, {Outer: 1, Rows: 784, Cols: 16}, {Outer: 4, Rows: 3, Cols: 1024}} {
		for _, dt := range []kernels.DType{kernels.F32, kernels.F16, kernels.BF16} {
			t.Run(fmt.Sprintf("%+v %v", tr, dt), func(t *testing.T) {
				x, xv := randBuf(t, rng, tr.Len())
				src := x
				if dt != kernels.F32 { // the reference is the rounded values: a transposition moves bits
					src = buf(t, dt, x.N)
					be.Cast(src, x)
					back := buf(t, kernels.F32, x.N)
					be.Cast(back, src)
					for i, v := range in(back) {
						xv[i] = float64(v)
					}
				}
				y := buf(t, dt, tr.Len())
				be.Transpose(y, src, tr)
				check(t, "transpose", y, swapInner(xv, tr.Outer, tr.Rows, tr.Cols), 0)
			})
		}
	}
}

// TestConvChannelsLast runs each direction of channels-last convolutions
// against the float64 loops of channels-first ones on the same values,
// laid out by swapInner.
func TestConvChannelsLast(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 1))
	for _, p := range []kernels.ConvParams{
		{N: 2, C: 3, H: 7, W: 6, K: 4, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 3, C: 5, H: 9, W: 7, K: 6, R: 3, S: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1},
		{N: 2, C: 4, H: 5, W: 5, K: 3, R: 1, S: 1, StrideH: 2, StrideW: 2},
		{N: 4, C: 1, H: 6, W: 11, K: 2, R: 3, S: 5, StrideH: 1, StrideW: 2, PadW: 2},
	} {
		p.ChannelsLast = true
		t.Run(fmt.Sprintf("%+v", p), func(t *testing.T) {
			oh, ow := p.OutH(), p.OutW()
			x, xv := randBuf(t, rng, p.N*p.H*p.W*p.C)
			w, wv := randBuf(t, rng, p.K*p.R*p.S*p.C)
			dy, dyv := randBuf(t, rng, p.N*oh*ow*p.K)
			// The same values channels first, for the reference loops.
			xf, wf := swapInner(xv, p.N, p.H*p.W, p.C), swapInner(wv, p.K, p.R*p.S, p.C)
			dyf := swapInner(dyv, p.N, oh*ow, p.K)
			dxf, dwf := convGradsRef(p, xf, wf, dyf)
			y := buf(t, kernels.F32, dy.N)
			be.Conv2d(p, x, w, y)
			check(t, "y", y, swapInner(convRef(p, xf, wf), p.N, p.K, oh*ow), 1e-5)
			dx, dw := buf(t, kernels.F32, x.N), buf(t, kernels.F32, w.N)
			be.Conv2dBackwardData(p, dy, w, dx)
			be.Conv2dBackwardFilter(p, x, dy, dw)
			check(t, "dx", dx, swapInner(dxf, p.N, p.C, p.H*p.W), 1e-5)
			check(t, "dw", dw, swapInner(dwf, p.K, p.C, p.R*p.S), 1e-5)
		})
	}
}
