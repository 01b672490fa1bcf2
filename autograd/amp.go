package autograd

import (
	"github.com/leangrad/leangrad/tensor"
)

// Autocast runs f with automatic mixed precision on the device handle dev,
// as torch.autocast does for its thread: operations whose inputs take their
// mode from dev (ModeOf) autocast while f runs.
//
// Conv2d, Linear and MatMul run in F16 on F16 copies of their F32 inputs and
// weights (the copies are differentiable casts, so gradients reach the F32
// master weights), with F32 accumulation; CrossEntropy and the reductions
// (Sum, Mean, SumAll, MeanAll) run in F32. Batch norm computes in F32 and
// keeps its input's dtype. Tensors saved for the backward of an F16
// operation are saved in F16: that is where the memory goes down.
func Autocast(dev *tensor.Device, f func()) {
	m := dev.Modes()
	m.Autocast++
	defer func() { m.Autocast-- }()
	f()
}

// AutocastEnabled reports whether Autocast is in effect on dev (nil: no).
func AutocastEnabled(dev *tensor.Device) bool { return dev != nil && dev.Modes().Autocast > 0 }

// withAutocast runs f with autocast on or off on dev.
func withAutocast(dev *tensor.Device, on bool, f func()) {
	if on {
		Autocast(dev, f)
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
