package autograd

import (
	"fmt"
	"math"
	"math/rand/v2"
	"unsafe"

	"github.com/leangrad/leangrad/tensor"
)

// GradCheckOptions tune GradCheck. Zero values take the defaults.
type GradCheckOptions struct {
	Eps  float64 // finite-difference step (default 1e-2)
	RTol float64 // relative tolerance per element (default 2e-2)
	ATol float64 // absolute tolerance, as a fraction of the largest analytic gradient (default 2e-3)
	Seed uint64  // seeds the weights of the objective
}

// GradCheck compares the gradients Backward computes for f with central
// finite differences. The objective is L = Σ wᵢ·f(inputs)ᵢ for fixed random
// weights w, summed in float64 on the host; every element of every F32 input
// that requires a gradient is perturbed by ±Eps. Inputs must be leaves; f may
// be called many times and must be deterministic (draw random numbers from a
// generator whose state it resets). It returns an error describing the worst
// mismatch, or nil.
func GradCheck(f func(inputs []*T) *T, inputs []*T, opt GradCheckOptions) error {
	if opt.Eps == 0 {
		opt.Eps = 1e-2
	}
	if opt.RTol == 0 {
		opt.RTol = 2e-2
	}
	if opt.ATol == 0 {
		opt.ATol = 2e-3
	}
	for i, x := range inputs {
		if x.RequiresGrad() && (x.DType() != tensor.F32 || !x.IsLeaf()) {
			return fmt.Errorf("gradcheck: input %d is a %v non-leaf or non-f32 tensor", i, x.Shape())
		}
		x.ZeroGrad()
	}
	// Analytic gradients, from Backward with the weights as the output gradient.
	dev := ModeOf(inputs...)
	var weights []float64
	dev.WithScope(func() {
		y := f(inputs)
		rng := rand.New(rand.NewPCG(opt.Seed, 1))
		weights = make([]float64, y.Numel())
		w32 := make([]float32, len(weights))
		for i := range weights {
			w32[i] = float32(rng.Float64()*2 - 1)
			weights[i] = float64(w32[i])
		}
		g := tensor.FromFloat32(y.Device(), w32, y.Shape()...)
		if y.DType() != tensor.F32 {
			g = castRaw(g, y.DType())
		}
		Backward(y, WithGrad(g))
	})
	objective := func() float64 {
		var l float64
		NoGrad(dev, func() {
			dev.WithScope(func() {
				for i, v := range f(inputs).Float32s() {
					l += weights[i] * float64(v)
				}
			})
		})
		return l
	}
	var worst struct {
		excess            float64
		input, elem       int
		analytic, numeric float64
	}
	for i, x := range inputs {
		if !x.RequiresGrad() {
			continue
		}
		if x.Grad() == nil {
			return fmt.Errorf("gradcheck: input %d (%v) received no gradient", i, x.Shape())
		}
		analytic := x.Grad().Float32s()
		x.ZeroGrad()
		var maxAbs float64
		for _, a := range analytic {
			maxAbs = max(maxAbs, math.Abs(float64(a)))
		}
		vals := x.Float32s()
		orig := append([]float32(nil), vals...)
		write := func() {
			x.Backend().Write(x.Buf(), unsafe.Slice((*byte)(unsafe.Pointer(&vals[0])), 4*len(vals)))
		}
		for j := range vals {
			vals[j] = orig[j] + float32(opt.Eps)
			write()
			// The step actually taken, after rounding to float32.
			hp := float64(vals[j]) - float64(orig[j])
			lp := objective()
			vals[j] = orig[j] - float32(opt.Eps)
			write()
			hm := float64(orig[j]) - float64(vals[j])
			lm := objective()
			vals[j] = orig[j]
			numeric := (lp - lm) / (hp + hm)
			a := float64(analytic[j])
			tol := opt.ATol*max(maxAbs, 1e-3) + opt.RTol*math.Abs(numeric)
			if math.IsNaN(a) || math.IsNaN(numeric) {
				return fmt.Errorf("gradcheck: input %d %v element %d: analytic %v, numeric %v", i, x.Shape(), j, a, numeric)
			}
			if excess := math.Abs(a-numeric) / tol; excess > worst.excess {
				worst.excess, worst.input, worst.elem, worst.analytic, worst.numeric = excess, i, j, a, numeric
			}
		}
		write()
	}
	if worst.excess > 1 {
		return fmt.Errorf("gradcheck: input %d (%v) element %d: analytic gradient %.6g, numeric %.6g (%.1f× the tolerance)",
			worst.input, inputs[worst.input].Shape(), worst.elem, worst.analytic, worst.numeric, worst.excess)
	}
	return nil
}
