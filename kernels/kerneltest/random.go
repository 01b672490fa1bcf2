package kerneltest

import (
	"fmt"
	"slices"

	"github.com/leangrad/leangrad/kernels"
)

// The random family's cases (kernels.RandomOps).
var randomCases = []testCase{
	{"random", func(s *suite) {
		for _, dt := range dtypes {
			for _, n := range []int{1, 7, 4096, 100003} {
				g := kernels.Philox{Seed: uint64(n) * 31, Offset: uint64(n)}
				u := s.out(dt, n)
				s.got.Uniform(u.got, -2, 3, g)
				s.ref.Uniform(u.ref, -2, 3, g)
				s.check(fmt.Sprintf("uniform %v[%d]", dt, n), u, TolElementwise)
				z := s.out(dt, n)
				s.got.Normal(z.got, 0.5, 2, g)
				s.ref.Normal(z.ref, 0.5, 2, g)
				s.check(fmt.Sprintf("normal %v[%d]", dt, n), z, TolElementwise)
				x := s.randIn(dt, n)
				d := s.out(dt, n)
				s.got.Dropout(d.got, x.got, 0.3, g)
				s.ref.Dropout(d.ref, x.ref, 0.3, g)
				s.check(fmt.Sprintf("dropout %v[%d]", dt, n), d, TolElementwise)
				// The same draw with part of the offset in a device counter.
				base := s.in(kernels.I32, []float32{float32(n / 2), 0})
				gb := kernels.Philox{Seed: g.Seed, Offset: g.Offset - uint64(n/2)}
				gg, gr := gb, gb
				gg.Base, gr.Base = base.got, base.ref
				db := s.out(dt, n)
				s.got.Dropout(db.got, x.got, 0.3, gg)
				s.ref.Dropout(db.ref, x.ref, 0.3, gr)
				s.check(fmt.Sprintf("dropout with a device base %v[%d]", dt, n), db, TolElementwise)
				if !slices.Equal(s.read(db.got, s.got), s.read(d.got, s.got)) {
					s.t.Errorf("dropout %v[%d]: offset %d+%d on the device differs from %d", dt, n, g.Offset-uint64(n/2), n/2, g.Offset)
				}
				ub := s.out(dt, n)
				s.got.Normal(ub.got, 0.5, 2, gg)
				s.ref.Normal(ub.ref, 0.5, 2, gr)
				s.check(fmt.Sprintf("normal with a device base %v[%d]", dt, n), ub, TolElementwise)
			}
		}
	}},
}
