package autograd

import (
	"sync/atomic"

	"github.com/leangrad/leangrad/tensor"
)

var autocast atomic.Int32

// Autocast runs f with automatic mixed precision, as torch.autocast does:
// Conv2d, Linear and MatMul run in F16 on F16 copies of their F32 inputs and
// weights (the copies are differentiable casts, so gradients reach the F32
// master weights), with F32 accumulation; CrossEntropy and the reductions
// (Sum, Mean, SumAll, MeanAll) run in F32. Batch norm computes in F32 and
// keeps its input's dtype. Tensors saved for the backward of an F16
// operation are saved in F16: that is where the memory goes down.
func Autocast(f func()) {
	autocast.Add(1)
	defer autocast.Add(-1)
	f()
}

// AutocastEnabled reports whether Autocast is in effect.
func AutocastEnabled() bool { return autocast.Load() > 0 }

// withAutocast runs f with autocast on or off.
func withAutocast(on bool, f func()) {
	if on {
		Autocast(f)
		return
	}
	n := autocast.Swap(0)
	defer autocast.Store(n)
	f()
}

// autocastIn converts each *p in place (autocastTo) and returns the
// function that releases the conversions. When one runs out of memory, the
// ones already made are released before the panic goes on: a new reference
// (Retain) belongs to no scope, and would pin x and its graph.
func autocastIn(dt tensor.DType, ps ...**T) (release func()) {
	done := make([]*T, 0, len(ps))
	release = func() { releaseAll(done...) }
	ok := false
	defer func() {
		if !ok {
			release()
		}
	}()
	for _, p := range ps {
		*p = autocastTo(*p, dt)
		done = append(done, *p)
	}
	ok = true
	return release
}

// autocastTo returns x converted to dt when autocast is on and x is a float
// tensor of another dtype, or a new reference to x otherwise.
func autocastTo(x *T, dt tensor.DType) *T {
	if x == nil {
		return nil
	}
	if !AutocastEnabled() || x.DType() == dt || x.DType() == tensor.I32 {
		return x.Retain()
	}
	return Cast(x, dt)
}
