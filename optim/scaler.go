package optim

import (
	"fmt"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// GradScaler scales the loss so that small F16 gradients do not flush to
// zero, and unscales the gradients before the optimiser sees them, with
// torch.cuda.amp.GradScaler's defaults and semantics: the scale starts at
// 2¹⁶, doubles after 2000 consecutive steps with finite gradients, and
// halves (and the optimiser step is skipped) when any gradient is inf or NaN.
//
// A step is:
//
//	ag.Backward(scaler.Scale(loss))
//	scaler.Step(opt) // unscale + inf/NaN check in one launch, then step or skip
//	scaler.Update()
type GradScaler struct {
	Enabled        bool
	scale          float64
	GrowthFactor   float64
	BackoffFactor  float64
	GrowthInterval int
	growthTracker  int

	dev       *tensor.Device
	found     *tensor.Tensor // F32[1] on the device: 1 when a gradient was not finite
	unscaled  bool
	foundInf  bool // of the last Step
	haveFound bool
}

// NewGradScaler returns an enabled scaler with PyTorch's defaults.
func NewGradScaler(dev *tensor.Device) *GradScaler {
	return &GradScaler{Enabled: true, scale: 65536, GrowthFactor: 2, BackoffFactor: 0.5, GrowthInterval: 2000, dev: dev}
}

// Scale is the current loss scale.
func (s *GradScaler) Scale() float64 { return s.scale }

// ScaleLoss returns loss·scale (recorded, so the gradients are scaled), or
// loss itself (a new handle) when the scaler is disabled.
func (s *GradScaler) ScaleLoss(loss *tensor.Tensor) *tensor.Tensor {
	if !s.Enabled {
		return ag.Identity(loss)
	}
	return ag.Scale(loss, float32(s.scale))
}

// Unscale divides every gradient of opt's parameters by the scale, in
// place, and checks them for inf/NaN in the same launch. Step calls it if
// the caller did not (call it first to clip gradients).
func (s *GradScaler) Unscale(opt Optimizer) {
	if !s.Enabled || s.unscaled {
		return
	}
	if s.found == nil {
		s.found = tensor.Zeros(s.dev, tensor.F32, 1).Keep()
	}
	be := s.dev.Backend()
	be.Fill(s.found.Buf(), 0)
	var grads []kernels.Buf
	for _, p := range opt.Params() {
		if g := p.Grad(); g != nil {
			grads = append(grads, g.Buf())
		}
	}
	if len(grads) > 0 {
		be.UnscaleCheck(grads, float32(1/s.scale), s.found.Buf())
	}
	s.unscaled = true
}

// Step unscales (if needed) and runs opt.Step unless a gradient is inf or
// NaN. It reads one flag from the device. It reports whether the step ran.
func (s *GradScaler) Step(opt Optimizer) bool {
	if !s.Enabled {
		opt.Step()
		return true
	}
	s.Unscale(opt)
	s.unscaled = false
	s.foundInf = s.found.Item() != 0
	s.haveFound = true
	if s.foundInf {
		return false
	}
	opt.Step()
	return true
}

// Update adjusts the scale after a Step: backoff on inf/NaN, growth after
// GrowthInterval clean steps in a row.
func (s *GradScaler) Update() {
	if !s.Enabled || !s.haveFound {
		return
	}
	s.haveFound = false
	if s.foundInf {
		s.scale *= s.BackoffFactor
		s.growthTracker = 0
		return
	}
	s.growthTracker++
	if s.growthTracker >= s.GrowthInterval {
		s.scale *= s.GrowthFactor
		s.growthTracker = 0
	}
}

// Counters is the scaler's state, for a training checkpoint.
func (s *GradScaler) Counters() map[string]float64 {
	return map[string]float64{"scale": s.scale, "growth_tracker": float64(s.growthTracker)}
}

// LoadCounters restores what Counters returned.
func (s *GradScaler) LoadCounters(c map[string]float64) error {
	scale, ok := c["scale"]
	if !ok || scale <= 0 {
		return fmt.Errorf("grad scaler state has no valid scale (%v)", c)
	}
	s.scale = scale
	s.growthTracker = int(c["growth_tracker"])
	return nil
}

// Release frees the scaler's device flag.
func (s *GradScaler) Release() {
	if s.found != nil {
		s.found.Release()
		s.found = nil
	}
}
