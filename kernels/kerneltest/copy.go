package kerneltest

import (
	"fmt"
	"slices"

	"github.com/leangrad/leangrad/kernels"
)

// The copy family's cases (kernels.CopyOps).
var copyCases = []testCase{
	{"fill-copy-cast", func(s *suite) {
		for _, dt := range []kernels.DType{kernels.F32, kernels.F16, kernels.BF16, kernels.I32} {
			o := s.out(dt, 1001)
			s.got.Fill(o.got, 3)
			s.ref.Fill(o.ref, 3)
			s.check("fill "+dt.String(), o, 0)
		}
		x := s.randIn(kernels.F32, 777)
		c := s.out(kernels.F32, 777)
		s.got.Copy(c.got, x.got)
		s.ref.Copy(c.ref, x.ref)
		s.check("copy", c, 0)
		for _, t := range []kernels.Transposition{{Outer: 3, Rows: 5, Cols: 7}, {Outer: 2, Rows: 33, Cols: 65}, {Outer: 128, Rows: 16, Cols: 9}, {Outer: 5, Rows: 784, Cols: 16}, {Outer: 4, Rows: 3, Cols: 1024}} {
			for _, dt := range dtypes {
				x := s.randIn(dt, t.Len())
				y := s.out(dt, t.Len())
				s.got.Transpose(y.got, x.got, t)
				s.ref.Transpose(y.ref, x.ref, t)
				s.check(fmt.Sprintf("transpose %v %+v", dt, t), y, 0)
			}
		}
		for _, tc := range [][2]kernels.DType{{kernels.F32, kernels.F16}, {kernels.F16, kernels.F32}, {kernels.I32, kernels.F32}, {kernels.F32, kernels.I32},
			{kernels.F32, kernels.BF16}, {kernels.BF16, kernels.F32}} {
			vals := s.normal(513)
			for i := range vals {
				vals[i] *= 100
			}
			src := s.in(tc[0], vals)
			dst := s.out(tc[1], 513)
			s.got.Cast(dst.got, src.got)
			s.ref.Cast(dst.ref, src.ref)
			s.check(fmt.Sprintf("cast %v->%v", tc[0], tc[1]), dst, 0)
		}
	}},
	{"multi-tensor casts", func(s *suite) {
		sizes := s.manySizes(3000, 1, 17, 4096, 65537, 3)
		// want is what the host makes of vals stored in dt.
		want := func(dt kernels.DType, vals []float32) []float64 { return decode(dt, encode(dt, vals)) }
		bufs := func(ps []pair) (g []kernels.Buf) {
			for _, p := range ps {
				g = append(g, p.got)
			}
			return g
		}
		for _, h := range []kernels.DType{kernels.F16, kernels.BF16} {
			vals := make([][]float32, len(sizes))
			f32, half, widened, acc := make([]pair, len(sizes)), make([]pair, len(sizes)), make([]pair, len(sizes)), make([]pair, len(sizes))
			base := make([][]float32, len(sizes))
			for i, n := range sizes {
				vals[i], base[i] = s.normal(n), s.normal(n)
				f32[i], half[i] = s.in(kernels.F32, vals[i]), s.out(h, n)
				widened[i], acc[i] = s.out(kernels.F32, n), s.in(kernels.F32, base[i])
			}
			s.got.CastMany(bufs(half), bufs(f32))
			s.got.CastMany(bufs(widened), bufs(half))
			s.got.AccumulateMany(bufs(acc), bufs(half))
			for i, n := range sizes {
				rounded := want(h, vals[i])
				sum := make([]float64, n)
				for j := range sum {
					sum[j] = float64(base[i][j] + float32(rounded[j]))
				}
				for _, c := range []struct {
					what string
					got  kernels.Buf
					want []float64
				}{
					{"cast many f32 to " + h.String(), half[i].got, rounded},
					{"cast many " + h.String() + " to f32", widened[i].got, rounded},
					{"accumulate many " + h.String() + " into f32", acc[i].got, sum},
				} {
					if got := s.read(c.got, s.got); !slices.Equal(got, c.want) {
						s.t.Errorf("%s: tensor %d of %d (%d elements) differs from the host's rounding", c.what, i, len(sizes), n)
					}
				}
			}
		}
	}},
}
