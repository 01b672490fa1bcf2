package dist

import (
	"fmt"
	"strings"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/optim"
	"github.com/leangrad/leangrad/tensor"
)

// ShardedOptimizer is ZeRO stage 1: each rank keeps the optimiser's state
// (AdamW's moments, SGD's momentum) of its shard of the parameters only,
// 1/ranks of the whole. Its reducer (Shard) lays the gradients out in
// buckets as NewReducer does, each padded to split in as many equal parts
// as ranks, and reduce-scatters each bucket as the backward finishes it,
// so that this rank's part of every bucket holds the mean of its
// gradients. The step then updates the pieces of the parameters that fall
// in those parts and all-gathers the buckets' parts, now parameters, into
// every rank's parameters. A step is the unsharded one's:
//
//	r.Prepare()
//	autograd.Backward(loss, autograd.OnGradReady(r.Ready))
//	err := r.Finish()
//	scaler.Step(o) // unscales and checks this rank's shard; the ranks agree on a skip
//	err = o.Err()
//
// Note [what sharding changes]: every rank still holds the whole
// parameters and the backward's whole gradients; only the optimiser's
// state is divided. The collectives are a reduce-scatter and an
// all-gather, the two halves of the unsharded step's all-reduce, all
// queued on the device (the reduce-scatters on the collectives' stream,
// overlapping the backward), so a captured step captures them. What reads
// the gradients reads the shard: the GradScaler's inf check (StepUnless
// sums the ranks' flags, so they skip together) and the gradient-norm
// clip (ClipGradNorm sums the ranks' sums of squares). The update of a
// piece is the unsharded update of the same elements, so on the CPU's
// collectives, which reduce in rank order, a sharded run equals an
// unsharded one bit for bit without clipping; a clipped one differs in
// the norm's rounding only. Checkpoints hold the whole state (Gather, on
// every rank, before rank 0 saves State), so they resume on any number of
// ranks, sharded or not. Limitations: the all-gather runs on the step's
// own stream after the update, not overlapped with the next forward as
// ZeRO's prefetching does, and the gradient buckets stay whole on every
// rank (sharding them too is ZeRO's stage 2).
type ShardedOptimizer struct {
	r        *Reducer
	inner    optim.Optimizer // over the pieces
	kinds    []string        // the state's kinds (optim.StateKinds)
	pieces   []piece
	gathered map[string]*tensor.Tensor // the whole state, on the host (Gather)
	err      error
}

// piece is the part of a parameter that falls in this rank's shard.
type piece struct {
	param  int // index into the reducer's parameters
	off, n int // its elements of the parameter's
	t      *tensor.Tensor
	grad   *tensor.Tensor // its place in this rank's part of its bucket
}

// Shard makes opt's state sharded over g's ranks: it returns the reducer
// the step reduces opt's parameters' gradients with, and the optimiser to
// step in opt's place, of opt's kind and hyper-parameters (optim.Partition),
// and releases opt. opt must be SGD or AdamW and must not have stepped
// yet; when Shard fails, opt is as it was.
func Shard(g *Group, opt optim.Optimizer) (*Reducer, *ShardedOptimizer, error) {
	kinds, err := optim.StateKinds(opt)
	if err != nil {
		return nil, nil, err
	}
	r := newReducer(g, opt.Params(), g.Size())
	o := &ShardedOptimizer{r: r, kinds: kinds}
	var parts []*tensor.Tensor
	var of []int
	off := 0 // the bucket's first element in r.all
	for _, b := range r.buckets {
		part := b.flat.Numel() / g.Size()
		lo, hi := off+g.Rank()*part, off+(g.Rank()+1)*part
		at := off
		for _, i := range b.params {
			p := r.params[i].t
			a, c := max(lo, at), min(hi, at+p.Numel())
			if a < c {
				pc := piece{param: i, off: a - at, n: c - a, t: rows(p, a-at, c-at), grad: rows(r.all, a, c)}
				o.pieces = append(o.pieces, pc)
				parts, of = append(parts, pc.t), append(of, i)
			}
			at += p.Numel()
		}
		off += b.flat.Numel()
	}
	if o.inner, err = optim.Partition(opt, parts, of); err != nil {
		o.releasePieces()
		r.Release()
		return nil, nil, err
	}
	opt.Release()
	r.shard = o
	return r, o, nil
}

// rows is elements [lo, hi) of t, flattened, outside any scope.
func rows(t *tensor.Tensor, lo, hi int) *tensor.Tensor {
	flat := t.View(-1)
	defer flat.Release()
	return flat.Rows(lo, hi).Keep()
}

// reduced gives each piece its reduced gradient (Finish calls it).
func (o *ShardedOptimizer) reduced() {
	for _, pc := range o.pieces {
		pc.t.SetGrad(pc.grad.Retain()) // the gradient takes the reference
	}
}

// Step updates this rank's shard and gathers the parameters.
func (o *ShardedOptimizer) Step() { o.StepUnless(kernels.Buf{}) }

// StepUnless updates this rank's pieces of the parameters, unless skip is
// set on any rank (the ranks' flags are summed in place first, so they all
// skip together), and all-gathers the parameters' shards into every
// rank's parameters. A collective's failure is kept for Err.
func (o *ShardedOptimizer) StepUnless(skip kernels.Buf) {
	o.dropGathered()
	g := o.r.g
	if skip.Valid() {
		o.fail(g.allReduce([]kernels.Buf{skip}, false))
	}
	o.inner.StepUnless(skip)
	o.gather(func(_ int, pc piece) kernels.Buf { return pc.t.Buf() })
	var dst, src []kernels.Buf
	for _, p := range o.r.params {
		dst, src = append(dst, p.t.Buf()), append(src, p.view.Buf())
	}
	g.dev.Backend().CopyMany(dst, src)
}

// gather copies of(k, piece k) into each piece's place in this rank's part
// of its bucket and all-gathers the buckets: each parameter's view of its
// bucket then holds what of gives for all of its elements.
func (o *ShardedOptimizer) gather(of func(k int, pc piece) kernels.Buf) {
	var dst, src []kernels.Buf
	for k, pc := range o.pieces {
		dst, src = append(dst, pc.grad.Buf()), append(src, of(k, pc))
	}
	if len(dst) > 0 {
		o.r.g.dev.Backend().CopyMany(dst, src)
	}
	flats := make([]*tensor.Tensor, len(o.r.buckets))
	for i, b := range o.r.buckets {
		flats[i] = b.flat
	}
	o.fail(o.r.g.AllGather(flats))
}

func (o *ShardedOptimizer) fail(err error) {
	if err != nil && o.err == nil {
		o.err = err
	}
}

// Err is the first collective that failed since the last call, and
// clears it.
func (o *ShardedOptimizer) Err() error {
	err := o.err
	o.err = nil
	return err
}

// ClipGradNorm is optim.ClipGradNorm over the job's gradients: this rank's
// shard's sum of squares is summed over the ranks before the norm is
// taken, so every rank clips by the same coefficient.
func (o *ShardedOptimizer) ClipGradNorm(maxNorm float64, norm *tensor.Tensor) error {
	return optim.ClipShardedGradNorm(o.inner.Params(), maxNorm, norm, func(sumsq *tensor.Tensor) error {
		return o.r.g.AllReduce([]*tensor.Tensor{sumsq}, false)
	})
}

// ZeroGrad releases the pieces' and the parameters' gradients.
func (o *ShardedOptimizer) ZeroGrad() {
	o.inner.ZeroGrad()
	for _, p := range o.r.params {
		p.t.ZeroGrad()
	}
}

// Params are the pieces of the parameters this rank updates (views of
// them; their gradients, after Finish, views of this rank's shard of the
// buckets): what a GradScaler unscales and checks.
func (o *ShardedOptimizer) Params() []*tensor.Tensor { return o.inner.Params() }

// LR is the learning rate.
func (o *ShardedOptimizer) LR() float64 { return o.inner.LR() }

// SetLR sets the learning rate.
func (o *ShardedOptimizer) SetLR(lr float64) { o.inner.SetLR(lr) }

// Local is this rank's shard of the state, named by piece: what the rank
// holds on its device.
func (o *ShardedOptimizer) Local() map[string]*tensor.Tensor { return o.inner.State() }

// Gather assembles the whole state, named as the unsharded optimiser's,
// on every rank's host, for State: every rank calls it at the same point
// (it all-gathers), between steps. Before the first step there is no
// state to gather.
func (o *ShardedOptimizer) Gather() error {
	o.dropGathered()
	o.gathered = map[string]*tensor.Tensor{}
	local := o.inner.State()
	has := tensor.FromFloat32(o.r.g.dev, []float32{float32(min(1, len(local)))}, 1).Keep()
	defer has.Release()
	if err := o.r.g.AllReduce([]*tensor.Tensor{has}, false); err != nil {
		return err
	}
	if has.Float32s()[0] == 0 {
		return nil
	}
	for _, kind := range o.kinds {
		o.gather(func(k int, pc piece) kernels.Buf {
			s, ok := local[fmt.Sprintf("%s.%d", kind, k)]
			if !ok {
				panic(fmt.Sprintf("dist: rank %d has no %s state for its piece %d of parameter %d", o.r.g.Rank(), kind, k, pc.param))
			}
			return s.Buf()
		})
		if err := o.Err(); err != nil {
			o.dropGathered()
			return err
		}
		for i, p := range o.r.params {
			o.gathered[fmt.Sprintf("%s.%d", kind, i)] = tensor.FromBytes(tensor.CPU(), tensor.F32, p.view.Raw(), p.t.Shape()...).Keep()
		}
	}
	return nil
}

// State is the whole state the last Gather assembled (on the host), named
// as the unsharded optimiser's; it panics when no Gather ran since the
// last step.
func (o *ShardedOptimizer) State() map[string]*tensor.Tensor {
	if o.gathered == nil {
		panic("dist: State of a sharded optimizer that was not gathered since its last step (every rank calls Gather first)")
	}
	return o.gathered
}

// Counters are the optimiser's scalar state (the same on every rank).
func (o *ShardedOptimizer) Counters() map[string]float64 { return o.inner.Counters() }

// LoadState restores this rank's shard from the whole state (a checkpoint
// of any number of ranks, sharded or not).
func (o *ShardedOptimizer) LoadState(ts map[string]*tensor.Tensor, c map[string]float64) error {
	mine := map[string]*tensor.Tensor{}
	defer func() {
		for _, t := range mine {
			t.Release()
		}
	}()
	for name, t := range ts {
		kind, index, ok := strings.Cut(name, ".")
		var i int
		if _, err := fmt.Sscan(index, &i); !ok || err != nil || i < 0 || i >= len(o.r.params) {
			return fmt.Errorf("optimizer state %q names no parameter of %d", name, len(o.r.params))
		}
		if err := optim.CheckState(name, t, tensor.F32, o.r.params[i].t.Shape()); err != nil {
			return err
		}
		for k, pc := range o.pieces {
			if pc.param == i {
				mine[fmt.Sprintf("%s.%d", kind, k)] = rows(t, pc.off, pc.off+pc.n)
			}
		}
	}
	return o.inner.LoadState(mine, c)
}

// Release frees the shard's state and the pieces (the reducer is
// released on its own).
func (o *ShardedOptimizer) Release() {
	o.inner.Release()
	o.releasePieces()
	o.dropGathered()
}

// dropGathered frees what the last Gather assembled.
func (o *ShardedOptimizer) dropGathered() {
	for _, t := range o.gathered {
		t.Release()
	}
	o.gathered = nil
}

func (o *ShardedOptimizer) releasePieces() {
	for _, pc := range o.pieces {
		pc.t.Release()
		pc.grad.Release()
	}
	o.pieces = nil
}
