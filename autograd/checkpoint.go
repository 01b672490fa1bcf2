package autograd

import (
	"fmt"

	"github.com/leangrad/leangrad/tensor"
)

// Recomputing reports whether a checkpointed function is being run again
// on dev during Backward. Operations with side effects skip them then:
// batch norm does not update its running statistics a second time.
func Recomputing(dev *tensor.Device) bool { return dev != nil && dev.Modes().Recomputing > 0 }

// Checkpoint runs fn on inputs without recording anything inside it: only
// the inputs are saved, with the few results fn's ops keep (Note [what a
// checkpoint keeps]). During Backward, fn runs again with recording on,
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
	k := &kept{}
	withKept(dev, k, func() {
		NoGrad(dev, func() {
			s := dev.NewScope()
			defer s.Close()
			out = fn(inputs)
			s.Escape(out)
		})
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
	rec.n.saved = append(rec.n.saved, k.results...) // the node owns them: released after its backward
	k.replay = true
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
		k.next = 0
		withAutocast(dev, amp, func() {
			withKept(dev, k, func() {
				dev.WithScope(func() {
					y := fn(xs)
					Backward(y, WithGrad(g))
				})
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

// Note [what a checkpoint keeps]: a few ops are costly to recompute and
// cheap to keep, and keep their results through a checkpoint's first run
// for its recomputation, which then reads them instead of running the op
// again: causal attention's output and log-sum-exps (B·T·C values and
// B·H·T floats, against work quadratic in T). For GPT-2 small at batch 16
// and context 1024 in bf16 that is 25 MiB a block, and the recomputation
// skips the flash forward kernel, about a quarter of a block's forward
// time. The results are kept in the order the ops ran; the recomputation,
// the same function on the same inputs, asks for them in that order.

// kept is what the ops of a running checkpointed function keep: handles
// owned by the checkpoint's node, in the order the ops kept them.
type kept struct {
	results []*T
	next    int  // the next result the recomputation takes
	replay  bool // the recomputation is running
}

// withKept runs f with k as dev's record of kept results.
func withKept(dev *tensor.Device, k *kept, f func()) {
	m := dev.Modes()
	outer := m.Kept
	m.Kept = k
	defer func() { m.Kept = outer }()
	f()
}

// recall returns, in a checkpointed function's recomputation, new handles
// (in the current scope) on the n results the op kept in the first run, or
// nil when the op is to compute them: outside a checkpoint, or in its
// first run (keep them then).
func recall(dev *tensor.Device, n int) []*T {
	k, _ := dev.Modes().Kept.(*kept)
	if k == nil || !k.replay {
		return nil
	}
	if k.next+n > len(k.results) {
		panic(fmt.Sprintf("autograd: a checkpointed function's recomputation asks for %d more kept results than its first run kept (%d): it must run the same ops", k.next+n-len(k.results), len(k.results)))
	}
	out := make([]*T, n)
	for i := range out {
		r := k.results[k.next+i]
		out[i] = r.View(r.Shape()...)
	}
	k.next += n
	return out
}

// keep hands the results ts of an op to a checkpointed function's first
// run for its recomputation (see recall); outside one it does nothing.
func keep(dev *tensor.Device, ts ...*T) {
	if k, _ := dev.Modes().Kept.(*kept); k != nil && !k.replay {
		for _, t := range ts {
			k.results = append(k.results, t.Alias())
		}
	}
}
