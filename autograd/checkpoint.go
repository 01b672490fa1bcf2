package autograd

import (
	"fmt"

	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

// Recomputing reports whether a checkpointed function is being run again
// on dev during Backward. Operations with side effects skip them then:
// batch norm does not update its running statistics a second time.
func Recomputing(dev *tensor.Device) bool { return dev != nil && dev.Modes().Recomputing > 0 }

// Checkpoint runs fn on inputs without recording anything inside it: only
// the inputs are saved (or what they are written again from), with the few
// results fn's ops keep (Note [what a checkpoint keeps]). During Backward,
// fn runs again with recording on, from the same inputs, the same random
// generator state (dropout masks are identical) and the same autocast
// setting, and its gradients flow on to the inputs and to the parameters fn
// uses. Memory of fn's intermediates is thus traded for a second forward
// pass.
//
// fn must release the intermediates it makes (as nn's modules do), draw
// random numbers only from the inputs' device generator, and return a new
// tensor. Without recording (NoGrad), Checkpoint just calls fn.
func Checkpoint(fn func(inputs []*T) *T, inputs ...*T) *T {
	return checkpoint(false, fn, inputs)
}

// CheckpointLight is Checkpoint keeping also the results of the products
// fn marks Keepable, which its recomputation then reads instead of running
// them again (Note [light checkpoints]): more memory than Checkpoint, less
// work in the backward.
func CheckpointLight(fn func(inputs []*T) *T, inputs ...*T) *T {
	return checkpoint(true, fn, inputs)
}

// checkpoint is Checkpoint, or with light CheckpointLight.
func checkpoint(light bool, fn func(inputs []*T) *T, inputs []*T) *T {
	dev := ModeOf(inputs...)
	if len(inputs) == 0 || !GradEnabled(dev) {
		return fn(inputs)
	}
	gen := dev.Generator()
	rng := gen.State()
	amp := AutocastDType(dev)
	var out *T
	k := &kept{light: light}
	withKept(dev, k, func() {
		NoGrad(dev, func() {
			s := dev.NewScope()
			defer s.Close()
			defer func() {
				if out == nil { // fn failed (out of memory): what its ops kept is no one's
					releaseAll(k.results...)
					k.results = nil
				}
			}()
			out = fn(inputs)
			s.Escape(out)
		})
	})
	// The node is recorded even when no input requires a gradient: the
	// parameters inside fn may.
	edges := make([]edge, len(inputs))
	for i, x := range inputs {
		if x.RequiresGrad() {
			if gn := x.GradNode(); gn != nil { // referenced by finish
				edges[i].node = gn.(*node)
			} else {
				edges[i].leaf = x
			}
		}
	}
	rec := &recorder{n: &node{name: "checkpoint", inputs: edges, takesGrad: true}}
	// An input that its node writes again (a batch norm's output) is not
	// kept: the recomputation writes it first (Note [a batch norm's output
	// written again]).
	saved := make([]*T, len(inputs))
	again := make([]func() *T, len(inputs))
	for i, x := range inputs {
		if again[i] = writtenAgain(x); again[i] == nil {
			saved[i] = rec.save(x)
		}
	}
	rec.n.saved = append(rec.n.saved, k.results...) // the node owns them: released after its backward
	k.replay = true
	var off *offloaded
	if o, _ := dev.Modes().Offload.(*Offloader); o != nil && len(rec.n.saved) > 0 { // Note [checkpoints offloaded]
		var refs []**T
		for i := range saved {
			if saved[i] != nil {
				refs = append(refs, &saved[i])
			}
		}
		for i := range k.results {
			refs = append(refs, &k.results[i])
		}
		off = o.offload(refs, rec.n.saved)
	}
	rec.finish(out, func(g *T) []*T {
		after := gen.State()
		gen.SetState(rng)
		m := dev.Modes()
		m.Recomputing++
		if al := dev.Allocator(); al.Tracing() {
			al.Phase("a checkpoint's recomputation")
		}
		defer func() {
			m.Recomputing--
			gen.SetState(after)
		}()
		xs := make([]*T, 0, len(saved))
		grads := make([]*T, len(saved))
		done, handed := false, false
		defer func() {
			if !handed { // g is this backward's until the pass takes it
				g.Release()
			}
			if !done { // the recomputation failed (out of memory): drop the aliases and their gradients
				releaseAll(xs...)
				releaseAll(grads...)
			}
		}()
		if off != nil { // what it kept, up again (Note [checkpoints offloaded])
			defer off.drop()
			off.bringBack()
		}
		for i, sv := range saved {
			switch {
			case again[i] != nil && rec.needs(i):
				xs = append(xs, rereadInput(again[i], &grads[i]))
			case again[i] != nil:
				xs = append(xs, again[i]())
			default:
				xs = append(xs, sv.Alias().SetRequiresGrad(rec.needs(i)))
			}
		}
		k.next, k.unread = 0, 0
		withAutocast(dev, amp, func() {
			withKept(dev, k, func() {
				dev.WithScope(func() {
					y := fn(xs)
					handed = true
					for i, x := range xs { // its readers write it again (Note [a checkpoint's input read again])
						if !x.IsLeaf() {
							x.Release()
							xs[i] = nil
						}
					}
					Backward(y, consuming(g))
				})
			})
		})
		for i, x := range xs {
			if x == nil {
				continue
			}
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

// rereadInput writes a checkpoint's input again for its recomputation as
// the output of a node with no inputs that its readers can write again
// (node.again, node.reread), whose backward hands the input's gradient to
// *grad.
func rereadInput(again func() *T, grad **T) *T {
	x := again()
	n := &node{name: "checkpoint input", again: again, reread: true}
	n.backward = func(g *T) []*T {
		*grad = g.Retain()
		return nil
	}
	n.refs.Add(1)
	x.SetGradNode(n)
	return x
}

// Note [a checkpoint's input read again]: a checkpointed block's input
// that the checkpoint writes again (a batch norm's output, Note [a batch
// norm's output written again]) is read in the recomputation by the
// block's first convolution, for its filter gradient at the end of the
// block's backward, and by the block's last batch norm as its residual,
// for its ReLU's mask at the start; kept for both, it is alive through the
// whole backward of the block, where the block's peak is (its second
// convolution's filter gradient and workspace). So the recomputation's
// copy is the output of a node that can write it again with the
// checkpoint's own recipe and is marked reread: the convolution keeps the
// recipe (as for any output written again), so does a batch norm whose
// residual it is (a reread recipe runs only what the outer graph keeps,
// so it cannot chain), and the checkpoint drops its copy once the
// recomputed forward has run. The input is then written three times
// instead of once, two elementwise passes more a block, and is alive only
// around its two reads: in a ResNet, one activation of the stage's size
// off the backward of every other block (those whose input is written
// again). On ResNet-18 at batch 256 that alone did not lower the step's
// peak, which the next block, whose input its checkpoint keeps, sets as
// high; it is what lets the halves and placement below it count.

// Unread runs f, ops that make a function's result from values its
// backward needs and whose own backward reads none of the values they make
// (a block's last product and its residual add). When that function is
// checkpointed, or ends a checkpointed function, its recomputation, which
// runs only for the backward, does not read them: in the recomputation the
// last Unread to run has the ops inside that can (MLP's second product, Add
// and Sub) record their backward and leave their results unwritten (Note
// [what a recomputation skips]). Everywhere else Unread just calls f. dev
// is the handle whose modes the ops follow (ModeOf of their inputs).
func Unread(dev *tensor.Device, f func() *T) *T {
	k, _ := dev.Modes().Kept.(*kept)
	if k == nil {
		return f()
	}
	if !k.replay {
		k.unreads++
		return f()
	}
	if k.unread++; k.unread < k.unreads {
		return f() // a block inside the function: its result is read
	}
	m := dev.Modes()
	m.Unread++
	defer func() { m.Unread-- }()
	return f()
}

// Note [what a recomputation skips]: a checkpointed function runs again
// only for its backward, so the ops that make its result from values the
// backward needs compute nothing it uses: a transformer block's MLP output
// product and the residual add after it, a third of the block's forward
// products. The function marks them with Unread. Inside it, in the
// recomputation, an op that can (recorder.leavesUnwritten) allocates its
// result and records its backward without computing it, and its node is
// marked unwritten, as is every node recorded on top of an unwritten one.
// Only the last Unread of the function skips: the first run counts them
// (kept.unreads), and an earlier one is a block whose result the next block
// reads. An op that saves an unwritten tensor for its backward panics: a
// value no kernel wrote never reaches a gradient. Ops that cannot skip
// compute as usual (their results are unwritten anyway when their inputs
// are). This is the saving that PyTorch's checkpoint gets by stopping the
// recomputation once the last saved tensor is made, and that
// torch.compile's partitioner gets by recomputing only what the backward
// reads.

// Note [what a checkpoint keeps]: a few ops are costly to recompute and
// cheap to keep, and keep their results through a checkpoint's first run
// for its recomputation, which then reads them instead of running the op
// again: causal attention's output and log-sum-exps (B·T·C values and
// B·H·T floats, against work quadratic in T). For GPT-2 small at batch 16
// and context 1024 in bf16 that is 25 MiB a block, and the recomputation
// skips the flash forward kernel, about a quarter of a block's forward
// time. The results are kept in the order the ops ran; the recomputation,
// the same function on the same inputs, asks for them in that order.

// Note [light checkpoints]: a checkpointed transformer block recomputes
// its layer norms and three of its four products (c_attn's, c_proj's and
// c_fc's; Notes [what a checkpoint keeps], [what a recomputation skips])
// for keeping only its input and attention's results. A light checkpoint
// keeps also the results of the products its function marks Keepable (a
// GPT block's c_attn: 3 values a position in the products' dtype), and
// its recomputation reads them: it runs two products of the four, c_proj's
// and c_fc's, for c_attn's 3·C² multiply-adds a position saved: C² a
// value kept, where leaving a whole block unchecked saves 8·C² for 10.5
// values more (measured below, F32), and keeping the residual after
// c_proj would save C² for a value that stays in F32 under autocast,
// twice the bytes of a 16-bit one. The kept products are the first run's,
// so the gradients are the unchecked function's bit for bit, as a
// checkpoint's are. On two cores (BenchmarkCheckpointModes in train: F32, four blocks of
// width 512, 4,096 tokens) a step took 1.60-1.75 s holding 597 MB
// unchecked, 1.77-1.97 s and 320 MB checkpointed lightly, 1.87-1.98 s and
// 244 MB checkpointed, each run beside the others four times: the light
// step's saving (about 100 ms in two rounds, none in two) is within this
// machine's noise. On a GPU, where the products are most of a block's
// forward (GELU runs in c_fc's epilogue), the budget tries light
// checkpoints first (train's FitBudget); not yet measured there.

// kept is what the ops of a running checkpointed function keep: handles
// owned by the checkpoint's node, in the order the ops kept them.
type kept struct {
	results []*T
	next    int  // the next result the recomputation takes
	replay  bool // the recomputation is running
	unreads int  // the Unread calls of the first run
	unread  int  // and of the recomputation so far
	light   bool // a light checkpoint: Keepable products are kept
	keeping int  // inside Keepable, in a light checkpoint
}

// Keepable runs f, a product whose result a light checkpoint keeps for
// its recomputation (CheckpointLight, Note [light checkpoints]): there,
// Linear and AddLinear inside f keep their results in the first run and
// read them back in the recomputation. Everywhere else it just calls f.
// dev is the handle whose modes the ops follow (ModeOf of their inputs).
func Keepable(dev *tensor.Device, f func() *T) *T {
	k, _ := dev.Modes().Kept.(*kept)
	if k == nil || !k.light {
		return f()
	}
	k.keeping++
	defer func() { k.keeping-- }()
	return f()
}

// keepsProducts reports whether a product recorded on dev now is one a
// light checkpoint keeps (Keepable).
func keepsProducts(dev *tensor.Device) bool {
	k, _ := dev.Modes().Kept.(*kept)
	return k != nil && k.keeping > 0
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
		al := dev.Allocator()
		for _, t := range ts {
			k.results = append(k.results, t.Alias())
			if al.Tracing() { // the checkpoint's to keep, not its recomputation's
				al.SetRole(t.Block(), memory.Role{Category: memory.Activation, Op: "checkpoint"}, false)
			}
		}
	}
}
