package autograd

import (
	"github.com/leangrad/leangrad/tensor"
)

// Recomputing reports whether a checkpointed function is being run again
// on dev during Backward. Operations with side effects skip them then:
// batch norm does not update its running statistics a second time.
func Recomputing(dev *tensor.Device) bool { return dev != nil && dev.Modes().Recomputing > 0 }

// Checkpoint runs fn on inputs without recording anything inside it: only
// the inputs are saved. During Backward, fn runs again with recording on,
// from the same inputs, the same random generator state (dropout masks are
// identical) and the same autocast setting, and its gradients flow on to the
// inputs and to the parameters fn uses. Memory of fn's intermediates is thus
// traded for a second forward pass.
//
// fn must release the intermediates it makes (as nn's modules do), draw
// random numbers only from the inputs' device generator, and return a new
// tensor. Without recording (NoGrad), Checkpoint just calls fn.
func Checkpoint(fn func(inputs []*T) *T, inputs ...*T) *T {
	dev := ModeOf(inputs...)
	if len(inputs) == 0 || !GradEnabled(dev) {
		return fn(inputs)
	}
	gen := dev.Generator()
	rng := gen.State()
	amp := AutocastDType(dev)
	var out *T
	NoGrad(dev, func() {
		s := dev.NewScope()
		defer s.Close()
		out = fn(inputs)
		s.Escape(out)
	})
	// The node is recorded even when no input requires a gradient: the
	// parameters inside fn may.
	edges := make([]edge, len(inputs))
	for i, x := range inputs {
		if x.RequiresGrad() {
			if gn := x.GradNode(); gn != nil {
				edges[i].node = gn.(*node)
				edges[i].node.refs.Add(1)
			} else {
				edges[i].leaf = x
			}
		}
	}
	rec := &recorder{n: &node{name: "checkpoint", inputs: edges}}
	saved := make([]*T, len(inputs))
	for i, x := range inputs {
		saved[i] = rec.save(x)
	}
	rec.finish(out, func(g *T) []*T {
		after := gen.State()
		gen.SetState(rng)
		m := dev.Modes()
		m.Recomputing++
		defer func() {
			m.Recomputing--
			gen.SetState(after)
		}()
		xs := make([]*T, 0, len(saved))
		done := false
		defer func() {
			if !done { // the recomputation failed (out of memory): drop the aliases and their gradients
				releaseAll(xs...)
			}
		}()
		for i, sv := range saved {
			xs = append(xs, sv.Alias().SetRequiresGrad(rec.needs(i)))
		}
		withAutocast(dev, amp, func() {
			dev.WithScope(func() {
				y := fn(xs)
				Backward(y, WithGrad(g))
			})
		})
		grads := make([]*T, len(xs))
		for i, x := range xs {
			if gx := x.Grad(); gx != nil {
				grads[i] = gx.Retain()
				x.SetGrad(nil)
			}
			x.Release()
		}
		done = true
		return grads
	})
	return out
}
