package optim

import (
	"fmt"
	"math"
	"testing"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

func param(dev *tensor.Device, vals ...float32) *tensor.Tensor {
	return tensor.FromFloat32(dev, vals, len(vals)).Keep().SetRequiresGrad(true)
}

func setGrad(p *tensor.Tensor, vals ...float32) {
	p.SetGrad(tensor.FromFloat32(p.Device(), vals, len(vals)))
}

func near(t *testing.T, what string, got []float32, want ...float64) {
	t.Helper()
	for i := range want {
		if math.Abs(float64(got[i])-want[i]) > 1e-6*(1+math.Abs(want[i])) {
			t.Errorf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

// SGD with momentum 0.9, Nesterov, weight decay 0.1, two steps worked by hand.
func TestSGD(t *testing.T) { testSGD(t, tensor.CPU()) }

func testSGD(t *testing.T, dev *tensor.Device) {
	p := param(dev, 1, -2)
	defer p.Release()
	o := NewSGD([]*tensor.Tensor{p}, 0.5, 0.9, 0.1, true)
	defer o.Release()
	setGrad(p, 0.2, 0.4)
	o.Step()
	// d = g + 0.1p = (0.3, 0.2); buf = d; p -= 0.5(d + 0.9buf) = p - 0.95d
	near(t, "p after step 1", p.Float32s(), 1-0.95*0.3, -2-0.95*0.2)
	p1 := []float64{1 - 0.95*0.3, -2 - 0.95*0.2}
	setGrad(p, -0.1, 0.3)
	o.Step()
	var want []float64
	for i, g := range []float64{-0.1, 0.3} {
		d := g + 0.1*p1[i]
		buf := 0.9*[]float64{0.3, 0.2}[i] + d
		want = append(want, p1[i]-0.5*(d+0.9*buf))
	}
	near(t, "p after step 2", p.Float32s(), want...)
}

func TestAdamW(t *testing.T) { testAdamW(t, tensor.CPU()) }

func testAdamW(t *testing.T, dev *tensor.Device) {
	p := param(dev, 0.5)
	defer p.Release()
	o := NewAdamW([]*tensor.Tensor{p}, 0.1, 0.01)
	defer o.Release()
	pv, m, v := 0.5, 0.0, 0.0
	for step, g := range []float64{0.2, -0.3, 0.1} {
		setGrad(p, float32(g))
		o.Step()
		k := float64(step + 1)
		pv *= 1 - 0.1*0.01
		m = 0.9*m + 0.1*g
		v = 0.999*v + 0.001*g*g
		pv -= 0.1 * (m / (1 - math.Pow(0.9, k))) / (math.Sqrt(v/(1-math.Pow(0.999, k))) + 1e-8)
		near(t, "p", p.Float32s(), pv)
	}
	if c := o.Counters(); c["step"] != 3 {
		t.Errorf("counters %v", c)
	}
}

func TestZeroGradReleasesMemory(t *testing.T) {
	dev := tensor.NewDevice(tensor.CPU().Backend())
	p := tensor.Zeros(dev, tensor.F32, 1000).Keep().SetRequiresGrad(true)
	defer p.Release()
	o := NewSGD([]*tensor.Tensor{p}, 0.1, 0, 0, false)
	defer o.Release()
	a := dev.Allocator()
	before := a.Stats().Allocated[memory.All].Current
	p.SetGrad(tensor.Ones(dev, tensor.F32, 1000))
	if a.Stats().Allocated[memory.All].Current == before {
		t.Fatal("gradient not allocated")
	}
	o.ZeroGrad()
	if got := a.Stats().Allocated[memory.All].Current; got != before {
		t.Errorf("after ZeroGrad %d bytes allocated, before the gradient %d", got, before)
	}
}

func TestSchedules(t *testing.T) {
	c := CosineWarmup{Base: 0.1, Min: 0.001, Warmup: 10, Total: 110}
	for _, tc := range []struct {
		step int
		want float64
	}{{0, 0.01}, {9, 0.1}, {10, 0.1}, {60, 0.0505}, {110, 0.001}, {500, 0.001}} {
		if got := c.LR(tc.step); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("cosine LR(%d) = %v, want %v", tc.step, got, tc.want)
		}
	}
	o := NewOneCycle(0.4, 100)
	if got := o.LR(0); math.Abs(got-0.016) > 1e-12 {
		t.Errorf("one-cycle starts at %v, want max/25", got)
	}
	if got := o.LR(29); math.Abs(got-0.4) > 1e-12 {
		t.Errorf("one-cycle peak %v at 30%%", got)
	}
	if got := o.LR(99); math.Abs(got-0.016/1e4) > 1e-15 {
		t.Errorf("one-cycle ends at %v", got)
	}
}

// TestGradScaler: an injected inf skips the step and halves the scale;
// GrowthInterval clean steps double it; the state round-trips.
func TestGradScaler(t *testing.T) { testGradScaler(t, tensor.CPU()) }

func testGradScaler(t *testing.T, dev *tensor.Device) {
	w := param(dev, 1, 2, 3)
	defer w.Release()
	opt := NewSGD([]*tensor.Tensor{w}, 0.1, 0, 0, false)
	defer opt.Release()
	s := NewGradScaler(dev, true)
	defer s.Release()
	s.GrowthInterval = 3
	if s.Scale() != 65536 {
		t.Fatalf("initial scale %v", s.Scale())
	}
	// step runs one step and reports whether the device skipped it.
	step := func(x float32) bool {
		before := s.Skipped()
		dev.WithScope(func() {
			in := tensor.FromFloat32(dev, []float32{x, 1, 1}, 3)
			loss := ag.SumAll(ag.Mul(w, in))
			ag.Backward(s.ScaleLoss(loss))
			s.Step(opt)
			s.Update()
		})
		opt.ZeroGrad()
		return s.Skipped() == before
	}
	if !step(1) {
		t.Fatal("a clean step was skipped")
	}
	// The unscaled gradient (1, 1, 1) was applied: w -= 0.1.
	near(t, "w after a clean step", w.Float32s(), 0.9, 1.9, 2.9)
	if step(float32(math.Inf(1))) {
		t.Error("a step with an infinite gradient ran")
	}
	near(t, "w after a skipped step", w.Float32s(), 0.9, 1.9, 2.9)
	if s.Scale() != 32768 {
		t.Errorf("scale after inf = %v, want 32768", s.Scale())
	}
	for i := 0; i < 3; i++ {
		step(1)
	}
	if s.Scale() != 65536 {
		t.Errorf("scale after 3 clean steps (interval 3) = %v, want 65536", s.Scale())
	}
	step(1)
	c := s.Counters()
	if c["growth_tracker"] != 1 {
		t.Errorf("counters %v", c)
	}
	s2 := NewGradScaler(dev, true)
	defer s2.Release()
	if err := s2.LoadCounters(c); err != nil || s2.Scale() != 65536 || s2.Counters()["growth_tracker"] != 1 || s2.Skipped() != 1 {
		t.Errorf("round trip: %v %v", err, s2.Counters())
	}
	if err := s2.LoadCounters(map[string]float64{}); err == nil {
		t.Error("empty state accepted")
	}
}

// Parameter groups: a parameter marked NoDecay steps as under a weight
// decay of 0, the others as under the optimiser's, for both optimisers.
func TestNoDecayGroups(t *testing.T) { testNoDecayGroups(t, tensor.CPU()) }

func testNoDecayGroups(t *testing.T, dev *tensor.Device) {
	for _, name := range OptimizerNames {
		run := func(wd []float64, noDecay []bool) [][]float32 {
			a, b := param(dev, 1, -2), param(dev, 0.5, 3)
			defer a.Release()
			defer b.Release()
			if noDecay != nil {
				o, _ := NewNamed(name, []*tensor.Tensor{a, b}, Hyper{LR: 0.1, Momentum: 0.9, WeightDecay: wd[0], NoDecay: noDecay})
				defer o.Release()
				for range 3 {
					setGrad(a, 0.2, -0.1)
					setGrad(b, 0.3, 0.4)
					o.Step()
				}
			} else { // one optimiser a parameter, each with its own decay
				oa, _ := NewNamed(name, []*tensor.Tensor{a}, Hyper{LR: 0.1, Momentum: 0.9, WeightDecay: wd[0]})
				ob, _ := NewNamed(name, []*tensor.Tensor{b}, Hyper{LR: 0.1, Momentum: 0.9, WeightDecay: wd[1]})
				defer oa.Release()
				defer ob.Release()
				for range 3 {
					setGrad(a, 0.2, -0.1)
					setGrad(b, 0.3, 0.4)
					oa.Step()
					ob.Step()
				}
			}
			return [][]float32{a.Float32s(), b.Float32s()}
		}
		got, want := run([]float64{0.1}, []bool{false, true}), run([]float64{0.1, 0}, nil)
		for i := range want {
			for j := range want[i] {
				if got[i][j] != want[i][j] {
					t.Errorf("%s: parameter %d element %d: %v with NoDecay groups, %v with separate optimisers", name, i, j, got[i][j], want[i][j])
				}
			}
		}
	}
}

// ClipGradNorm scales all gradients by min(1, max/‖g‖), the norm taken
// over them together, on the device.
func TestClipGradNorm(t *testing.T) { testClipGradNorm(t, tensor.CPU()) }

func testClipGradNorm(t *testing.T, dev *tensor.Device) {
	a, b, frozen := param(dev, 0, 0), param(dev, 0, 0, 0), param(dev, 7)
	defer a.Release()
	defer b.Release()
	defer frozen.Release()
	norm := tensor.Zeros(dev, tensor.F32, 1).Keep()
	defer norm.Release()
	for _, maxNorm := range []float64{10, 2.5} {
		setGrad(a, 3, 0)
		setGrad(b, 0, 4, 0) // ‖(3, 4)‖ = 5
		dev.SyncFree(func() { ClipGradNorm([]*tensor.Tensor{a, b, frozen}, maxNorm, norm) })
		near(t, "norm", norm.Float32s(), 5)
		c := math.Min(1, maxNorm/(5+1e-6))
		near(t, "a", a.Grad().Float32s(), 3*c, 0)
		near(t, "b", b.Grad().Float32s(), 0, 4*c, 0)
	}
}

// TestStepClipped: the fused step (one sum of squares, the update reading
// the gradients through 1/scale × the clip coefficient) moves AdamW's
// parameters as Unscale, ClipGradNorm and Step do, reports the same norm,
// skips the same steps (an inf gradient) and leaves the gradients as the
// backward made them; without a scaler or a clip it is Step.
func TestStepClipped(t *testing.T) { testStepClipped(t, tensor.CPU()) }

func testStepClipped(t *testing.T, dev *tensor.Device) {
	for _, c := range []struct {
		name    string
		scaler  bool
		maxNorm float64
		inf     bool
	}{
		{"scaled, clipped", true, 1, false},
		{"scaled, under the clip", true, 1e4, false},
		{"scaled, no clip", true, 0, false},
		{"clipped, no scaler", false, 1, false},
		{"neither", false, 0, false},
		{"scaled, an inf gradient", true, 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			grads := [][]float32{{0.3, -1.2, 2.5}, {4, -0.5}}
			if c.inf {
				grads[1][0] = float32(math.Inf(1))
			}
			run := func(fused bool) (params [][]float32, norm float32, skipped int, left []float32) {
				ps := []*tensor.Tensor{param(dev, 0.5, -1, 2), param(dev, 3, 0.25)}
				defer func() {
					for _, p := range ps {
						p.Release()
					}
				}()
				opt := NewAdamW(ps, 0.1, 0.01)
				defer opt.Release()
				opt.Eps = 0.5 // the update depends on the gradients' scale, not only their direction
				s := NewGradScaler(dev, c.scaler)
				defer s.Release()
				n := tensor.Zeros(dev, tensor.F32, 1).Keep()
				defer n.Release()
				for step := 0; step < 2; step++ {
					scale := float32(1)
					if c.scaler {
						scale = float32(s.Scale())
					}
					for i, p := range ps {
						g := make([]float32, len(grads[i]))
						for j, v := range grads[i] {
							g[j] = v * scale // as a scaled loss's backward makes them
						}
						setGrad(p, g...)
					}
					var o Optimizer = opt
					if !fused {
						o = struct{ Optimizer }{opt} // hides StepScaled: the three steps in turn
					}
					s.StepClipped(o, c.maxNorm, n)
					s.Update()
					left = ps[0].Grad().Float32s()
				}
				for _, p := range ps {
					params = append(params, p.Float32s())
				}
				return params, n.Float32s()[0], s.Skipped(), left
			}
			p0, n0, s0, _ := run(false)
			p1, n1, s1, g1 := run(true)
			for i := range p0 {
				var want []float64
				for _, v := range p0[i] {
					want = append(want, float64(v))
				}
				near(t, "parameter", p1[i], want...)
			}
			if c.maxNorm > 0 && !c.inf && math.Abs(float64(n1-n0)) > 1e-6*float64(n0) {
				t.Errorf("norm %v, unfused %v", n1, n0)
			}
			if s1 != s0 {
				t.Errorf("%d steps skipped, unfused %d", s1, s0)
			}
			scale := float32(1)
			if c.scaler && !c.inf {
				scale = InitialScale
			}
			if !c.inf && g1[0] != grads[0][0]*scale {
				t.Errorf("the fused step changed the gradients: %v, want %v·%v", g1, grads[0], scale)
			}
		})
	}
}

// TestPerParameterMatchesStep: each named optimizer updating its
// parameters one at a time (Begin, then StepParam in the backward's order,
// which is not Params') gives Step's results bit for bit over three steps,
// decayed and undecayed parameters both, and releases each gradient.
func TestPerParameterMatchesStep(t *testing.T) { testPerParameterMatchesStep(t, tensor.CPU()) }

func testPerParameterMatchesStep(t *testing.T, dev *tensor.Device) {
	grads := [][][]float32{{{0.2, -0.1}, {0.3, 0.4, -0.7}}, {{-0.5, 0.25}, {0.1, -0.2, 0.05}}, {{0.05, 0.6}, {-0.3, 0.9, 0.15}}}
	// A third parameter large enough for adamw8bit's 8-bit moments.
	ramp := func(n int, f func(i int) float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = f(i)
		}
		return v
	}
	c0 := ramp(Min8Bit+300, func(i int) float32 { return float32(math.Sin(float64(i))) })
	for k := range grads {
		grads[k] = append(grads[k], ramp(len(c0), func(i int) float32 { return float32(math.Cos(float64(i*(k+2)))) / float32(1+i%7) }))
	}
	for _, name := range OptimizerNames {
		run := func(each bool) [][]float32 {
			a, b, c := param(dev, 1, -2), param(dev, 0.5, 3, -1), param(dev, c0...)
			defer a.Release()
			defer b.Release()
			defer c.Release()
			o, err := NewNamed(name, []*tensor.Tensor{a, b, c}, Hyper{LR: 0.1, Momentum: 0.9, WeightDecay: 0.05, NoDecay: []bool{false, true, false}})
			if err != nil {
				t.Fatal(err)
			}
			defer o.Release()
			for _, g := range grads {
				setGrad(a, g[0]...)
				setGrad(b, g[1]...)
				setGrad(c, g[2]...)
				if !each {
					o.Step()
					continue
				}
				pp := o.(PerParameter)
				pp.Begin()
				pp.StepParam(1)
				if b.Grad() != nil {
					t.Errorf("%s: StepParam(1) left its gradient", name)
				}
				pp.StepParam(2)
				pp.StepParam(0)
			}
			return [][]float32{a.Float32s(), b.Float32s(), c.Float32s()}
		}
		got, want := run(true), run(false)
		for i := range want {
			for j := range want[i] {
				if got[i][j] != want[i][j] {
					t.Errorf("%s: parameter %d element %d: %v updated one at a time, %v by Step", name, i, j, got[i][j], want[i][j])
				}
			}
		}
	}
}

// TestCheckState: a state tensor of another dtype or shape than its
// parameter's state is refused, naming it, what it is and what was wanted.
func TestCheckState(t *testing.T) {
	dev := tensor.CPU()
	st := tensor.Zeros(dev, tensor.F32, 3, 4).Keep()
	defer st.Release()
	for _, c := range []struct {
		dtype tensor.DType
		shape []int
		want  string
	}{
		{tensor.F32, []int{3, 4}, ""},
		{tensor.F32, []int{4, 3}, "optimizer state exp_avg.2 is f32 [3 4], want f32 [4 3]"},
		{tensor.U8, []int{3, 4}, "optimizer state exp_avg.2 is f32 [3 4], want u8 [3 4]"},
	} {
		err := CheckState("exp_avg.2", st, c.dtype, c.shape)
		if got := fmt.Sprint(err); (c.want == "" && err != nil) || (c.want != "" && got != c.want) {
			t.Errorf("CheckState(%v %v) = %v, want %q", c.dtype, c.shape, err, c.want)
		}
	}
}
