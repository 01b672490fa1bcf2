package autograd

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
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

// LossScaled runs f, a forward on dev whose loss will be multiplied by
// scale (F32, one value on the device: a GradScaler's scale) before
// Backward, with the scale known to the loss ops that make their
// gradients in the forward (ClassifierLoss): they make them for the
// scaled loss, so that no pass of the backward multiplies them by it.
func LossScaled(dev *tensor.Device, scale *T, f func()) {
	if scale.DType() != tensor.F32 || scale.Numel() != 1 {
		panic(fmt.Sprintf("autograd: LossScaled by a %v %v tensor: want one f32 value", scale.DType(), scale.Shape()))
	}
	m := dev.Modes()
	outer := m.LossScale
	m.LossScale = scale
	defer func() { m.LossScale = outer }()
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
	if copies, _ := dev.Modes().Copies.(map[*T]*T); copies != nil {
		if y := copies[x]; y != nil && y.DType() == dt {
			return y.Retain()
		}
	}
	return castOn(dev, x, dt)
}

// CastParameters casts the F32 tensors among params to dev's autocast
// dtype all at once (the backend's CastMany: a launch per 32 tensors), and
// until release is called the operations on dev that autocast copies of
// their inputs (Conv2d, MatMul) read these instead of casting their own,
// and their gradients return to the parameters together too (Note
// [parameters cast at once]); the operations that compute a weight's
// gradient from its copy themselves, in the weight's dtype (Linear, MLP,
// ClassifierLoss), read the copies recording nothing. Outside Autocast it
// does nothing.
//
// A model calls it at the start of its forward where each copy is kept to
// the backward anyway, as a convolution keeps its weight's: a deep
// network's hundreds of small casts, two launches each a step, become a
// few launches. Under checkpointing, where a block's recomputation casts
// its weights again and the forward keeps no copy, it would hold every
// copy through the step: call it only without.
func CastParameters(dev *tensor.Device, params []*T) (release func()) {
	if !AutocastEnabled(dev) {
		return func() {}
	}
	m := dev.Modes()
	if m.Copies != nil {
		panic("autograd: CastParameters inside another CastParameters' region on the same handle")
	}
	dt := m.AutocastTo
	copies := make(map[*T]*T, len(params))
	var made []*T
	release = func() {
		if m.Copies != nil {
			m.Copies = nil
			releaseAll(made...)
			made = nil
		}
	}
	m.Copies = copies
	ok := false
	defer func() {
		if !ok {
			release()
		}
	}()
	var from []*T
	var dst, src []kernels.Buf
	for _, p := range params {
		if p.DType() != tensor.F32 || copies[p] != nil {
			continue
		}
		y := tensor.Empty(dev, dt, p.Shape()...)
		copies[p] = y
		made, from = append(made, y), append(from, p)
		dst, src = append(dst, y.Buf()), append(src, p.Buf())
	}
	dev.Backend().CastMany(dst, src)
	back := &gathered{dev: dev}
	for i, p := range from {
		if rec := beginOn(dev, "cast", p); rec != nil {
			rec.finish(made[i], func(g *T) []*T { back.add(p, g); return []*T{nil} })
		}
	}
	ok = true
	return release
}

// Note [parameters cast at once]
// Under autocast an operation casts a parameter to its dtype each time it
// reads it, and the cast's backward casts the gradient back and adds it to
// the parameter's: two launches a parameter a step, each tiny for a
// convolution's filter. CastParameters makes every copy in a few launches
// before the forward, and each copy's backward hands its gradient to a
// gathered: up to gatherMost of them, added to the parameters' gradients
// (or becoming them) by one CastMany and one AccumulateMany, the rest when
// the Backward pass ends (Modes.PassEnd). An OnGradReady hook (a
// data-parallel reducer) reads a parameter's gradient as soon as the pass
// has passed its last edge, so with one waiting each gradient is added at
// once. A pass that fails drops what was gathered, as it drops the other
// gradients it held. A parameter read twice in the region has one copy,
// whose two gradients the pass sums in the copy's dtype before its
// backward (as with PyTorch's autocast cache), where casts of their own
// would add them in F32. A bias that a 16-bit product's epilogue adds is
// read from its copy too (biasIn); its gradient is summed in F32 by the
// product's backward, and never reaches the copy.

// gatherMost is how many gradients a gathered holds before adding them:
// a multi-tensor launch's worth, bounding what they hold (F16 copies of
// the largest 32 parameters at most).
const gatherMost = 32

// gathered holds the gradients of CastParameters' copies until they are
// added to the parameters' together.
type gathered struct {
	dev    *tensor.Device
	leaves []*T
	grads  []*T
	queued bool // end is in dev's PassEnd
}

// add takes g, the gradient of leaf's copy (the pass releases its own
// reference).
func (c *gathered) add(leaf, g *T) {
	c.leaves = append(c.leaves, leaf)
	c.grads = append(c.grads, g.Retain())
	m := c.dev.Modes()
	if len(c.grads) >= gatherMost || m.GradReady != nil {
		c.end(true)
		return
	}
	if !c.queued {
		c.queued = true
		m.PassEnd = append(m.PassEnd, func(ok bool) { c.queued = false; c.end(ok) })
	}
}

// end adds the gradients held to their parameters' (ok) or drops them.
func (c *gathered) end(ok bool) {
	leaves, grads := c.leaves, c.grads
	c.leaves, c.grads = nil, nil
	defer releaseAll(grads...)
	if !ok || len(grads) == 0 {
		return
	}
	var fresh, freshLeaves []*T
	var newDst, newSrc, addDst, addSrc []kernels.Buf
	defer func() { releaseAll(fresh...) }() // those not handed to their leaves, after a panic
	for i, l := range leaves {
		if l.Released() {
			continue
		}
		if old := l.Grad(); old != nil {
			addDst, addSrc = append(addDst, old.Buf()), append(addSrc, grads[i].Buf())
		} else {
			f := tensor.Empty(grads[i].Device(), tensor.F32, l.Shape()...)
			fresh, freshLeaves = append(fresh, f), append(freshLeaves, l)
			newDst, newSrc = append(newDst, f.Buf()), append(newSrc, grads[i].Buf())
		}
	}
	be := grads[0].Backend()
	be.CastMany(newDst, newSrc)
	be.AccumulateMany(addDst, addSrc)
	for i, l := range freshLeaves {
		l.SetGrad(fresh[i])
		fresh[i] = nil
	}
}

// endPass calls and clears the PassEnd of m.
func endPass(m *tensor.Modes, ok bool) {
	ends := m.PassEnd
	m.PassEnd = nil
	for _, f := range ends {
		f(ok)
	}
}
