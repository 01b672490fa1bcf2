package kerneltest

import (
	"fmt"
	"math"
	"slices"

	"github.com/leangrad/leangrad/kernels"
)

// The norm family's cases (kernels.NormOps).
var normCases = []testCase{
	{"batchnorm", func(s *suite) {
		for _, p := range []kernels.BNParams{
			{N: 1, C: 3, HW: 49, Eps: 1e-5, Momentum: 0.1},
			{N: 8, C: 16, HW: 784, Eps: 1e-5, Momentum: 0.1},
			{N: 33, C: 5, HW: 7, Eps: 1e-3, Momentum: 0.3},
			{N: 256, C: 64, HW: 49, Eps: 1e-5, Momentum: 0.1},
			// Channels last (Note [channels last]): a channel per column of
			// N·H·W rows, C dividing a block of threads or not.
			{N: 8 * 196, C: 16, HW: 1, Eps: 1e-5, Momentum: 0.1},
			{N: 2 * 49, C: 64, HW: 1, Eps: 1e-5, Momentum: 0.1},
			{N: 1000, C: 24, HW: 1, Eps: 1e-3, Momentum: 0.3},
		} {
			for _, dt := range dtypes {
				for _, fused := range []struct {
					relu, residual bool
				}{{false, false}, {true, false}, {true, true}} {
					p := p
					p.ReLU = fused.relu
					n := p.N * p.C * p.HW
					xv := s.normal(n)
					for i := range xv {
						xv[i] = 3 + 2*xv[i] // a mean far from zero tests the shifted sums
					}
					x := s.in(dt, xv)
					var res pair
					if fused.residual {
						res = s.randIn(dt, n)
					}
					g, b := s.in(kernels.F32, s.positive(p.C)), s.randIn(kernels.F32, p.C)
					rm, rv := s.randIn(kernels.F32, p.C), s.in(kernels.F32, s.positive(p.C))
					y := s.out(dt, n)
					sm, si := s.out(kernels.F32, p.C), s.out(kernels.F32, p.C)
					s.got.BatchNormTrain(p, x.got, res.got, g.got, b.got, y.got, rm.got, rv.got, sm.got, si.got)
					s.ref.BatchNormTrain(p, x.ref, res.ref, g.ref, b.ref, y.ref, rm.ref, rv.ref, sm.ref, si.ref)
					what := fmt.Sprintf("%v %+v residual %v", dt, p, fused.residual)
					s.check("bn y "+what, y, TolAccumulate)
					s.check("bn mean "+what, sm, TolAccumulate)
					s.check("bn invstd "+what, si, TolAccumulate)
					s.check("bn running mean "+what, rm, TolAccumulate)
					s.check("bn running var "+what, rv, TolAccumulate)
					// Applied again from the saved statistics: the training
					// output, bit for bit, on each backend.
					ya := s.out(dt, n)
					s.got.BatchNormApply(p, x.got, res.got, g.got, b.got, sm.got, si.got, ya.got)
					s.ref.BatchNormApply(p, x.ref, res.ref, g.ref, b.ref, sm.ref, si.ref, ya.ref)
					for _, be := range []struct {
						name          string
						k             kernels.Backend
						train, replay kernels.Buf
					}{{"tested", s.got, y.got, ya.got}, {"reference", s.ref, y.ref, ya.ref}} {
						if tv, av := s.read(be.train, be.k), s.read(be.replay, be.k); !slices.Equal(tv, av) {
							s.t.Errorf("bn apply %s: the %s backend's output from the saved statistics differs from its training output", what, be.name)
						}
					}
					ye := s.out(dt, n)
					s.got.BatchNormEval(p, x.got, res.got, g.got, b.got, rm.got, rv.got, ye.got)
					s.ref.BatchNormEval(p, x.ref, res.ref, g.ref, b.ref, rm.ref, rv.ref, ye.ref)
					s.check("bn eval "+what, ye, TolAccumulate)
					dy := s.randIn(dt, n)
					dx, dg, db := s.out(dt, n), s.out(kernels.F32, p.C), s.out(kernels.F32, p.C)
					var dres pair
					if fused.residual {
						dres = s.out(dt, n)
					}
					// Both backends mask with the reference's output: an element
					// within rounding of zero may pass the ReLU on one and not the other.
					yv := s.read(y.ref, s.ref)
					y32 := make([]float32, len(yv))
					for i, v := range yv {
						y32[i] = float32(v)
					}
					yb := s.in(dt, y32)
					s.got.BatchNormBackward(p, x.got, yb.got, kernels.Buf{}, dy.got, g.got, kernels.Buf{}, sm.got, si.got, dx.got, dres.got, dg.got, db.got)
					s.ref.BatchNormBackward(p, x.ref, yb.ref, kernels.Buf{}, dy.ref, g.ref, kernels.Buf{}, sm.ref, si.ref, dx.ref, dres.ref, dg.ref, db.ref)
					s.check("bn dx "+what, dx, TolAccumulate)
					// In place: dx written over dy, the same bits.
					ip := s.in(dt, toF32(s.read(dy.ref, s.ref)))
					dg2, db2 := s.out(kernels.F32, p.C), s.out(kernels.F32, p.C)
					s.got.BatchNormBackward(p, x.got, yb.got, kernels.Buf{}, ip.got, g.got, kernels.Buf{}, sm.got, si.got, ip.got, kernels.Buf{}, dg2.got, db2.got)
					s.ref.BatchNormBackward(p, x.ref, yb.ref, kernels.Buf{}, ip.ref, g.ref, kernels.Buf{}, sm.ref, si.ref, ip.ref, kernels.Buf{}, dg2.ref, db2.ref)
					if !slices.Equal(s.read(ip.got, s.got), s.read(dx.got, s.got)) {
						s.t.Errorf("bn dx %s: written over dy, it differs from dx written apart", what)
					}
					s.check("bn dgamma "+what, dg, TolAccumulate)
					s.check("bn dbeta "+what, db, TolAccumulate)
					if p.ReLU {
						// Without y, each backend masks with the y its
						// BatchNormApply writes from x and the residual:
						// the same bits as with it.
						dxa, dga, dba := s.out(dt, n), s.out(kernels.F32, p.C), s.out(kernels.F32, p.C)
						dxb, dgb, dbb := s.out(dt, n), s.out(kernels.F32, p.C), s.out(kernels.F32, p.C)
						var dra, drb pair
						if fused.residual {
							dra, drb = s.out(dt, n), s.out(dt, n)
						}
						for _, be := range []struct {
							name string
							k    kernels.Backend
							pick func(pair) kernels.Buf
						}{{"tested", s.got, func(v pair) kernels.Buf { return v.got }}, {"reference", s.ref, func(v pair) kernels.Buf { return v.ref }}} {
							at := be.pick
							be.k.BatchNormBackward(p, at(x), kernels.Buf{}, at(res), at(dy), at(g), at(b), at(sm), at(si), at(dxa), at(dra), at(dga), at(dba))
							be.k.BatchNormBackward(p, at(x), at(ya), kernels.Buf{}, at(dy), at(g), kernels.Buf{}, at(sm), at(si), at(dxb), at(drb), at(dgb), at(dbb))
							type twin struct {
								name string
								a, b pair
							}
							outs := []twin{{"dx", dxa, dxb}, {"dgamma", dga, dgb}, {"dbeta", dba, dbb}}
							if fused.residual {
								outs = append(outs, twin{"dresidual", dra, drb})
							}
							for _, o := range outs {
								if !slices.Equal(s.read(at(o.a), be.k), s.read(at(o.b), be.k)) {
									s.t.Errorf("bn %s %s: the %s backend's, masked without y, differs from its own with y", o.name, what, be.name)
								}
							}
						}
					}
					if fused.residual {
						s.check("bn dresidual "+what, dres, TolElementwise)
						// dresidual written over dy: the same bits, dx too.
						ip := s.in(dt, toF32(s.read(dy.ref, s.ref)))
						dx3, dg3, db3 := s.out(dt, n), s.out(kernels.F32, p.C), s.out(kernels.F32, p.C)
						s.got.BatchNormBackward(p, x.got, yb.got, kernels.Buf{}, ip.got, g.got, kernels.Buf{}, sm.got, si.got, dx3.got, ip.got, dg3.got, db3.got)
						s.ref.BatchNormBackward(p, x.ref, yb.ref, kernels.Buf{}, ip.ref, g.ref, kernels.Buf{}, sm.ref, si.ref, dx3.ref, ip.ref, dg3.ref, db3.ref)
						if !slices.Equal(s.read(ip.got, s.got), s.read(dres.got, s.got)) || !slices.Equal(s.read(dx3.got, s.got), s.read(dx.got, s.got)) {
							s.t.Errorf("bn dresidual %s: written over dy, it or dx differs from the two written apart", what)
						}
					}
				}
			}
		}
	}},
	{"layernorm", func(s *suite) {
		// Each dtype, and an F32 x normalised into F16 and BF16 (y and dy).
		type pair struct{ x, y kernels.DType }
		var pairs []pair
		for _, dt := range dtypes {
			pairs = append(pairs, pair{dt, dt})
		}
		pairs = append(pairs, pair{kernels.F32, kernels.F16}, pair{kernels.F32, kernels.BF16})
		for _, dts := range pairs {
			dt := dts.x
			for _, p := range []kernels.LayerNormParams{{Rows: 1, Cols: 7, Eps: 1e-5}, {Rows: 37, Cols: 64, Eps: 1e-5},
				{Rows: 1000, Cols: 768, Eps: 1e-5}, {Rows: 3, Cols: 3000, Eps: 1e-3}} {
				xv := s.normal(p.Rows * p.Cols)
				for i := range xv {
					xv[i] = 1 + 2*xv[i]
				}
				x := s.in(dt, xv)
				g, b := s.in(kernels.F32, s.positive(p.Cols)), s.randIn(kernels.F32, p.Cols)
				y, mean, rstd := s.out(dts.y, p.Rows*p.Cols), s.out(kernels.F32, p.Rows), s.out(kernels.F32, p.Rows)
				s.got.LayerNorm(p, x.got, g.got, b.got, y.got, mean.got, rstd.got)
				s.ref.LayerNorm(p, x.ref, g.ref, b.ref, y.ref, mean.ref, rstd.ref)
				what := fmt.Sprintf("%v→%v %+v", dt, dts.y, p)
				s.check("layer norm y "+what, y, TolAccumulate)
				s.check("layer norm mean "+what, mean, TolAccumulate)
				s.check("layer norm rstd "+what, rstd, TolAccumulate)
				dy := s.randIn(dts.y, p.Rows*p.Cols)
				dx, dg, db := s.out(dt, p.Rows*p.Cols), s.out(kernels.F32, p.Cols), s.out(kernels.F32, p.Cols)
				s.got.LayerNormBackward(p, x.got, g.got, mean.got, rstd.got, dy.got, dx.got, dg.got, db.got)
				s.ref.LayerNormBackward(p, x.ref, g.ref, mean.ref, rstd.ref, dy.ref, dx.ref, dg.ref, db.ref)
				s.check("layer norm dx "+what, dx, TolAccumulate)
				s.check("layer norm dgamma "+what, dg, TolAccumulate)
				s.check("layer norm dbeta "+what, db, TolAccumulate)
				if dt == kernels.F32 { // added to a gradient dx already holds
					pa := p
					pa.Accumulate = true
					acc := s.randIn(kernels.F32, p.Rows*p.Cols)
					s.got.LayerNormBackward(pa, x.got, g.got, mean.got, rstd.got, dy.got, acc.got, dg.got, db.got)
					s.ref.LayerNormBackward(pa, x.ref, g.ref, mean.ref, rstd.ref, dy.ref, acc.ref, dg.ref, db.ref)
					s.check("layer norm accumulated dx "+what, acc, TolAccumulate)
					// dx's column sums beside it (with its rounding where dy is
					// 16-bit), against the reference and against the sums of dx
					// as written, in float64.
					for _, accumulate := range []bool{false, true} {
						dxs, sums := s.randIn(kernels.F32, p.Rows*p.Cols), s.out(kernels.F32, p.Cols)
						pg, pr := p, p
						pg.Accumulate, pr.Accumulate = accumulate, accumulate
						pg.Sums, pr.Sums = sums.got, sums.ref
						if dts.y != dt {
							rnd := s.out(dts.y, p.Rows*p.Cols)
							pg.Rounded, pr.Rounded = rnd.got, rnd.ref
						}
						s.got.LayerNormBackward(pg, x.got, g.got, mean.got, rstd.got, dy.got, dxs.got, dg.got, db.got)
						s.ref.LayerNormBackward(pr, x.ref, g.ref, mean.ref, rstd.ref, dy.ref, dxs.ref, dg.ref, db.ref)
						w := fmt.Sprintf("%s accumulate %v", what, accumulate)
						s.check("layer norm dx with its column sums "+w, dxs, TolAccumulate)
						s.check("layer norm column sums of dx "+w, sums, TolAccumulate)
						written, got := s.read(dxs.got, s.got), s.read(sums.got, s.got)
						for j := range p.Cols {
							var want, scale float64
							for r := range p.Rows {
								v := float64(written[r*p.Cols+j])
								want, scale = want+v, scale+math.Abs(v)
							}
							if math.Abs(float64(got[j])-want) > 1e-5*(scale+1) {
								s.t.Errorf("%s: layer norm column sum %d of dx %s = %v, the sum of dx as written %v", s.got.Name(), j, w, got[j], want)
								break
							}
						}
					}
				}
				if dts.y != dt { // dx also rounded into dy's dtype, bit for bit its cast
					for _, accumulate := range []bool{false, true} {
						dxr, rnd, cast := s.randIn(kernels.F32, p.Rows*p.Cols), s.out(dts.y, p.Rows*p.Cols), s.out(dts.y, p.Rows*p.Cols)
						pg, pr := p, p
						pg.Accumulate, pr.Accumulate = accumulate, accumulate
						pg.Rounded, pr.Rounded = rnd.got, rnd.ref
						s.got.LayerNormBackward(pg, x.got, g.got, mean.got, rstd.got, dy.got, dxr.got, dg.got, db.got)
						s.ref.LayerNormBackward(pr, x.ref, g.ref, mean.ref, rstd.ref, dy.ref, dxr.ref, dg.ref, db.ref)
						w := fmt.Sprintf("%s accumulate %v", what, accumulate)
						s.check("layer norm dx with its rounding "+w, dxr, TolAccumulate)
						s.check("layer norm rounded dx "+w, rnd, TolAccumulate)
						for _, be := range []struct {
							b           kernels.Backend
							dx, r, cast kernels.Buf
						}{{s.got, dxr.got, rnd.got, cast.got}, {s.ref, dxr.ref, rnd.ref, cast.ref}} {
							be.b.Cast(be.cast, be.dx)
							if got, want := s.read(be.r, be.b), s.read(be.cast, be.b); !slices.Equal(got, want) {
								s.t.Errorf("%s: layer norm rounded dx %s differs from the cast of its dx", be.b.Name(), w)
							}
						}
					}
				}
			}
		}
	}},
}
