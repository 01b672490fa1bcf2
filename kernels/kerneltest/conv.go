package kerneltest

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
)

// The conv family's cases (kernels.ConvOps).
var convCases = []testCase{
	{"conv", func(s *suite) {
		var shapes []kernels.ConvParams
		for _, p := range ConvShapes { // each channels first and channels last
			last := p
			last.ChannelsLast = true
			shapes = append(shapes, p, last)
		}
		for _, p := range shapes {
			for _, dt := range dtypes {
				x := s.randIn(dt, p.N*p.C*p.H*p.W)
				w := s.randIn(dt, p.K*p.C*p.R*p.S)
				ny := p.N * p.K * p.OutH() * p.OutW()
				y := s.out(dt, ny)
				s.got.Conv2d(p, x.got, w.got, y.got)
				s.ref.Conv2d(p, x.ref, w.ref, y.ref)
				s.check(fmt.Sprintf("conv %v %+v", dt, p), y, s.opt.ConvTol)
				dy := s.randIn(dt, ny)
				dx := s.out(dt, x.got.N)
				s.got.Conv2dBackwardData(p, dy.got, w.got, dx.got)
				s.ref.Conv2dBackwardData(p, dy.ref, w.ref, dx.ref)
				s.check(fmt.Sprintf("conv backward data %v %+v", dt, p), dx, s.opt.ConvTol)
				dw := s.out(dt, w.got.N)
				s.got.Conv2dBackwardFilter(p, x.got, dy.got, dw.got)
				s.ref.Conv2dBackwardFilter(p, x.ref, dy.ref, dw.ref)
				s.check(fmt.Sprintf("conv backward filter %v %+v", dt, p), dw, s.opt.ConvTol)
			}
		}
	}},
}

// ConvShapes are the convolutions the suite checks: odd sizes, batch 1,
// stride 2, padding, 1×1 (direct), rectangular filters, and ResNet shapes.
var ConvShapes = []kernels.ConvParams{
	{N: 2, C: 3, H: 7, W: 6, K: 4, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
	{N: 1, C: 5, H: 9, W: 9, K: 3, R: 3, S: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1},
	{N: 3, C: 8, H: 5, W: 5, K: 6, R: 1, S: 1, StrideH: 1, StrideW: 1},
	{N: 2, C: 3, H: 8, W: 7, K: 5, R: 1, S: 1, StrideH: 2, StrideW: 2},
	{N: 5, C: 2, H: 6, W: 11, K: 2, R: 3, S: 5, StrideH: 2, StrideW: 1, PadH: 0, PadW: 2},
	{N: 8, C: 16, H: 28, W: 28, K: 16, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
	{N: 4, C: 32, H: 14, W: 14, K: 64, R: 3, S: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1},
}
