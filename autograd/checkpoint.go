package autograd

import (
	"sync/atomic"

	"github.com/leangrad/leangrad/tensor"
)

var recomputing atomic.Int32

// Recomputing reports whether a checkpointed function is being run again
// during Backward. Operations with side effects skip them then: batch norm
// does not update its running statistics a second time.
func Recomputing() bool { return recomputing.Load() > 0 }

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
	if !GradEnabled() || len(inputs) == 0 {
		return fn(inputs)
	}
	gen := inputs[0].Device().Generator()
	rng := gen.State()
	amp := AutocastEnabled()
	var out *T
	NoGrad(func() {
		s := tensor.NewScope()
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
				edges[i].node.refs++
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
		recomputing.Add(1)
		defer func() {
			recomputing.Add(-1)
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
		withAutocast(amp, func() {
			tensor.WithScope(func() {
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
