package dist

import (
	"errors"
	"fmt"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/tensor"
)

// Bucket sizes, PyTorch DDP's defaults: a small first bucket (its
// gradients, the last layers', are ready first in a backward), then 25 MiB.
const (
	FirstBucketBytes = 1 << 20
	BucketBytes      = 25 << 20
)

// Reducer averages a step's gradients over a group, as DDP does, while the
// backward runs. The parameters are laid out in buckets in reverse order
// (the order a backward makes their gradients ready), the buckets one
// after the other in one F32 block kept for the whole run. A step is
//
//	r.Prepare()
//	autograd.Backward(loss, autograd.OnGradReady(r.Ready))
//	err := r.Finish()
//
// As soon as all of a bucket's gradients are ready, Ready copies them into
// the bucket (one launch per 32 tensors) and starts the bucket's
// all-reduce (a mean) on the collectives' own stream, overlapping the rest
// of the backward. Finish starts what Ready has not, makes the device's
// later work wait for the all-reduces, and hands every parameter a view
// into its bucket as its gradient (the backward's own gradients go back to
// the pool early): the means are never copied back. Everything is queued on
// the device, so a captured step captures it, the side stream included.
//
// Note [the first step learns]: overlapping is right only when each
// parameter's gradient is finished once a backward: a parameter reported
// twice (one used in two checkpointed blocks, whose passes each report it)
// would change after its bucket was copied. So the first step only counts
// the reports and reduces every bucket in Finish; when each parameter was
// reported once, the later steps overlap, and otherwise they go on
// reducing in Finish (Overlap says which, and why). A parameter reported
// twice after that (the graph changed) fails the step. DDP instead raises
// an error on the second report, unless told the graph is static.
//
// A reducer made by Shard reduce-scatters each bucket instead, and Finish
// hands the ShardedOptimizer's pieces their part of the means.
type Reducer struct {
	g       *Group
	shard   *ShardedOptimizer // the optimiser whose pieces take their gradients (Shard), or nil
	all     *tensor.Tensor    // the buckets, one after the other
	buckets []bucket
	slot    map[*tensor.Tensor]int // parameter -> its index in params
	params  []param
	off     bool // SetOverlap(false)

	// What the first step learned (Note [the first step learns]).
	learned bool   // the first step has run
	overlap bool   // buckets start in Ready
	why     string // why they do not

	// One step's state.
	reported []int  // per parameter: Ready calls this step
	left     []int  // per bucket: parameters not yet reported
	started  []bool // per bucket: its all-reduce is queued
	err      error  // the first error Ready met (it cannot return one)
}

type bucket struct {
	flat   *tensor.Tensor
	params []int // indices into Reducer.params
}

type param struct {
	t      *tensor.Tensor
	bucket int
	view   *tensor.Tensor // the parameter's part of its bucket, shaped as it
}

// NewReducer lays params' gradients out in buckets on g's device, the
// buckets one after the other in one block of the pool. Every parameter
// must be F32 (its gradient is, and so is the bucket).
func NewReducer(g *Group, params []*tensor.Tensor) *Reducer { return newReducer(g, params, 1) }

// newReducer is NewReducer with each bucket padded to a multiple of parts
// elements (zeros no parameter owns), so that it splits in parts equal
// shards.
func newReducer(g *Group, params []*tensor.Tensor, parts int) *Reducer {
	r := &Reducer{g: g, slot: map[*tensor.Tensor]int{}, params: make([]param, len(params))}
	var groups [][]int // the buckets' parameters
	var cur []int
	var size, total int64
	limit := int64(FirstBucketBytes)
	for i := len(params) - 1; i >= 0; i-- {
		p := params[i]
		if p.DType() != tensor.F32 {
			panic(fmt.Sprintf("dist: parameter %d is %v; the reducer's buckets are F32", i, p.DType()))
		}
		if _, dup := r.slot[p]; dup {
			panic(fmt.Sprintf("dist: parameter %d of shape %v is listed twice", i, p.Shape()))
		}
		r.slot[p] = i
		r.params[i].t = p
		cur = append(cur, i)
		size += 4 * int64(p.Numel())
		if size >= limit || i == 0 {
			groups = append(groups, cur)
			total += 4 * roundUp(size/4, int64(parts))
			cur, size, limit = nil, 0, BucketBytes
		}
	}
	if total == 0 {
		panic("dist: a reducer of no parameters")
	}
	r.all = tensor.Zeros(g.dev, tensor.F32, int(total/4)).Keep()
	off := 0
	for b, ps := range groups {
		lo := off
		for _, i := range ps {
			p := &r.params[i]
			n := p.t.Numel()
			rows := r.all.Rows(off, off+n)
			p.bucket, p.view = b, rows.View(p.t.Shape()...).Keep()
			rows.Release()
			off += n
		}
		off = lo + int(roundUp(int64(off-lo), int64(parts)))
		r.buckets = append(r.buckets, bucket{flat: r.all.Rows(lo, off).Keep(), params: ps})
	}
	r.reported = make([]int, len(r.params))
	r.left = make([]int, len(r.buckets))
	r.started = make([]bool, len(r.buckets))
	return r
}

// alone says the reducer has nothing to do: one rank, whose gradients are
// the mean, and no shard whose pieces take their gradients from the buckets.
func (r *Reducer) alone() bool { return r.g.Size() == 1 && r.shard == nil }

func roundUp(n, m int64) int64 { return (n + m - 1) / m * m }

// Buckets is the number of buckets.
func (r *Reducer) Buckets() int { return len(r.buckets) }

// Bytes is what the pool holds for the buckets (their one block, rounded
// as the pool rounds): the memory data parallelism adds to a step.
func (r *Reducer) Bytes() int64 { return r.all.Block().Size() }

// Overlap reports whether the all-reduces overlap the backward, and if
// not, why (Note [the first step learns]). Before the first step it
// reports false and "no step has run yet".
func (r *Reducer) Overlap() (bool, string) {
	switch {
	case !r.learned:
		return false, "no step has run yet"
	case r.off && r.overlap:
		return false, "turned off (SetOverlap)"
	}
	return r.overlap, r.why
}

// SetOverlap(false) makes every later step reduce its buckets after the
// backward, as if no gradient were ever reported early (to measure what
// overlapping gains); SetOverlap(true) lets the steps overlap again when
// the first step allowed it.
func (r *Reducer) SetOverlap(on bool) { r.off = !on }

// Prepare starts a step: it forgets what the last step reported. Call it
// before the step's first backward.
func (r *Reducer) Prepare() {
	clear(r.reported)
	clear(r.started)
	for i, b := range r.buckets {
		r.left[i] = len(b.params)
	}
	r.err = nil
}

// Ready is the backward's hook (autograd.OnGradReady): it notes that leaf's
// gradient is finished, and once all of a bucket's are, starts the
// bucket's all-reduce, overlapping the rest of the backward. Leaves that
// are not the reducer's parameters (a checkpointed block's inputs) are
// ignored. Give it only to the backward of a step's last micro-batch.
func (r *Reducer) Ready(leaf *tensor.Tensor) {
	i, ok := r.slot[leaf]
	if !ok || r.alone() {
		return
	}
	p := r.params[i]
	r.reported[i]++
	if r.reported[i] > 1 {
		if r.overlap && r.started[p.bucket] && r.err == nil {
			r.err = fmt.Errorf("dist: the gradient of parameter %d (shape %v) was finished twice in one backward, after its bucket had been copied and its all-reduce started; the first step finished it once (a graph that changes between steps cannot overlap its all-reduces)", i, p.t.Shape())
		}
		return
	}
	r.left[p.bucket]--
	if r.overlap && !r.off && r.left[p.bucket] == 0 {
		r.start(p.bucket)
	}
}

// start copies bucket b's gradients into it and queues its all-reduce on
// the collectives' own stream. A parameter without a gradient leaves the
// bucket unstarted, for Finish to report.
func (r *Reducer) start(b int) {
	var dst, src []kernels.Buf
	for _, i := range r.buckets[b].params {
		g := r.params[i].t.Grad()
		if g == nil {
			return
		}
		dst, src = append(dst, r.params[i].view.Buf()), append(src, g.Buf())
	}
	r.started[b] = true
	r.g.dev.Backend().CopyMany(dst, src)
	flat := []*tensor.Tensor{r.buckets[b].flat}
	var err error
	if r.shard != nil {
		err = r.g.StartReduceScatter(flat, true)
	} else {
		err = r.g.StartAllReduce(flat, true)
	}
	if err != nil && r.err == nil {
		r.err = err
	}
}

// Finish ends a step's reduction: it starts the buckets Ready has not,
// makes the device's later work wait for every all-reduce, and makes each
// parameter's gradient its view of its bucket, which then holds the mean
// over the ranks (sharded, each piece of the ShardedOptimizer's gets its
// view of this rank's shard, and the parameters keep the backward's own
// gradients). A parameter the backward gave no gradient is an error
// (before any all-reduce on the first step): the other ranks would update
// it and this one would not.
func (r *Reducer) Finish() error {
	if r.alone() {
		return nil
	}
	if !r.learned {
		if err := r.learn(); err != nil {
			return err
		}
	}
	var missing error
	for i := range r.params {
		if r.params[i].t.Grad() == nil && missing == nil {
			missing = r.noGradient(i)
		}
	}
	if missing == nil && r.err == nil {
		for b := range r.buckets {
			if !r.started[b] {
				r.start(b)
			}
		}
	}
	if err := errors.Join(r.err, missing, r.Join()); err != nil {
		return err
	}
	if r.shard != nil {
		r.shard.reduced()
		return nil
	}
	for _, p := range r.params {
		p.t.SetGrad(p.view.Retain()) // the gradient takes the reference
	}
	return nil
}

func (r *Reducer) noGradient(i int) error {
	return fmt.Errorf("dist: parameter %d of shape %v has no gradient on rank %d: data-parallel training needs every parameter to take part in the loss", i, r.params[i].t.Shape(), r.g.Rank())
}

// learn decides, after the first step's backward, whether the later steps
// overlap (Note [the first step learns]).
func (r *Reducer) learn() error {
	for i := range r.params {
		if r.params[i].t.Grad() == nil {
			return r.noGradient(i)
		}
	}
	r.learned, r.overlap = true, true
	for i, n := range r.reported {
		if n != 1 {
			r.overlap = false
			r.why = fmt.Sprintf("the gradient of parameter %d (shape %v) is finished %d times a backward (a parameter shared by checkpointed blocks, or one the hook is not given): the buckets are reduced after the backward", i, r.params[i].t.Shape(), n)
			break
		}
	}
	return nil
}

// Join makes the device's later work wait for the all-reduces started so
// far: Finish calls it, and a step that fails midway must too, before its
// buckets are written again.
func (r *Reducer) Join() error { return r.g.Join() }

// Release frees the buckets. Gradients that are views into them keep
// their memory until released (a step's ZeroGrad).
func (r *Reducer) Release() {
	for _, b := range r.buckets {
		b.flat.Release()
	}
	for _, p := range r.params {
		p.view.Release()
	}
	r.all.Release()
	r.buckets, r.params = nil, nil
}
