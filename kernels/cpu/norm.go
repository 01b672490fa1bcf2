package cpu

import (
	"math"

	"github.com/leangrad/leangrad/kernels"
)

// channelValues calls f(i, v) for every element of channel c of an N×C×HW array.
func forChannel(p kernels.BNParams, c int, f func(i int)) {
	for n := 0; n < p.N; n++ {
		base := (n*p.C + c) * p.HW
		for i := base; i < base+p.HW; i++ {
			f(i)
		}
	}
}

// act is the output's activation: x̂·γ + β (in float64) plus the residual,
// through the ReLU with p.ReLU.
func act(p kernels.BNParams, v float64, res []float32, i int) float32 {
	if res != nil {
		v += float64(res[i])
	}
	if p.ReLU && v < 0 {
		v = 0
	}
	return float32(v)
}

// optIn is in(b) for an optional buffer: nil when it is not given.
func optIn(b kernels.Buf) []float32 {
	if !b.Valid() {
		return nil
	}
	return in(b)
}

// BatchNormTrain normalises with batch statistics (two-pass, float64),
// adds the residual, applies the ReLU and updates the running statistics
// (the variance unbiased) in place.
func (c *Backend) BatchNormTrain(p kernels.BNParams, x, residual, gamma, beta, y, runMean, runVar, saveMean, saveInvStd kernels.Buf) {
	kernels.CheckBN("batch norm", p, x, gamma, beta, runMean, runVar, saveMean, saveInvStd)
	kernels.CheckLen("batch norm output", x.N, y)
	kernels.CheckLike("batch norm residual", x, residual)
	xs, gs, bs, res := in(x), in(gamma), in(beta), optIn(residual)
	ys, doneY := out(y)
	rm, doneRM := inout(runMean)
	rv, doneRV := inout(runVar)
	sm, sis := f32s(saveMean), f32s(saveInvStd)
	m := float64(p.N * p.HW)
	parallel(p.C, 1, func(lo, hi int) {
		for ch := lo; ch < hi; ch++ {
			var sum float64
			forChannel(p, ch, func(i int) { sum += float64(xs[i]) })
			mean := sum / m
			var sq float64
			forChannel(p, ch, func(i int) { d := float64(xs[i]) - mean; sq += d * d })
			variance := sq / m
			invStd := 1 / math.Sqrt(variance+float64(p.Eps))
			scale, shift := float64(gs[ch])*invStd, float64(bs[ch])
			forChannel(p, ch, func(i int) { ys[i] = act(p, (float64(xs[i])-mean)*scale+shift, res, i) })
			sm[ch], sis[ch] = float32(mean), float32(invStd)
			unbiased := variance
			if m > 1 {
				unbiased = variance * m / (m - 1)
			}
			mom := float64(p.Momentum)
			rm[ch] = float32((1-mom)*float64(rm[ch]) + mom*mean)
			rv[ch] = float32((1-mom)*float64(rv[ch]) + mom*unbiased)
		}
	})
	doneY()
	doneRM()
	doneRV()
}

// BatchNormEval normalises with the running statistics, adds the residual
// and applies the ReLU.
func (c *Backend) BatchNormEval(p kernels.BNParams, x, residual, gamma, beta, runMean, runVar, y kernels.Buf) {
	kernels.CheckBN("batch norm eval", p, x, gamma, beta, runMean, runVar)
	kernels.CheckLen("batch norm eval output", x.N, y)
	kernels.CheckLike("batch norm eval residual", x, residual)
	xs, gs, bs, rm, rv, res := in(x), in(gamma), in(beta), in(runMean), in(runVar), optIn(residual)
	ys, done := out(y)
	parallel(p.C, 1, func(lo, hi int) {
		for ch := lo; ch < hi; ch++ {
			invStd := 1 / math.Sqrt(float64(rv[ch])+float64(p.Eps))
			scale := float32(float64(gs[ch]) * invStd)
			shift := bs[ch] - rm[ch]*scale
			forChannel(p, ch, func(i int) { ys[i] = act(p, float64(xs[i]*scale+shift), res, i) })
		}
	})
	done()
}

// BatchNormBackward computes, with g = dy (masked by y > 0 with the ReLU),
//
//	dβ = Σ g,  dγ = Σ g·x̂,  dx = γ·invstd/M · (M·g − dβ − x̂·dγ),  dresidual = g
//
// with x̂ = (x − mean)·invstd and M = N·HW.
func (c *Backend) BatchNormBackward(p kernels.BNParams, x, y, dy, gamma, saveMean, saveInvStd, dx, dresidual, dgamma, dbeta kernels.Buf) {
	kernels.CheckBN("batch norm backward", p, x, gamma, saveMean, saveInvStd, dgamma, dbeta)
	kernels.CheckLen("batch norm backward", x.N, dy, dx)
	kernels.CheckLike("batch norm backward residual gradient", dx, dresidual)
	xs, dys, gs, sm, sis := in(x), in(dy), in(gamma), f32s(saveMean), f32s(saveInvStd)
	if p.ReLU {
		kernels.CheckLen("batch norm backward output", x.N, y)
		ys := in(y)
		masked := make([]float32, len(dys))
		for i, g := range dys {
			if ys[i] > 0 {
				masked[i] = g
			}
		}
		dys = masked
	}
	dxs, doneX := out(dx)
	dgs, doneG := out(dgamma)
	dbs, doneB := out(dbeta)
	m := float64(p.N * p.HW)
	parallel(p.C, 1, func(lo, hi int) {
		for ch := lo; ch < hi; ch++ {
			mean, invStd := float64(sm[ch]), float64(sis[ch])
			var db, dg float64
			forChannel(p, ch, func(i int) {
				g := float64(dys[i])
				db += g
				dg += g * (float64(xs[i]) - mean) * invStd
			})
			dbs[ch], dgs[ch] = float32(db), float32(dg)
			k := float64(gs[ch]) * invStd / m
			forChannel(p, ch, func(i int) {
				xhat := (float64(xs[i]) - mean) * invStd
				dxs[i] = float32(k * (m*float64(dys[i]) - db - xhat*dg))
			})
		}
	})
	doneX()
	doneG()
	doneB()
	if dresidual.Valid() {
		dr, done := out(dresidual)
		copy(dr, dys)
		done()
	}
}
