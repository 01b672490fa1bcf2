// Package autograd records operations on tensors as they run (define by run)
// and computes gradients by walking that record backwards, freeing each node's
// saved tensors as soon as its backward has run.
//
// Every differentiable operation is a function here (Add, MatMul, Conv2d,
// BatchNorm2d, CrossEntropy, ...) whose forward and backward stand together.
// An operation whose inputs require gradients records a node on its output
// holding only what its backward needs; after Backward(loss), only the
// parameters, their gradients and what the caller kept are alive. A node is
// also freed, with what it saved, when the last tensor that could reach it is
// released, so a graph dropped without Backward costs nothing.
//
// Modes (NoGrad, Autocast, checkpoint recomputation) belong to a device
// handle, and an operation follows the handle of its inputs (ModeOf): a
// goroutine that works on its own tensor.Device Session records, or not,
// regardless of what other goroutines do. A graph is recorded and its
// Backward run on one goroutine; graphs of different goroutines may share
// parameters (their gradients then accumulate from both: give each its own
// copy of the model to train concurrently).
package autograd

import (
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

// T is shorthand for *tensor.Tensor in this package's signatures.
type T = tensor.Tensor

// NoGrad runs f with recording off on the device handle dev: operations
// whose inputs take their mode from dev (ModeOf) record nothing and save
// nothing, as under torch.no_grad for a thread. Other handles (Sessions,
// other goroutines) record as before.
func NoGrad(dev *tensor.Device, f func()) {
	m := dev.Modes()
	m.NoGrad++
	defer func() { m.NoGrad-- }()
	f()
}

// GradEnabled reports whether operations are recorded on dev.
func GradEnabled(dev *tensor.Device) bool { return dev.Modes().NoGrad == 0 }

// ModeOf is the device handle whose modes (NoGrad, Autocast, checkpoint
// recomputation) an operation on inputs follows, and where its outputs are
// made: the first input's made on a Session, or else the first input's
// (nil without inputs). So parameters made on a device and activations made
// on one of its sessions follow the session (Note [sessions] in package
// tensor).
func ModeOf(inputs ...*T) *tensor.Device {
	var first *tensor.Device
	for _, x := range inputs {
		if x == nil {
			continue
		}
		d := x.Device()
		if d.IsSession() {
			return d
		}
		if first == nil {
			first = d
		}
	}
	return first
}

// node is the record of one operation: edges to where its inputs' gradients
// go, the tensors its backward needs, and the backward itself.
type node struct {
	name     string
	inputs   []edge
	saved    []*T
	backward func(g *T) []*T // one gradient per input; nil where none is needed
	fold     *folder         // or nil: the backward that adds input 0's gradient to one already gathered
	// rounds is the 16-bit dtype the backward reads its gradient in (0:
	// none), sums whether it also sums the gradient's columns (a bias's
	// gradient); rounded, while the backward runs, what the op that
	// finished the gradient wrote of these beside it, or nil (Note [a
	// gradient rounded where it is finished]).
	rounds  tensor.DType
	sums    bool
	rounded *finished
	// passRounding, for a node whose backward hands its gradient on
	// reshaped (Reshape), reshapes the rounding of its gradient for input
	// 0's node.
	passRounding func(r *T) *T
	// takesGrad: the backward takes the pass's reference on its gradient
	// and releases it when it no longer needs it (a checkpoint's, whose
	// recomputation's pass frees it after its first node).
	takesGrad bool
	refs      atomic.Int32 // output handles, downstream edges, and a running Backward (atomic: a leaked handle may drop its reference on another goroutine)
	done      bool         // backward ran and freed what it saved
	// unwritten: the output's values were never computed (Note [what a
	// recomputation skips]), or were computed from such values.
	unwritten bool
	// again, when set, writes the output again, bit for bit, from what the
	// node saved: a reader that would save the output may call it in its
	// backward instead (Note [a batch norm's output written again]). It
	// reads the node's saved tensors, alive until the node's own backward,
	// which runs after its readers'.
	again func() *T
	// reread: again only writes again what an enclosing graph keeps (a
	// checkpoint's input in its recomputation), so a reader may keep it
	// where it would not keep a recipe that chains (Note [a checkpoint's
	// input read again]).
	reread bool
}

// edge leads to the node that produced an input, or to a leaf that
// accumulates a gradient; the zero edge means the input needs no gradient.
type edge struct {
	node *node
	leaf *T
}

func (e edge) needed() bool { return e.node != nil || e.leaf != nil }

// Release drops one reference; the last frees what the node saved and drops
// its edges.
func (n *node) Release() {
	if n.refs.Add(-1) == 0 {
		n.free()
	}
}

func (n *node) releaseSaved() {
	for _, s := range n.saved {
		s.Release()
	}
	n.saved = nil
	n.backward = nil
	n.fold = nil
}

// folder is a backward that adds input 0's gradient into acc, the gradient
// the pass has already gathered for that input (pending for the node that
// made it, or the leaf's Grad), and returns the other inputs' (nil at 0):
// a residual stream's two gradients summed by the norm's backward as it
// writes its own, with no tensor and no addition of their own. The pass
// folds when acc has the input's shape and dtype (and, pending, is the
// pass's alone); otherwise it calls the backward with acc nil, and adds as
// usual. A folder whose rounds is not 0 also writes input 0's gradient, as
// it leaves it, rounded to that dtype into round.rounded when the pass
// gives a round, and its column sums into round.sums when that is set.
type folder struct {
	shape    []int
	dtype    tensor.DType
	rounds   tensor.DType
	backward func(g, acc *T, round *finished) []*T
}

// finished is what the op that finished a gradient wrote beside it for
// the node that reads it next (Note [a gradient rounded where it is
// finished]): the gradient rounded to the node's dtype and, where the node
// sums its columns, their F32 sums.
type finished struct {
	rounded, sums *T
}

func (f *finished) release() {
	if f != nil {
		releaseAll(f.rounded, f.sums)
	}
}

// Note [a gradient rounded where it is finished]: under autocast a
// transformer's residual stream is F32, and so is its gradient, which each
// block's residual product (AddLinear, AddMLP) passes on as it is and
// also casts to 16 bits for its own products: a pass over the gradient
// that the layer norm whose backward finished it (the last to add into
// it, folder) could have written beside its F32 result. So a node whose
// backward reads its gradient rounded says so (node.rounds), the pass
// gives the folder that writes input 0's gradient a tensor for the
// rounding (round) when input 0's node rounds to the folder's dtype, and
// keeps it beside the gradient (roundings) as long as nothing else is
// added to the gradient; the node's backward finds it in node.rounded and
// casts otherwise. A reshape between them (a block's 2-D stream made 3-D
// again) passes the rounding on reshaped (node.passRounding). The rounding
// is the cast's, bit for bit. A node that also sums its gradient's
// columns (a residual product's bias gradient, node.sums) finds them
// beside the rounding, summed by the folder from the F32 gradient as it
// writes it, with no pass of their own; a reshape passes them on where it
// keeps the last dimension.

// gathered is the gradient the pass already holds for input e that f can
// fold into, or nil.
func (f *folder) gathered(e edge, pending map[*node]*T) *T {
	var acc *T
	switch {
	case e.node != nil:
		if acc = pending[e.node]; acc != nil && !acc.Exclusive() {
			return nil
		}
	case e.leaf != nil && !e.leaf.Released():
		acc = e.leaf.Grad() // accumulate adds into it in place too
	}
	if acc == nil || acc.DType() != f.dtype || !slices.Equal(acc.Shape(), f.shape) {
		return nil
	}
	return acc
}

func (n *node) free() {
	n.releaseSaved()
	n.done = true
	ins := n.inputs
	n.inputs = nil
	for _, e := range ins {
		if e.node != nil {
			e.node.Release()
		}
	}
}

// recorder builds the node of one operation. begin returns nil when nothing
// needs recording, and then the operation saves nothing.
type recorder struct {
	n          *node
	unread     bool // in a recomputation's Unread: the op may leave its result unwritten
	recomputed bool // in a checkpoint's recomputation
}

// begin starts recording an operation on inputs (nil inputs are allowed and
// take no gradient). It returns nil if recording is off or no input requires
// a gradient.
func begin(name string, inputs ...*T) *recorder { return beginOn(ModeOf(inputs...), name, inputs...) }

// beginOn is begin following the modes of the handle dev.
func beginOn(dev *tensor.Device, name string, inputs ...*T) *recorder {
	if !recordingOn(dev, inputs...) {
		return nil
	}
	m := dev.Modes()
	r := &recorder{n: &node{name: name, inputs: make([]edge, len(inputs))}, unread: m.Recomputing > 0 && m.Unread > 0, recomputed: m.Recomputing > 0}
	for i, x := range inputs {
		if x == nil || !x.RequiresGrad() {
			continue
		}
		if gn := x.GradNode(); gn != nil { // referenced from finish on: an op that fails before it holds nothing
			e := gn.(*node)
			r.n.inputs[i].node = e
			r.n.unwritten = r.n.unwritten || e.unwritten
		} else {
			r.n.inputs[i].leaf = x
		}
	}
	return r
}

// recording reports whether an operation on inputs would be recorded.
func recording(inputs ...*T) bool { return recordingOn(ModeOf(inputs...), inputs...) }

func recordingOn(dev *tensor.Device, inputs ...*T) bool {
	if dev == nil || !GradEnabled(dev) {
		return false
	}
	for _, x := range inputs {
		if x != nil && x.RequiresGrad() {
			return true
		}
	}
	return false
}

// needs reports whether input i takes a gradient.
func (r *recorder) needs(i int) bool { return r.n.inputs[i].needed() }

// leavesUnwritten reports whether the recording op may leave its result
// unwritten, recording only its backward (Note [what a recomputation
// skips]), and if so marks its node so: an op that asks must then not
// compute its result. It is false for a nil recorder (nothing records).
func (r *recorder) leavesUnwritten() bool {
	if r == nil || !r.unread {
		return false
	}
	r.n.unwritten = true
	return true
}

// writtenAgain is how x, an operation's output, is written again for a
// backward that reads it (node.again), or nil when it is not: then the
// reader saves x.
func writtenAgain(x *T) func() *T {
	gn, _ := x.GradNode().(*node)
	if gn == nil || gn.again == nil || gn.unwritten || gn.done {
		return nil
	}
	return func() *T {
		if gn.done { // an earlier Backward ran gn's backward and freed what it saved
			panic(fmt.Sprintf("autograd: a backward reads the output of %s, whose graph an earlier Backward already freed (RetainGraph keeps it)", gn.name))
		}
		return gn.again()
	}
}

// rereadAgain is writtenAgain for an x whose node is marked reread, else
// nil.
func rereadAgain(x *T) func() *T {
	if gn, _ := x.GradNode().(*node); gn == nil || !gn.reread {
		return nil
	}
	return writtenAgain(x)
}

// save keeps a handle on t's storage for the backward.
func (r *recorder) save(t *T) *T {
	if gn, _ := t.GradNode().(*node); gn != nil && gn.unwritten {
		r.n.releaseSaved() // the node will not be finished: drop what it holds
		panic(fmt.Sprintf("autograd: %s saves %v %v, the result of %s, which a checkpoint's recomputation left unwritten (autograd.Unread): only ops whose backward reads no value of it may follow it there",
			r.n.name, t.DType(), t.Shape(), gn.name))
	}
	a := t.Alias()
	r.n.saved = append(r.n.saved, a)
	r.role(t)
	return a
}

// role says, for a trace being recorded, that t's storage is saved by the
// op (the first op to save a storage is the one a report names).
func (r *recorder) role(t *T) {
	if al := t.Device().Allocator(); al.Tracing() {
		al.SetRole(t.Block(), memory.Role{Category: memory.Activation, Op: r.n.name, Recomputed: r.recomputed}, false)
	}
}

// keep hands t itself (a temporary of the operation, such as batch
// statistics) to the node, taking over the caller's reference.
func (r *recorder) keep(t *T) *T {
	t.Keep()
	r.n.saved = append(r.n.saved, t)
	r.role(t)
	return t
}

// finish attaches the node to out, and takes its references on its
// inputs' nodes: an operation that fails before it (out of memory) holds
// none of the graph behind it.
func (r *recorder) finish(out *T, backward func(g *T) []*T) {
	r.n.backward = backward
	for _, e := range r.n.inputs {
		if e.node != nil {
			e.node.refs.Add(1)
		}
	}
	r.n.refs.Add(1)
	out.SetGradNode(r.n)
}

// finishFolding is finish with a backward that can fold input 0's gradient
// (x, as the forward saw it) into one already gathered (folder); without
// one it runs with acc nil and returns input 0's gradient as any backward.
func (r *recorder) finishFolding(out, x *T, rounds tensor.DType, backward func(g, acc *T, round *finished) []*T) {
	r.n.fold = &folder{shape: x.Shape(), dtype: x.DType(), rounds: rounds, backward: backward}
	r.finish(out, func(g *T) []*T { return backward(g, nil, nil) })
}

// readsRounded says the node's backward reads its gradient rounded to dt
// (Note [a gradient rounded where it is finished]).
func (r *recorder) readsRounded(dt tensor.DType) { r.n.rounds = dt }

// readsColumnSums says the node's backward, which reads its gradient
// rounded, also sums its columns (Note [a gradient rounded where it is
// finished]).
func (r *recorder) readsColumnSums() { r.n.sums = true }

// passesRounding says the node's backward hands input 0 its gradient
// reshaped, as reshape reshapes the gradient's rounding, so that a rounding
// input 0's node reads reaches it through this node (Note [a gradient
// rounded where it is finished]).
func (r *recorder) passesRounding(reshape func(*T) *T) {
	if in := r.n.inputs[0].node; in != nil && in.rounds != 0 {
		r.n.rounds, r.n.sums, r.n.passRounding = in.rounds, in.sums, reshape
	}
}

// isSeed says g is the implied gradient of a Backward's scalar root, a
// one, in a pass that frees the graph as it goes (Modes.Seed): the node's
// backward may return what it kept (takeKept) unscaled.
func (r *recorder) isSeed(g *T) bool { return g != nil && g.Device().Modes().Seed == g }

// takeKept removes t, which keep gave the node, from what the node holds,
// and returns it to the caller's ownership: a backward that runs once
// (isSeed) handing on a gradient made in the forward, with no copy.
func (r *recorder) takeKept(t *T) *T {
	i := slices.Index(r.n.saved, t)
	if i < 0 {
		panic(fmt.Sprintf("autograd: %s takes a %v %v tensor it did not keep", r.n.name, t.DType(), t.Shape()))
	}
	r.n.saved = slices.Delete(r.n.saved, i, i+1)
	return t
}

// takeRounded returns the rounding of the gradient the node's backward
// runs with, or nil: the pass releases it after the backward.
func (r *recorder) takeRounded() *T {
	if r.n.rounded == nil {
		return nil
	}
	return r.n.rounded.rounded
}

// takeColumnSums returns the F32 column sums of the gradient the node's
// backward runs with, summed by the op that finished it, or nil: the
// caller's to release.
func (r *recorder) takeColumnSums() *T {
	f := r.n.rounded
	if f == nil {
		return nil
	}
	s := f.sums
	f.sums = nil
	return s
}

// Option modifies Backward.
type Option func(*backwardOptions)

type backwardOptions struct {
	retain bool
	grad   *T
	take   bool // the pass takes the caller's references on grad and root (consuming)
	ready  func(leaf *T)
}

// consuming is WithGrad(g) where the pass takes the caller's references on
// g, instead of copying it, and on the root: it releases the root's handle
// once it holds the graph, and g once the root's backward ran (g must not be
// written until then; the pass writes it only where it is exclusive). A
// checkpoint's recomputation runs its pass so, and the block's output and
// its gradient do not outlive the block's last op.
func consuming(g *T) Option { return func(o *backwardOptions) { o.grad, o.take = g, true } }

// RetainGraph keeps the graph (and what its nodes saved) after Backward, so
// that Backward can run through it again.
func RetainGraph() Option { return func(o *backwardOptions) { o.retain = true } }

// WithGrad starts Backward from g, the gradient of the loss, instead of ones.
func WithGrad(g *T) Option { return func(o *backwardOptions) { o.grad = g } }

// OnGradReady calls ready with each leaf whose gradient the pass has
// finished: right after its last contribution is added to leaf.Grad(), or,
// for a leaf the pass reaches without giving it a gradient, when the pass
// passes the last node that could have. Each leaf the graph reaches is
// reported once a pass, in an order that depends only on the graph (so the
// ranks of a data-parallel job report in the same order). A checkpointed
// block's leaves are reported from its recomputation, in the middle of the
// outer pass: the hook is kept in the root's device modes while the pass
// runs, and the passes inside it call it too. This is how the data-parallel
// reducer starts each bucket's all-reduce while the backward goes on
// (dist.Reducer), as DDP does with PyTorch's post-accumulate-grad hooks.
func OnGradReady(ready func(leaf *T)) Option { return func(o *backwardOptions) { o.ready = ready } }

// Backward computes the gradient of root with respect to every leaf tensor
// that requires one and that root depends on, adding it to the leaf's Grad.
// root is a scalar (a loss) unless WithGrad gives its gradient, as in
// PyTorch. A Backward that panics (out of memory) frees the graph.
// Each node's saved tensors are released right after its backward ran,
// unless RetainGraph is given. Backward through a graph that an earlier
// Backward freed panics.
func Backward(root *T, opts ...Option) {
	var o backwardOptions
	for _, f := range opts {
		f(&o)
	}
	taken := !o.take // the caller's reference on o.grad, until the pass holds it
	defer func() {
		if !taken { // a panic before the pass held it
			o.grad.Release()
		}
	}()
	// ---- the root and its gradient
	checkRoot(root, o)
	modes := root.Device().Modes()
	if o.ready == nil {
		o.ready = modes.GradReady // a pass inside another: a checkpointed block's
	} else {
		outer := modes.GradReady
		modes.GradReady = o.ready
		defer func() { modes.GradReady = outer }()
	}
	s := root.Device().NewScope() // temporaries of the backward pass
	defer s.Close()
	g := seedGradient(root, o)
	if g.seed { // the ones of an implied gradient, which a node may keep for itself (isSeed)
		outer := modes.Seed
		modes.Seed = g.T
		defer func() { modes.Seed = outer }()
	}
	gn := root.GradNode()
	if gn == nil { // a leaf: its gradient is g
		taken = true
		accumulate(root, g.T)
		if o.ready != nil {
			o.ready(root)
		}
		if o.take {
			root.Release()
		}
		return
	}
	// ---- the nodes, last first
	p := newPass(root, gn.(*node), g.T, o)
	taken = true
	defer p.abandon() // a backward that panicked must not pin the graph
	for ; p.i >= 0; p.i-- {
		p.process(p.order[p.i])
	}
	endPass(modes, true)
}

// checkRoot panics unless Backward can start from root with o's gradient.
func checkRoot(root *T, o backwardOptions) {
	if root.Released() {
		panic("autograd: Backward of a released tensor (its last Release ran, or the scope it was made in closed: Keep it or run Backward inside the scope)")
	}
	if !root.RequiresGrad() {
		panic(fmt.Sprintf("autograd: Backward of a %v %v tensor that does not require grad", root.DType(), root.Shape()))
	}
	if o.grad == nil && root.Numel() != 1 {
		panic(fmt.Sprintf("autograd: Backward of a %v tensor of %d elements without WithGrad: a gradient is implied only for a scalar (a loss); pass WithGrad(g) of shape %v",
			root.Shape(), root.Numel(), root.Shape()))
	}
	if o.grad != nil && !o.grad.SameShape(root) {
		panic(fmt.Sprintf("autograd: Backward gradient of shape %v for a root of shape %v", o.grad.Shape(), root.Shape()))
	}
}

// seedGradient is the gradient the pass starts from: o's (taken, or a
// copy), or ones, which a pass that frees its graph offers its nodes as the
// seed.
func seedGradient(root *T, o backwardOptions) (g struct {
	*T
	seed bool
}) {
	switch {
	case o.grad != nil && o.take:
		g.T = o.grad
	case o.grad != nil:
		g.T = o.grad.Clone()
	default:
		g.T, g.seed = tensor.Ones(root.Device(), root.DType(), root.Shape()...), !o.retain
	}
	return g
}

// pass is one backward pass under way: the nodes in topological order,
// processed from the last (i counts down), and every gradient the pass
// holds, which is in pending (the sum so far of a node's output gradient),
// in flight (given to a node's backward) or in loose (returned by one and
// not yet passed on).
type pass struct {
	order   []*node
	i       int
	pending map[*node]*T
	// roundings[n] is pending[n] rounded to n.rounds, written by the
	// folder that finished it (Note [a gradient rounded where it is
	// finished]).
	roundings map[*node]*finished
	inFlight  *T
	loose     []*T
	left      map[*T]int // edges into each leaf the pass has yet to pass (with a ready hook)
	ready     func(leaf *T)
	retain    bool
	mark      *marker
	modes     *tensor.Modes
}

// newPass holds the graph under root's node for a pass that starts from
// g, and takes the caller's reference on root when o says so.
func newPass(root *T, rootNode *node, g *T, o backwardOptions) *pass {
	if rootNode.done {
		panic("autograd: Backward through a graph that an earlier Backward already freed; " +
			"pass autograd.RetainGraph() to the first Backward to run it twice")
	}
	p := &pass{order: topoOrder(rootNode), pending: map[*node]*T{rootNode: g}, roundings: map[*node]*finished{},
		ready: o.ready, retain: o.retain, mark: traceMarker(root.Device()), modes: root.Device().Modes()}
	for _, n := range p.order {
		n.refs.Add(1) // held until this pass has processed the node
	}
	if o.take {
		root.Release() // what its node saved of it stays
	}
	p.left = leafEdges(p.order, o.ready)
	p.i = len(p.order) - 1
	return p
}

// process runs n's backward if a gradient reached it, tells the hook of
// the leaves the pass has finished, and lets n go.
func (p *pass) process(n *node) {
	if g := p.pending[n]; g != nil {
		delete(p.pending, n)
		if n.done {
			panic(fmt.Sprintf("autograd: Backward reached %s, whose graph an earlier Backward already freed", n.name))
		}
		p.route(n, p.run(n, g))
	}
	if p.left != nil {
		for _, e := range n.inputs {
			if e.leaf == nil {
				continue
			}
			if p.left[e.leaf]--; p.left[e.leaf] == 0 {
				p.ready(e.leaf)
			}
		}
	}
	if !p.retain {
		n.free()
	}
	n.Release()
}

// run runs n's backward from its gradient g, leaving the input gradients
// in p.loose, and returns the rounding that goes with the first of them,
// if any.
func (p *pass) run(n *node, g *T) *finished {
	p.inFlight = g
	if n.takesGrad {
		p.inFlight = nil // the backward's from here on
	}
	p.mark.phase(n)
	n.rounded = p.roundings[n]
	delete(p.roundings, n)
	round := n.newRounding(g)
	if round != nil {
		p.mark.gradient(round.rounded, n)
		if round.sums != nil {
			p.mark.gradient(round.sums, n)
		}
	}
	if acc := n.foldTarget(p.pending); acc != nil { // stays where it is: pending, or the leaf's
		p.loose = n.fold.backward(g, acc, round)
		if in := n.inputs[0].node; round != nil { // acc is pending for in
			p.roundings[in].release() // an earlier sum's
			p.roundings[in], round = round, nil
		}
	} else if round != nil {
		p.loose = n.fold.backward(g, nil, round)
	} else {
		p.loose = n.backward(g)
	}
	p.inFlight = nil
	if !n.takesGrad {
		g.Release()
	}
	if n.rounded != nil && n.passRounding != nil {
		round = n.passRounded()
	}
	n.rounded.release()
	n.rounded = nil
	return round
}

// route passes n's input gradients on: summed into a node's pending
// gradient, added to a leaf's Grad, or released; round, the rounding of
// the first, goes with it where it stays whole.
func (p *pass) route(n *node, round *finished) {
	for j, e := range n.inputs {
		var gi *T
		if j < len(p.loose) {
			gi = p.loose[j]
		}
		switch {
		case gi == nil:
		case e.node != nil:
			if old := p.pending[e.node]; old != nil {
				sum := addInPlace(old, gi)
				p.loose[j] = nil // addInPlace took both
				p.pending[e.node] = sum
				p.mark.gradient(sum, n)
				if r := p.roundings[e.node]; r != nil { // no longer the sum's
					r.release()
					delete(p.roundings, e.node)
				}
			} else {
				p.pending[e.node] = gi
				p.loose[j] = nil
				p.mark.gradient(gi, n)
				if j == 0 && round != nil { // the rounding of gi
					p.roundings[e.node], round = round, nil
				}
			}
		case e.leaf != nil:
			accumulate(e.leaf, gi)
			p.loose[j] = nil
		default:
			p.loose[j] = nil
			gi.Release()
		}
	}
	for _, extra := range p.loose[min(len(p.loose), len(n.inputs)):] {
		releaseAll(extra)
	}
	round.release() // gi went elsewhere: a leaf's, or summed
	p.loose = nil
}

// abandon, after a backward that panicked (out of memory, say), releases
// the gradients the pass holds, frees what the nodes not yet processed
// saved, and drops the pass's hold on them. A finished pass has nothing
// to abandon.
func (p *pass) abandon() {
	if p.i < 0 {
		return
	}
	endPass(p.modes, false)
	releaseAll(p.loose...)
	releaseAll(p.inFlight)
	for _, pg := range p.pending {
		pg.Release()
	}
	for _, r := range p.roundings {
		r.release()
	}
	for ; p.i >= 0; p.i-- {
		p.order[p.i].free()
		p.order[p.i].Release()
	}
}

// marker tells a trace being recorded (memory.Allocator.Phase, SetRole)
// which node's backward runs and which gradients it made; nil when
// nothing traces.
type marker struct {
	al         *memory.Allocator
	recomputed bool
}

func traceMarker(dev *tensor.Device) *marker {
	if al := dev.Allocator(); al.Tracing() {
		return &marker{al: al, recomputed: Recomputing(dev)}
	}
	return nil
}

func (m *marker) phase(n *node) {
	if m == nil {
		return
	}
	name := "the backward of " + n.name
	if m.recomputed {
		name += " in a checkpoint's recomputation"
	}
	m.al.Phase(name)
}

func (m *marker) gradient(g *T, n *node) {
	if m != nil {
		m.al.SetRole(g.Block(), memory.Role{Category: memory.Gradient, Op: n.name, Recomputed: m.recomputed}, false)
	}
}

// folding and rounding are on but in tests that compare a graph with and
// without them.
var folding, rounding = true, true

// newRounding is where n's folder may write input 0's gradient, rounded
// for the node that made input 0, and its column sums where that node
// sums them, or nil (Note [a gradient rounded where it is finished]); g
// is n's own gradient, for the device.
func (n *node) newRounding(g *T) *finished {
	if !rounding || n.fold == nil || n.fold.rounds == 0 || len(n.inputs) == 0 {
		return nil
	}
	in := n.inputs[0].node
	if in == nil || in.rounds != n.fold.rounds {
		return nil
	}
	f := &finished{rounded: tensor.Empty(g.Device(), n.fold.rounds, n.fold.shape...)}
	if in.sums {
		f.sums = tensor.Empty(g.Device(), tensor.F32, n.fold.shape[len(n.fold.shape)-1])
	}
	return f
}

// passRounded is what n's backward passes on to input 0's node of what
// finished n's gradient: the rounding reshaped, and the column sums where
// the reshape keeps the last dimension (n.rounded's, handed on).
func (n *node) passRounded() *finished {
	f := &finished{rounded: n.passRounding(n.rounded.rounded)}
	if s := n.rounded.sums; s != nil {
		if rs := f.rounded.Shape(); rs[len(rs)-1] == s.Numel() {
			f.sums, n.rounded.sums = s, nil
		}
	}
	return f
}

// foldTarget is the gradient n's backward may fold input 0's into, or nil.
func (n *node) foldTarget(pending map[*node]*T) *T {
	if !folding || n.fold == nil || len(n.inputs) == 0 {
		return nil
	}
	return n.fold.gathered(n.inputs[0], pending)
}

// leafEdges counts the edges from the nodes of order into each leaf, for
// OnGradReady (nil without a hook). order lists every node that can reach
// a leaf, and the pass visits each once, so every count reaches zero.
func leafEdges(order []*node, ready func(*T)) map[*T]int {
	if ready == nil {
		return nil
	}
	left := map[*T]int{}
	for _, n := range order {
		for _, e := range n.inputs {
			if e.leaf != nil {
				left[e.leaf]++
			}
		}
	}
	return left
}

// topoOrder lists the nodes reachable from root with every node after all of
// its inputs (so root comes last). Iterative: deep networks would overflow
// nothing, but there is no reason to recurse thousands deep.
func topoOrder(root *node) []*node {
	var order []*node
	visited := map[*node]bool{root: true}
	type frame struct {
		n    *node
		next int
	}
	stack := []frame{{n: root}}
	for len(stack) > 0 {
		f := &stack[len(stack)-1]
		if f.next < len(f.n.inputs) {
			in := f.n.inputs[f.next].node
			f.next++
			if in != nil && !visited[in] {
				visited[in] = true
				stack = append(stack, frame{n: in})
			}
			continue
		}
		order = append(order, f.n)
		stack = stack[:len(stack)-1]
	}
	return order
}

// addInPlace adds g into acc (when acc may be overwritten) and releases g.
// If it panics (out of memory), it has released neither.
func addInPlace(acc, g *T) *T {
	if !acc.Exclusive() || acc.DType() != g.DType() {
		sum := binaryRaw(kernels.Add, acc, g)
		acc.Release()
		g.Release()
		return sum
	}
	b := acc.Backend()
	b.Binary(kernels.Add, acc.Buf(), acc.Buf(), g.Buf(), kernels.NewBroadcast(acc.Shape(), acc.Shape(), g.Shape()))
	g.Release()
	return acc
}

// accumulate adds g into leaf's gradient, taking g's reference, under the
// leaf's gradient lock (sessions may backward into one parameter at once).
// If it panics (out of memory), it has not released g: it releases g only
// after its last allocation.
func accumulate(leaf, g *T) {
	defer leaf.LockGrad()()
	if leaf.Released() {
		g.Release()
		return
	}
	if g.DType() != leaf.DType() {
		c := castRaw(g, leaf.DType())
		g.Release()
		g = c
	}
	old := leaf.Grad()
	switch {
	case old == nil && g.Exclusive():
		leaf.SetGrad(g)
	case old == nil:
		leaf.SetGrad(g.Clone())
		g.Release()
	default:
		b := old.Backend()
		b.Binary(kernels.Add, old.Buf(), old.Buf(), g.Buf(), kernels.NewBroadcast(old.Shape(), old.Shape(), g.Shape()))
		g.Release()
	}
}
