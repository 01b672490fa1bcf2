package optim

import (
	"fmt"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// GradScaler scales the loss so that small F16 gradients do not flush to
// zero, and unscales the gradients before the optimiser sees them, with
// torch.amp.GradScaler's defaults and semantics: the scale starts at 2¹⁶,
// doubles after 2000 consecutive steps with finite gradients, and halves
// (and the optimiser step is skipped) when any gradient is inf or NaN.
//
// Its state (the scale, the growth tracker, the found-inf flag and the
// count of skipped steps) lives on the device, and every decision is made
// there: a step queues its work without reading anything back, as
// torch.amp.GradScaler's _amp_update_scale_ does. Scale, Skipped and
// Counters read the device.
//
// A step is:
//
//	ag.Backward(scaler.ScaleLoss(loss))
//	scaler.Step(opt) // unscale + inf/NaN check in one launch, then the update unless inf/NaN
//	scaler.Update()  // back off or grow the scale, on the device
//
// StepClipped replaces Step when the gradients are clipped too: for an
// optimiser that reads them through a multiplier (AdamW), the unscale,
// the check and the clip cost one sum of squares and no pass that writes.
type GradScaler struct {
	GrowthFactor   float64
	BackoffFactor  float64
	GrowthInterval int

	dev      *tensor.Device
	scale    *tensor.Tensor // F32[1]
	tracker  *tensor.Tensor // I32[1]: clean steps in a row
	found    *tensor.Tensor // F32[1]: 1 when a gradient of this step was not finite
	skipped  *tensor.Tensor // F32[1]: steps skipped so far
	enabled  bool
	unscaled bool
}

// InitialScale is the loss scale a new GradScaler starts at, as PyTorch's.
const InitialScale = 65536

// NewGradScaler returns a scaler with PyTorch's defaults, its state on dev.
// A disabled one (training without F16 autocast) scales nothing and steps
// the optimiser as it is.
func NewGradScaler(dev *tensor.Device, enabled bool) *GradScaler {
	return &GradScaler{enabled: enabled, GrowthFactor: 2, BackoffFactor: 0.5, GrowthInterval: 2000, dev: dev,
		scale:   tensor.Full(dev, tensor.F32, InitialScale, 1).Keep(),
		tracker: tensor.Zeros(dev, tensor.I32, 1).Keep(),
		found:   tensor.Zeros(dev, tensor.F32, 1).Keep(),
		skipped: tensor.Zeros(dev, tensor.F32, 1).Keep()}
}

// Enabled reports whether the scaler scales.
func (s *GradScaler) Enabled() bool { return s.enabled }

// Scale reads the current loss scale from the device.
func (s *GradScaler) Scale() float64 { return float64(s.scale.Item()) }

// Skipped reads from the device how many steps were skipped so far.
func (s *GradScaler) Skipped() int { return int(s.skipped.Item()) }

// Forward runs f, the forward on dev (the handle it runs on) whose loss
// ScaleLoss will scale, with the scale known to the loss ops that make
// their gradients in the forward (autograd.LossScaled), which then make
// them for the scaled loss; disabled, it runs f.
func (s *GradScaler) Forward(dev *tensor.Device, f func()) {
	if !s.enabled {
		f()
		return
	}
	ag.LossScaled(dev, s.scale, f)
}

// ScaleLoss returns loss·scale (recorded, so the gradients are scaled; the
// scale is read on the device), or loss itself (a new handle) when the
// scaler is disabled.
func (s *GradScaler) ScaleLoss(loss *tensor.Tensor) *tensor.Tensor {
	if !s.enabled {
		return ag.Identity(loss)
	}
	return ag.Mul(loss, s.scale)
}

// Unscale divides every gradient of opt's parameters by the scale, in
// place, and checks them for inf/NaN in the same launch. Step calls it if
// the caller did not (call it first to clip gradients).
func (s *GradScaler) Unscale(opt Optimizer) {
	if !s.enabled || s.unscaled {
		return
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
		be.UnscaleCheck(grads, s.scale.Buf(), s.found.Buf())
	}
	s.unscaled = true
}

// Step unscales (if needed) and queues opt's update, which the device skips
// when a gradient was inf or NaN.
func (s *GradScaler) Step(opt Optimizer) {
	if !s.enabled {
		opt.Step()
		return
	}
	s.Unscale(opt)
	s.unscaled = false
	opt.StepUnless(s.found.Buf())
}

// StepClipped is Unscale, ClipGradNorm (when maxNorm > 0, writing the norm
// before clipping to norm) and Step, in one pass over the gradients when
// opt is a ScaledStepper: the sum of squares of the still scaled
// gradients, from which one thread takes the norm, the inf/NaN check and
// the multiplier 1/scale × the clip coefficient, which the update applies
// as it reads each gradient (kernels.Backend.UnscaleClip). The gradients
// are left as the backward made them. A sum of squares that overflows
// counts as inf: the step is skipped and the scale backs off. Other
// optimisers get the three in turn.
func (s *GradScaler) StepClipped(opt Optimizer, maxNorm float64, norm *tensor.Tensor) {
	st, fused := opt.(ScaledStepper)
	if !fused || s.unscaled || (!s.enabled && maxNorm <= 0) {
		if maxNorm > 0 {
			s.Unscale(opt)
			ClipGradNorm(opt.Params(), maxNorm, norm)
		}
		s.Step(opt)
		return
	}
	be := s.dev.Backend()
	sumsq, mult := tensor.Empty(s.dev, tensor.F32, 1), tensor.Empty(s.dev, tensor.F32, 1)
	defer sumsq.Release()
	defer mult.Release()
	if ss, ok := opt.(SquareSummer); ok {
		ss.SumGradSquares(sumsq.Buf())
	} else {
		var grads []kernels.Buf
		for _, p := range opt.Params() {
			if g := p.Grad(); g != nil {
				grads = append(grads, g.Buf())
			}
		}
		be.SumSquares(grads, sumsq.Buf())
	}
	var scale, found kernels.Buf
	if s.enabled {
		scale, found = s.scale.Buf(), s.found.Buf()
		be.Fill(found, 0)
	}
	if norm == nil {
		norm = tensor.Empty(s.dev, tensor.F32, 1)
		defer norm.Release()
	}
	be.UnscaleClip(float32(max(maxNorm, 0)), sumsq.Buf(), scale, norm.Buf(), mult.Buf(), found)
	st.StepScaled(mult.Buf(), found)
}

// Update adjusts the scale after a Step, on the device: backoff on inf/NaN,
// growth after GrowthInterval clean steps in a row.
func (s *GradScaler) Update() {
	if !s.enabled {
		return
	}
	p := kernels.ScalerParams{Growth: float32(s.GrowthFactor), Backoff: float32(s.BackoffFactor), Interval: s.GrowthInterval}
	s.dev.Backend().UpdateScale(p, s.scale.Buf(), s.tracker.Buf(), s.found.Buf(), s.skipped.Buf())
}

// Counters is the scaler's state, for a training checkpoint (read from the device).
func (s *GradScaler) Counters() map[string]float64 {
	return map[string]float64{"scale": s.Scale(), "growth_tracker": float64(s.tracker.Int32s()[0]),
		"skipped": float64(s.Skipped())}
}

// LoadCounters restores what Counters returned.
func (s *GradScaler) LoadCounters(c map[string]float64) error {
	scale, ok := c["scale"]
	if !ok || !(scale > 0) {
		return fmt.Errorf("grad scaler state has no valid scale (%v)", c)
	}
	be := s.dev.Backend()
	be.Fill(s.scale.Buf(), float32(scale))
	be.Fill(s.tracker.Buf(), float32(int32(c["growth_tracker"])))
	be.Fill(s.skipped.Buf(), float32(c["skipped"]))
	return nil
}

// Release frees the scaler's device state.
func (s *GradScaler) Release() {
	for _, t := range []**tensor.Tensor{&s.scale, &s.tracker, &s.found, &s.skipped} {
		if *t != nil {
			(*t).Release()
			*t = nil
		}
	}
}
