package kerneltest

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
)

// The elementwise family's cases (kernels.ElementwiseOps).
var elementwiseCases = []testCase{
	{"unary", func(s *suite) {
		for _, dt := range dtypes {
			for _, op := range kernels.UnaryOps() {
				n := 1 + s.rng.IntN(3000)
				vals := s.normal(n)
				if op.Def().Domain == kernels.Positive {
					vals = s.positive(n)
				}
				x := s.in(dt, vals)
				y := s.out(dt, n)
				s.got.Unary(op, y.got, x.got)
				s.ref.Unary(op, y.ref, x.ref)
				s.check(fmt.Sprintf("%v %v[%d]", op, dt, n), y, TolElementwise)
				dy := s.randIn(dt, n)
				dx := s.out(dt, n)
				xg, xr, yg, yr := x.got, x.ref, y.got, y.ref
				if op.Def().Uses != kernels.UsesOutput {
					yg, yr = kernels.Buf{}, kernels.Buf{}
				}
				if op.Def().Uses != kernels.UsesInput {
					xg, xr = kernels.Buf{}, kernels.Buf{}
				}
				s.got.UnaryBackward(op, dx.got, dy.got, xg, yg)
				s.ref.UnaryBackward(op, dx.ref, dy.ref, xr, yr)
				s.check(fmt.Sprintf("%v backward %v[%d]", op, dt, n), dx, TolElementwise)
			}
			x := s.randIn(dt, 999)
			y := s.out(dt, 999)
			s.got.Affine(y.got, x.got, -1.5, 0.25)
			s.ref.Affine(y.ref, x.ref, -1.5, 0.25)
			s.check("affine "+dt.String(), y, TolElementwise)
		}
	}},
	{"binary", func(s *suite) {
		shapes := [][3][]int{
			{{37, 5}, {37, 5}, {37, 5}},
			{{3, 4, 5}, {4, 1}, {3, 4, 5}},
			{{2, 16, 7, 7}, {1, 16, 1, 1}, {2, 16, 7, 7}},
			{{1}, {9, 3}, {9, 3}},
			{{3, 1}, {1, 4}, {3, 4}},
			{{5, 1, 3, 1, 2}, {4, 1, 7, 1}, {5, 4, 3, 7, 2}},
			{{300, 70}, {70}, {300, 70}},     // a linear layer's bias
			{{300, 70}, {300, 1}, {300, 70}}, // a scale a row
			{{64, 96}, {96}, {64, 96}},       // a bias four columns at a time
			{{48, 32}, {48, 32}, {48, 32}},   // the same shape four at a time
			// A position embedding over a batch: few rows longer than a
			// block's tile, four at a time and (odd columns) one at a time.
			{{3, 2, 2100}, {2, 2100}, {3, 2, 2100}},
			{{3, 1, 1501}, {1501}, {3, 1, 1501}},
		}
		for _, dt := range dtypes {
			for _, op := range kernels.BinaryOps() {
				for _, sh := range shapes {
					bc := kernels.NewBroadcast(sh[2], sh[0], sh[1])
					a := s.randIn(dt, prod(sh[0]))
					bv := s.normal(prod(sh[1]))
					if op.Def().PositiveB {
						bv = s.positive(len(bv))
					}
					b := s.in(dt, bv)
					y := s.out(dt, prod(sh[2]))
					s.got.Binary(op, y.got, a.got, b.got, bc)
					s.ref.Binary(op, y.ref, a.ref, b.ref, bc)
					s.check(fmt.Sprintf("%v %v %v %v", op, dt, sh[0], sh[1]), y, TolElementwise)
					if dt == kernels.F32 {
						continue
					}
					// An F32 result of one F32 and one 16-bit operand, either way round.
					a32 := s.randIn(kernels.F32, prod(sh[0]))
					b32 := s.in(kernels.F32, bv)
					for _, ab := range [][2]pair{{a32, b}, {a, b32}} {
						y := s.out(kernels.F32, prod(sh[2]))
						s.got.Binary(op, y.got, ab[0].got, ab[1].got, bc)
						s.ref.Binary(op, y.ref, ab[0].ref, ab[1].ref, bc)
						s.check(fmt.Sprintf("%v %v,%v->f32 %v %v", op, ab[0].dt, ab[1].dt, sh[0], sh[1]), y, TolElementwise)
					}
				}
			}
		}
	}},
}
