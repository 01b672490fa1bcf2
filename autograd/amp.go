package autograd

import (
	"fmt"

	"github.com/leangrad/leangrad/tensor"
)

// Autocast runs f with automatic mixed precision in dt (F16 or BF16) on the
// device handle dev, as torch.autocast does for its thread: operations
// whose inputs take their mode from dev (ModeOf) autocast while f runs.
//
// Conv2d, Linear, MatMul, Attention and the fused classifier run in dt on
// dt copies of their F32 inputs and weights (the copies are differentiable
// casts, so gradients reach the F32 master weights), with F32
// accumulation; CrossEntropy and the reductions (Sum, Mean, SumAll,
// MeanAll) run in F32. Batch norm and layer norm compute in F32 and keep
// their input's dtype (LayerNormTo writes a product's 16-bit input
// instead). Tensors saved for the backward of a dt operation are
// saved in dt: that is where the memory goes down. F16 needs a GradScaler
// (its small gradients flush to zero); BF16 has F32's exponent range and
// trains without one.
func Autocast(dev *tensor.Device, dt tensor.DType, f func()) {
	if dt != tensor.F16 && dt != tensor.BF16 {
		panic(fmt.Sprintf("autograd: Autocast to %v: want f16 or bf16", dt))
	}
	m := dev.Modes()
	outer := m.AutocastTo
	m.Autocast++
	m.AutocastTo = dt
	defer func() { m.Autocast--; m.AutocastTo = outer }()
	f()
}

// AutocastEnabled reports whether Autocast is in effect on dev (nil: no).
func AutocastEnabled(dev *tensor.Device) bool { return dev != nil && dev.Modes().Autocast > 0 }

// AutocastDType is the dtype Autocast runs in on dev, or 0 when it is off.
func AutocastDType(dev *tensor.Device) tensor.DType {
	if !AutocastEnabled(dev) {
		return 0
	}
	return dev.Modes().AutocastTo
}

// withAutocast runs f with autocast to dt on dev, or with it off for dt 0.
func withAutocast(dev *tensor.Device, dt tensor.DType, f func()) {
	if dt != 0 {
		Autocast(dev, dt, f)
		return
	}
	m := dev.Modes()
	n := m.Autocast
	m.Autocast = 0
	defer func() { m.Autocast = n }()
	f()
}

// autocastIn converts each *p in place (autocastTo on dev) and returns the
// function that releases the conversions. When one runs out of memory, the
// ones already made are released before the panic goes on: a new reference
// (Retain) belongs to no scope, and would pin x and its graph.
func autocastIn(dev *tensor.Device, dt tensor.DType, ps ...**T) (release func()) {
	done := make([]*T, 0, len(ps))
	release = func() { releaseAll(done...) }
	ok := false
	defer func() {
		if !ok {
			release()
		}
	}()
	for _, p := range ps {
		*p = autocastTo(dev, *p, dt)
		done = append(done, *p)
	}
	ok = true
	return release
}

// autocastTo returns x converted to dt when autocast is on for dev and x is
// a float tensor of another dtype, or a new reference to x otherwise.
func autocastTo(dev *tensor.Device, x *T, dt tensor.DType) *T {
	if x == nil {
		return nil
	}
	if !AutocastEnabled(dev) || x.DType() == dt || x.DType() == tensor.I32 {
		return x.Retain()
	}
	return castOn(dev, x, dt)
}
