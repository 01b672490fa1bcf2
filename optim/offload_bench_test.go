package optim

import (
	"math/rand/v2"
	"testing"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// BenchmarkOffloadedStep: an offloaded AdamW's step over 64M parameters
// in four tensors, the device and the host both the CPU, so that the
// copies are the memory's: in ns a parameter over every core GOMAXPROCS
// allows, with F32 weights and with BF16 working weights (whose step
// also widens the gradients and rounds the masters, in one pass or, as
// optimizers other than AdamW do, in passes of their own). What the host's
// update costs a step of a model of N parameters is about N times it.
func BenchmarkOffloadedStep(b *testing.B) {
	const n, parts = 1 << 26, 4
	defer func(on bool) { fuseMasters = on }(fuseMasters)
	for _, c := range []struct {
		name string
		dt   tensor.DType
		fuse bool
	}{{"f32", tensor.F32, true}, {"bf16", tensor.BF16, true}, {"bf16-in-passes", tensor.BF16, false}} {
		dt := c.dt
		b.Run(c.name, func(b *testing.B) {
			fuseMasters = c.fuse
			dev, host := tensor.NewDevice(tensor.CPU().Backend()), tensor.NewDevice(tensor.CPU().Backend())
			rng := rand.New(rand.NewPCG(1, 2))
			random := func(scale float64) *tensor.Tensor {
				v := make([]float32, n/parts)
				for i := range v {
					v[i] = float32(rng.NormFloat64() * scale)
				}
				f := tensor.FromFloat32(dev, v, n/parts)
				if dt == tensor.F32 {
					return f
				}
				defer f.Release()
				h := tensor.Empty(dev, dt, n/parts)
				dev.Backend().Cast(h.Buf(), f.Buf())
				return h
			}
			var ps []*tensor.Tensor
			for range parts {
				p := random(1).Keep().SetRequiresGrad(true)
				p.SetGrad(random(0.01))
				ps = append(ps, p)
			}
			defer releaseAll(ps...)
			o, err := Offload(NewAdamW(ps, 1e-4, 0.1), host)
			if err != nil {
				b.Fatal(err)
			}
			defer o.Release()
			mult := tensor.FromFloat32(dev, []float32{0.5}, 1).Keep()
			defer mult.Release()
			o.StepScaled(mult.Buf(), kernels.Buf{}) // the state's first touch
			b.ResetTimer()
			for range b.N {
				o.StepScaled(mult.Buf(), kernels.Buf{})
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/param")
		})
	}
}
