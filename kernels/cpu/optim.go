package cpu

import (
	"fmt"
	"math"

	"github.com/leangrad/leangrad/kernels"
)

// SGD is torch.optim.SGD's update:
//
//	g = grad + wd·p;  buf = momentum·buf + (1−dampening)·g (buf = g at the first step)
//	g = g + momentum·buf if Nesterov else buf;  p -= lr·g
func (c *Backend) SGD(hp kernels.SGDParams, params, grads, moms []kernels.Buf) {
	if hp.Momentum != 0 {
		kernels.CheckLists("sgd", params, grads, moms)
	} else {
		kernels.CheckLists("sgd", params, grads)
	}
	for t := range params {
		p, g := f32s(params[t]), f32s(grads[t])
		var buf []float32
		if hp.Momentum != 0 {
			buf = f32s(moms[t])
		}
		parallel(len(p), elemGrain, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				d := g[i] + hp.WeightDecay*p[i]
				if buf != nil {
					if hp.FirstStep {
						buf[i] = d
					} else {
						buf[i] = hp.Momentum*buf[i] + (1-hp.Dampening)*d
					}
					if hp.Nesterov {
						d += hp.Momentum * buf[i]
					} else {
						d = buf[i]
					}
				}
				p[i] -= hp.LR * d
			}
		})
	}
}

// AdamW is torch.optim.AdamW's update with decoupled weight decay:
//
//	p -= lr·wd·p;  m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
//	p -= lr·(m/(1−β1ᵗ)) / (√(v/(1−β2ᵗ)) + ε)
func (c *Backend) AdamW(hp kernels.AdamWParams, params, grads, m, v []kernels.Buf) {
	kernels.CheckLists("adamw", params, grads, m, v)
	if hp.Step < 1 {
		panic(fmt.Sprintf("cpu: adamw step %d, want >= 1", hp.Step))
	}
	bc1 := 1 - math.Pow(float64(hp.Beta1), float64(hp.Step))
	bc2 := 1 - math.Pow(float64(hp.Beta2), float64(hp.Step))
	stepSize := float32(float64(hp.LR) / bc1)
	bc2Sqrt := float32(math.Sqrt(bc2))
	for t := range params {
		p, g, ms, vs := f32s(params[t]), f32s(grads[t]), f32s(m[t]), f32s(v[t])
		parallel(len(p), elemGrain, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				p[i] *= 1 - hp.LR*hp.WeightDecay
				ms[i] = hp.Beta1*ms[i] + (1-hp.Beta1)*g[i]
				vs[i] = hp.Beta2*vs[i] + (1-hp.Beta2)*g[i]*g[i]
				denom := float32(math.Sqrt(float64(vs[i])))/bc2Sqrt + hp.Eps
				p[i] -= stepSize * ms[i] / denom
			}
		})
	}
}

// UnscaleCheck multiplies every grad by invScale and raises found on inf/NaN.
func (c *Backend) UnscaleCheck(grads []kernels.Buf, invScale float32, found kernels.Buf) {
	kernels.CheckLen("unscale found flag", 1, found)
	f := f32s(found)
	for _, gb := range grads {
		g := f32s(gb)
		bad := false
		for i := range g {
			g[i] *= invScale
			if math.IsInf(float64(g[i]), 0) || math.IsNaN(float64(g[i])) {
				bad = true
			}
		}
		if bad {
			f[0] = 1
		}
	}
}
