package kerneltest

import (
	"fmt"
	"math"
	"slices"

	"github.com/leangrad/leangrad/kernels"
)

// The optim family's cases (kernels.OptimOps).
var optimCases = []testCase{
	{"optimizers", func(s *suite) {
		sizes := s.manySizes(2000, 1, 17, 4096, 65537, 3, 300)
		mk := func(gen func(int) []float32) []pair {
			ps := make([]pair, len(sizes))
			for i, n := range sizes {
				ps[i] = s.in(kernels.F32, gen(n))
			}
			return ps
		}
		split := func(ps []pair) (g, r []kernels.Buf) {
			for _, p := range ps {
				g, r = append(g, p.got), append(r, p.ref)
			}
			return
		}
		zeros := func(n int) []float32 { return make([]float32, n) }
		scalar := func(v float32) pair { return s.in(kernels.F32, []float32{v}) }
		// CopyMany: every tensor lands whole in its own destination.
		src, dst := mk(s.normal), mk(zeros)
		sg, sr := split(src)
		dg, dr := split(dst)
		s.got.CopyMany(dg, sg)
		s.ref.CopyMany(dr, sr)
		for i := range src {
			if got, want := s.read(dg[i], s.got), s.read(sg[i], s.got); !slices.Equal(got, want) {
				s.t.Errorf("copy many: tensor %d of %d (%d elements) differs from its source", i, len(sizes), sizes[i])
			}
		}
		for _, c := range []struct {
			hp     kernels.SGDParams
			lr     float32
			skip   bool
			remark string
		}{
			{kernels.SGDParams{Momentum: 0.9, WeightDecay: 5e-4, Nesterov: true, FirstStep: true}, 0.1, false, "nesterov, first step"},
			{kernels.SGDParams{Momentum: 0.9, Dampening: 0.1, WeightDecay: 1e-4}, 0.05, false, "dampened"},
			{kernels.SGDParams{}, 0.01, false, "plain"},
			{kernels.SGDParams{Momentum: 0.9}, 0.1, true, "skipped"},
		} {
			params, grads, moms := mk(s.normal), mk(s.normal), mk(s.normal)
			pg, pr := split(params)
			gg, gr := split(grads)
			mg, mr := split(moms)
			before := s.read(pg[0], s.got)
			lr, flag := scalar(c.lr), scalar(0)
			if c.skip {
				flag = scalar(1)
			}
			hg, hr := c.hp, c.hp
			hg.LR, hr.LR, hg.Skip, hr.Skip = lr.got, lr.ref, flag.got, flag.ref
			s.got.SGD(hg, pg, gg, mg)
			s.ref.SGD(hr, pr, gr, mr)
			for i := range params {
				s.check(fmt.Sprintf("sgd %s param %d", c.remark, i), params[i], TolElementwise)
				if c.hp.Momentum != 0 {
					s.check(fmt.Sprintf("sgd %s momentum %d", c.remark, i), moms[i], TolElementwise)
				}
			}
			if after := s.read(pg[0], s.got); c.skip != slices.Equal(before, after) {
				s.t.Errorf("sgd %s: parameter changed %v, want %v", c.remark, !slices.Equal(before, after), !c.skip)
			}
		}
		params, grads, m, v := mk(s.normal), mk(s.normal), mk(zeros), mk(zeros)
		pg, pr := split(params)
		gg, gr := split(grads)
		mg, mr := split(m)
		vg, vr := split(v)
		lr := scalar(1e-3)
		step := s.in(kernels.I32, []float32{0, 0})
		for k := 1; k <= 4; k++ {
			skip := scalar(0)
			if k == 3 { // a skipped step neither updates nor counts
				skip = scalar(1)
			}
			s.got.Increment(step.got, 1, skip.got)
			s.ref.Increment(step.ref, 1, skip.ref)
			hg := kernels.AdamWParams{LR: lr.got, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Step: step.got, Skip: skip.got}
			hr := hg
			hr.LR, hr.Step, hr.Skip = lr.ref, step.ref, skip.ref
			if k%2 == 0 { // the gradients read through a multiplier
				gs := scalar(0.37)
				hg.GradScale, hr.GradScale = gs.got, gs.ref
			}
			s.got.AdamW(hg, pg, gg, mg, vg)
			s.ref.AdamW(hr, pr, gr, mr, vr)
		}
		if st := s.read(step.got, s.got); st[0] != 3 || st[1] != 0 {
			s.t.Errorf("adamw step counter %v after 4 steps, one skipped: want [3 0]", st)
		}
		for i := range params {
			s.check(fmt.Sprintf("adamw param %d", i), params[i], TolElementwise)
			s.check(fmt.Sprintf("adamw m %d", i), m[i], TolElementwise)
			s.check(fmt.Sprintf("adamw v %d", i), v[i], TolElementwise)
		}
		// Unscale: clean, then with an inf planted in the last tensor.
		found, scale := scalar(0), scalar(1024)
		s.got.UnscaleCheck(gg, scale.got, found.got)
		s.ref.UnscaleCheck(gr, scale.ref, found.ref)
		for i := range grads {
			s.check(fmt.Sprintf("unscale grad %d", i), grads[i], TolElementwise)
		}
		s.check("unscale found (clean)", found, 0)
		last := len(sizes) - 1
		bad := s.normal(sizes[last])
		bad[len(bad)/2] = float32(math.Inf(1))
		grads[last] = s.in(kernels.F32, bad)
		gg[last], gr[last] = grads[last].got, grads[last].ref
		half := scalar(2)
		s.got.UnscaleCheck(gg, half.got, found.got)
		s.ref.UnscaleCheck(gr, half.ref, found.ref)
		s.check("unscale found (inf)", found, 0)
		if f := s.read(found.got, s.got); f[0] != 1 {
			s.t.Errorf("unscale did not flag an infinite gradient in tensor %d of %d", last, len(sizes))
		}
	}},
	{"adamw8", func(s *suite) {
		// Three steps (the gradients read through a multiplier, plain, then
		// skipped) from random codes and scales over tensors whose lengths
		// end inside a block, on one, and past one: every backend's codes
		// are the CPU's (kernels.OptimOps.AdamW8 pins the rounding), so they
		// must agree exactly, and the parameters with them.
		sizes := s.manySizes(3000, 1, kernels.Quant8Block, kernels.Quant8Block+1, 4099, 65537)
		var params, codes, absmax []pair
		var pg, pr, gg, gr, cg, cr, ag, ar []kernels.Buf
		for _, n := range sizes {
			cs := make([]float32, 2*n)
			for i := range cs {
				cs[i] = float32(s.rng.IntN(256))
			}
			am := s.positive(2 * kernels.Quant8Blocks(n))
			am[0] = 0 // a fresh block: zero moments whatever its codes
			p, g, c, a := s.randIn(kernels.F32, n), s.randIn(kernels.F32, n), s.in(kernels.U8, cs), s.in(kernels.F32, am)
			params, codes, absmax = append(params, p), append(codes, c), append(absmax, a)
			pg, pr, gg, gr = append(pg, p.got), append(pr, p.ref), append(gg, g.got), append(gr, g.ref)
			cg, cr, ag, ar = append(cg, c.got), append(cr, c.ref), append(ag, a.got), append(ar, a.ref)
		}
		qmap := s.in(kernels.F32, kernels.Quant8Maps)
		lr, step := s.in(kernels.F32, []float32{1e-3}), s.in(kernels.I32, []float32{0, 0})
		before := s.read(pg[0], s.got)
		for k := 1; k <= 3; k++ {
			skip := s.in(kernels.F32, []float32{0})
			if k == 3 {
				skip = s.in(kernels.F32, []float32{1})
			}
			s.got.Increment(step.got, 1, skip.got)
			s.ref.Increment(step.ref, 1, skip.ref)
			hg := kernels.AdamWParams{LR: lr.got, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Step: step.got, Skip: skip.got}
			hr := hg
			hr.LR, hr.Step, hr.Skip = lr.ref, step.ref, skip.ref
			if k == 1 {
				gs := s.in(kernels.F32, []float32{0.37})
				hg.GradScale, hr.GradScale = gs.got, gs.ref
			}
			s.got.AdamW8(hg, qmap.got, pg, gg, cg, ag)
			s.ref.AdamW8(hr, qmap.ref, pr, gr, cr, ar)
		}
		if slices.Equal(before, s.read(pg[0], s.got)) {
			s.t.Errorf("adamw8: two steps left parameter 0 as it was")
		}
		for i, n := range sizes {
			s.check(fmt.Sprintf("adamw8 param %d (%d values)", i, n), params[i], TolElementwise)
			s.check(fmt.Sprintf("adamw8 absmax %d", i), absmax[i], 0)
			got, ref := s.read(cg[i], s.got), s.read(cr[i], s.ref)
			for j := range got {
				if got[j] != ref[j] {
					s.t.Errorf("adamw8 tensor %d (%d values): value %d's %s code is %v, the CPU's %v", i, n, j/2, []string{"first moment", "second moment root"}[j%2], got[j], ref[j])
					break
				}
			}
		}
	}},
	{"scaler", func(s *suite) {
		// torch's _amp_update_scale_ over a sequence of clean and inf steps:
		// growth every 3 clean steps, backoff (and a skipped step) on inf.
		scale, tracker := s.in(kernels.F32, []float32{65536}), s.in(kernels.I32, []float32{0})
		skipped := s.in(kernels.F32, []float32{0})
		p := kernels.ScalerParams{Growth: 2, Backoff: 0.5, Interval: 3}
		want := float32(65536)
		clean := 0
		for i, inf := range []bool{false, true, false, false, false, true, true, false} {
			v := float32(0)
			if inf {
				v = 1
			}
			found := s.in(kernels.F32, []float32{v})
			s.got.UpdateScale(p, scale.got, tracker.got, found.got, skipped.got)
			s.ref.UpdateScale(p, scale.ref, tracker.ref, found.ref, skipped.ref)
			if inf {
				want, clean = want/2, 0
			} else if clean++; clean == 3 {
				want, clean = want*2, 0
			}
			if got := s.read(scale.got, s.got)[0]; got != float64(want) {
				s.t.Errorf("step %d: scale %v, want %v", i, got, want)
			}
		}
		s.check("scaler tracker", tracker, 0)
		if got := s.read(skipped.got, s.got)[0]; got != 3 {
			s.t.Errorf("%v skipped steps counted, want 3", got)
		}
	}},
	{"clip-grad-norm", func(s *suite) {
		none := s.out(kernels.F32, 1)
		s.got.SumSquares(nil, none.got)
		s.ref.SumSquares(nil, none.ref)
		s.check("sum of squares of no gradients", none, 0)
		var grads []pair
		for _, n := range []int{1, 100, 70001, 33} {
			grads = append(grads, s.randIn(kernels.F32, n))
		}
		for _, maxNorm := range []float32{1e4, 1} {
			gs := make([]pair, len(grads))
			var gg, gr []kernels.Buf
			for i, g := range grads {
				gs[i] = s.in(kernels.F32, toF32(s.read(g.ref, s.ref)))
				gg, gr = append(gg, gs[i].got), append(gr, gs[i].ref)
			}
			sumsq, norm := s.out(kernels.F32, 1), s.out(kernels.F32, 1)
			s.got.SumSquares(gg, sumsq.got)
			s.ref.SumSquares(gr, sumsq.ref)
			s.check(fmt.Sprintf("sum of squares, max %v", maxNorm), sumsq, TolAccumulate)
			s.got.ClipGradNorm(gg, maxNorm, sumsq.got, norm.got)
			s.ref.ClipGradNorm(gr, maxNorm, sumsq.ref, norm.ref)
			s.check(fmt.Sprintf("grad norm, max %v", maxNorm), norm, TolAccumulate)
			for i, g := range gs {
				s.check(fmt.Sprintf("clipped grad %d, max %v", i, maxNorm), g, TolAccumulate)
			}
		}
		// UnscaleClip from a sum of squares: with and without a scale, a
		// clip that binds, one that does not, none; then an inf sum.
		scalar := func(v float32) pair { return s.in(kernels.F32, []float32{v}) }
		for _, c := range []struct {
			sumsq, scale, maxNorm float32
		}{{3.5e7, 4096, 1}, {3.5e7, 4096, 1e4}, {2.25, 0, 1}, {2.25, 0, 0}, {float32(math.Inf(1)), 1024, 1}} {
			sumsq := scalar(c.sumsq)
			var scale pair
			if c.scale != 0 {
				scale = scalar(c.scale)
			}
			norm, mult, found := s.out(kernels.F32, 1), s.out(kernels.F32, 1), scalar(0)
			s.got.UnscaleClip(c.maxNorm, sumsq.got, scale.got, norm.got, mult.got, found.got)
			s.ref.UnscaleClip(c.maxNorm, sumsq.ref, scale.ref, norm.ref, mult.ref, found.ref)
			what := fmt.Sprintf("unscale and clip %+v", c)
			s.check(what+" norm", norm, TolElementwise)
			s.check(what+" multiplier", mult, TolElementwise)
			s.check(what+" found", found, 0)
		}
	}},
}
