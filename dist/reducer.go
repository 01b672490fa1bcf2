package dist

import (
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

// Reducer averages a step's gradients over a group, as DDP does: the
// parameters are laid out in buckets in reverse order (the order a backward
// makes their gradients ready), each bucket one flat F32 tensor kept for the
// whole run; Reduce copies the gradients into their buckets, all-reduces
// each bucket (one NCCL call per bucket, grouped), and copies the means
// back. Everything is queued on the device, so a captured step captures it.
//
// Note [no overlap]: DDP launches each bucket's all-reduce as soon as its
// last gradient is ready, overlapping the rest of the backward. Reduce runs
// after the whole backward instead, on the compute stream: simpler, and
// the same result; what it costs is the all-reduce time, which the report
// measures (Group.TimeAllReduce) beside the step time.
type Reducer struct {
	g       *Group
	buckets []bucket
	bytes   int64
}

type bucket struct {
	flat   *tensor.Tensor
	params []*tensor.Tensor
	offs   []int64 // element offsets into flat
}

// NewReducer lays params' gradients out in buckets on g's device. Every
// parameter must be F32 (its gradient is, and so is the bucket).
func NewReducer(g *Group, params []*tensor.Tensor) *Reducer {
	r := &Reducer{g: g}
	limit := int64(FirstBucketBytes)
	var cur []*tensor.Tensor
	var size int64
	flush := func() {
		if len(cur) == 0 {
			return
		}
		b := bucket{flat: tensor.Zeros(g.dev, tensor.F32, int(size/4)).Keep(), params: cur}
		var off int64
		for _, p := range cur {
			b.offs = append(b.offs, off)
			off += int64(p.Numel())
		}
		r.buckets = append(r.buckets, b)
		r.bytes += size
		cur, size, limit = nil, 0, BucketBytes
	}
	for i := len(params) - 1; i >= 0; i-- {
		p := params[i]
		if p.DType() != tensor.F32 {
			panic(fmt.Sprintf("dist: parameter %d is %v; the reducer's buckets are F32", i, p.DType()))
		}
		cur = append(cur, p)
		size += 4 * int64(p.Numel())
		if size >= limit {
			flush()
		}
	}
	flush()
	return r
}

// Buckets is the number of buckets; Bytes their size in all (the memory
// data parallelism adds to a step).
func (r *Reducer) Buckets() int { return len(r.buckets) }

// Bytes is the buckets' size in all.
func (r *Reducer) Bytes() int64 { return r.bytes }

// Reduce replaces every parameter's gradient by its mean over the group's
// ranks. A parameter without a gradient on this rank is an error: the other
// ranks would update it and this one would not.
func (r *Reducer) Reduce() error {
	if r.g.Size() == 1 {
		return nil
	}
	be := r.g.dev.Backend()
	views := make([][]kernels.Buf, len(r.buckets))
	for i, b := range r.buckets {
		flat := b.flat.Buf()
		for j, p := range b.params {
			g := p.Grad()
			if g == nil {
				return fmt.Errorf("dist: a parameter of shape %v has no gradient on rank %d: data-parallel training needs every parameter to take part in the loss", p.Shape(), r.g.Rank())
			}
			v := kernels.Buf{Block: flat.Block, Off: flat.Off + 4*b.offs[j], N: p.Numel(), DType: kernels.F32}
			be.Copy(v, g.Buf())
			views[i] = append(views[i], v)
		}
	}
	flats := make([]*tensor.Tensor, len(r.buckets))
	for i, b := range r.buckets {
		flats[i] = b.flat
	}
	if err := r.g.AllReduce(flats, true); err != nil {
		return err
	}
	for i, b := range r.buckets {
		for j, p := range b.params {
			be.Copy(p.Grad().Buf(), views[i][j])
		}
	}
	return nil
}

// Release frees the buckets.
func (r *Reducer) Release() {
	for _, b := range r.buckets {
		b.flat.Release()
	}
	r.buckets = nil
}
