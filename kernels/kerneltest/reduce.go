package kerneltest

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
)

// The reduce family's cases (kernels.ReduceOps).
var reduceCases = []testCase{
	{"reduce", func(s *suite) {
		for _, dt := range dtypes {
			for _, r := range []kernels.Reduction{
				{Outer: 1, Len: 1, Inner: 1}, {Outer: 7, Len: 1000, Inner: 1}, {Outer: 1, Len: 100000, Inner: 1},
				{Outer: 3, Len: 33, Inner: 17}, {Outer: 1, Len: 256, Inner: 10}, {Outer: 64, Len: 49, Inner: 1},
				// few outputs over a long axis (a bias's gradient): split into stretches on CUDA,
				// four columns a lane where Inner is a multiple of 4
				{Outer: 1, Len: 5000, Inner: 40}, {Outer: 2, Len: 3001, Inner: 70}, {Outer: 2, Len: 2000, Inner: 132},
				{Outer: 1, Len: 4096, Inner: 768},
			} {
				x := s.randIn(dt, r.Outer*r.Len*r.Inner)
				for _, op := range []kernels.ReduceOp{kernels.Sum, kernels.Mean, kernels.Max} {
					y := s.out(dt, r.Outer*r.Inner)
					s.got.Reduce(op, y.got, x.got, r)
					s.ref.Reduce(op, y.ref, x.ref, r)
					s.check(fmt.Sprintf("%v %v %+v", op, dt, r), y, TolAccumulate)
					if op == kernels.Max {
						dy := s.randIn(dt, y.got.N)
						dx := s.out(dt, x.got.N)
						s.got.ReduceMaxBackward(dx.got, dy.got, x.got, y.got, r)
						s.ref.ReduceMaxBackward(dx.ref, dy.ref, x.ref, y.ref, r)
						s.check(fmt.Sprintf("max backward %v %+v", dt, r), dx, TolElementwise)
					}
				}
				am := s.out(kernels.I32, r.Outer*r.Inner)
				s.got.ArgMax(am.got, x.got, r)
				s.ref.ArgMax(am.ref, x.ref, r)
				s.check(fmt.Sprintf("argmax %v %+v", dt, r), am, 0)
			}
		}
	}},
}
