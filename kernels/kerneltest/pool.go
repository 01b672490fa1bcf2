package kerneltest

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
)

// The pool family's cases (kernels.PoolOps).
var poolCases = []testCase{
	{"pool", func(s *suite) {
		for _, p := range []kernels.PoolParams{
			{N: 2, C: 3, H: 8, W: 8, KH: 2, KW: 2, SH: 2, SW: 2},
			{N: 1, C: 5, H: 7, W: 9, KH: 3, KW: 3, SH: 2, SW: 2, PH: 1, PW: 1},
			{N: 3, C: 4, H: 6, W: 5, KH: 3, KW: 2, SH: 1, SW: 1, PH: 1},
			{N: 256, C: 64, H: 7, W: 7, KH: 7, KW: 7, SH: 1, SW: 1},
		} {
			for _, dt := range dtypes {
				nx, ny := p.N*p.C*p.H*p.W, p.N*p.C*p.OutH()*p.OutW()
				x := s.randIn(dt, nx)
				dy := s.randIn(dt, ny)
				what := fmt.Sprintf("%v %+v", dt, p)
				for _, kind := range []string{"max", "avg"} {
					y, dx := s.out(dt, ny), s.out(dt, nx)
					if kind == "max" {
						s.got.MaxPool2d(p, x.got, y.got)
						s.ref.MaxPool2d(p, x.ref, y.ref)
						s.got.MaxPool2dBackward(p, x.got, dy.got, dx.got)
						s.ref.MaxPool2dBackward(p, x.ref, dy.ref, dx.ref)
					} else {
						s.got.AvgPool2d(p, x.got, y.got)
						s.ref.AvgPool2d(p, x.ref, y.ref)
						s.got.AvgPool2dBackward(p, dy.got, dx.got)
						s.ref.AvgPool2dBackward(p, dy.ref, dx.ref)
					}
					s.check(kind+" pool "+what, y, TolElementwise)
					s.check(kind+" pool backward "+what, dx, TolElementwise)
				}
			}
		}
	}},
}
