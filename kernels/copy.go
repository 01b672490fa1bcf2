package kernels

import (
	"fmt"

	"github.com/leangrad/leangrad/memory"
)

// CopyOps move and convert data: between the host and the device, between
// buffers, across dtypes and layouts.
type CopyOps interface {
	// Write copies host bytes, in dst's dtype, into dst.
	Write(dst Buf, src []byte)

	// Read waits for queued work and copies src into host bytes.
	Read(dst []byte, src Buf)

	// Copy copies src into dst; both have the same dtype and length.
	Copy(dst, src Buf)

	// Transpose swaps the inner axes of src into dst, both of one dtype
	// and t.Len() elements: a filter or an activation to or from
	// channels-last (Note [channels last]).
	Transpose(dst, src Buf, t Transposition)

	// CopyMany copies each src[i] into dst[i] (F32, the same lengths), in
	// one launch per 32 tensors where the backend launches kernels: what
	// gathers a data-parallel bucket's gradients.
	CopyMany(dst, src []Buf)

	// CastMany converts each src[i] into dst[i] (the same lengths), every
	// src of one dtype and every dst of another, F32 to F16 or BF16 or
	// back, rounding to nearest even as Cast does, in one launch per 32
	// tensors where the backend launches kernels: an autocast's copies of
	// the parameters made at once (autograd.CastParameters).
	CastMany(dst, src []Buf)

	// AccumulateMany adds each src[i] (F16 or BF16, all of one dtype),
	// converted, into the F32 dst[i] of its length, in one launch per 32
	// tensors where the backend launches kernels: those copies' gradients
	// returned to the parameters' at once.
	AccumulateMany(dst, src []Buf)

	// Fill sets every element of dst to v.
	Fill(dst Buf, v float32)

	// Cast converts src into dst's dtype, rounding to nearest even.
	Cast(dst, src Buf)
}

// PinnedCopier is a backend that copies between its device and page-locked
// host memory directly, without staging through buffers of its own (the
// CUDA backend: such copies run at the bus's speed on the copy engines and
// need no host thread). Package tensor's Device.Pinned makes a host device
// over it.
//
// Note [copies beside the stream]: StartRead and StartWrite queue their
// copies on two streams of their own, one each way, so that a copy down
// and a copy up run at once and neither holds up the kernels queued after
// it. Each copy waits for the work queued on the backend's stream before
// it; nothing queued on the backend's stream after it waits for it: a
// reader waits for a read with its Transfer (the host with Wait, the
// stream with Join), and the stream for the writes with JoinWrites. So the
// buffers a copy reads or writes must not change, nor be freed, until
// then. Joined, both directions' copies can be captured into a graph with
// the stream's kernels: the graph then copies to and from the same host
// memory at each replay.
type PinnedCopier interface {
	// PinnedSource is a raw allocator of page-locked host memory (its
	// segments fill Segment.Host): a CPU backend's pool over it holds host
	// tensors that Read fills and StartRead and StartWrite copy directly.
	PinnedSource() memory.Source

	// StartRead queues a copy of src into dst, which must lie in memory
	// from PinnedSource, after the work queued so far, and returns at
	// once: dst holds src once the Transfer's Wait returns, and the work
	// queued after its Join sees src read; every StartRead must be given
	// one of the two.
	StartRead(dst []byte, src Buf) Transfer

	// StartWrite queues a copy of src, which must lie in memory from
	// PinnedSource, into dst after the work queued so far, and returns at
	// once: the work queued after JoinWrites sees it.
	StartWrite(dst Buf, src []byte)

	// JoinWrites makes the work queued from now on wait for every
	// StartWrite so far.
	JoinWrites()
}

// Transfer is a copy under way (PinnedCopier.StartRead). Wait or Join
// finishes it, whichever comes first; later calls of either return at
// once.
type Transfer interface {
	// Wait returns once the copy is done. The host waits: not while the
	// backend's stream is captured into a graph.
	Wait()

	// Join makes the work queued on the backend's stream from now on
	// wait for the copy, and returns at once: its source may then be
	// released to the pool, whose next user's work comes after it. It is
	// how a captured graph waits for a copy.
	Join()
}

// CheckTranspose checks a transposition's buffers: one dtype, t.Len()
// elements each, and no axis empty.
func CheckTranspose(t Transposition, dst, src Buf) {
	if t.Outer <= 0 || t.Rows <= 0 || t.Cols <= 0 {
		panic(fmt.Sprintf("kernels: transpose: invalid %+v", t))
	}
	CheckLen("transpose", t.Len(), dst, src)
	if dst.DType != src.DType {
		panic(fmt.Sprintf("kernels: transpose of a %v source into a %v destination", src.DType, dst.DType))
	}
}

// CheckCastLists checks the lists of a multi-tensor conversion and returns
// their dtypes: as many tensors in dst as in src, the same sizes pairwise,
// every src of one dtype and every dst of another, F32 on one side and F16
// or BF16 on the other (0, 0 for empty lists).
func CheckCastLists(op string, dst, src []Buf) (from, to DType) {
	if len(dst) != len(src) {
		panic(fmt.Sprintf("kernels: %s: lists of %d and %d tensors", op, len(dst), len(src)))
	}
	if len(dst) == 0 {
		return 0, 0
	}
	from, to = src[0].DType, dst[0].DType
	if !(from == F32 && to.Half() || from.Half() && to == F32) {
		panic(fmt.Sprintf("kernels: %s from %v to %v: want f32 to f16 or bf16, or back", op, from, to))
	}
	for i := range dst {
		if src[i].DType != from || dst[i].DType != to || src[i].N != dst[i].N {
			panic(fmt.Sprintf("kernels: %s: tensor %d: %d %v elements into %d %v, want %v into %v of the same length",
				op, i, src[i].N, src[i].DType, dst[i].N, dst[i].DType, from, to))
		}
	}
	return from, to
}

// CheckAccumulateLists is CheckCastLists for an addition into F32
// tensors: it returns the dtype of src, F16 or BF16 (0 for empty lists).
func CheckAccumulateLists(op string, dst, src []Buf) DType {
	from, to := CheckCastLists(op, dst, src)
	if len(dst) > 0 && to != F32 {
		panic(fmt.Sprintf("kernels: %s of %v into %v: want f16 or bf16 into f32", op, from, to))
	}
	return from
}

func (o *Observed) Write(dst Buf, src []byte) {
	defer o.op("Write", "Write", dst)()
	o.B.Write(dst, src)
}

func (o *Observed) Read(dst []byte, src Buf) {
	defer o.op("Read", "Read", src)()
	o.B.Read(dst, src)
}

func (o *Observed) Copy(dst, src Buf) {
	defer o.op("Copy", "Copy", dst)()
	o.B.Copy(dst, src)
}

func (o *Observed) Transpose(dst, src Buf, t Transposition) {
	defer o.op("Transpose", "Transpose", dst)()
	o.B.Transpose(dst, src, t)
}

func (o *Observed) CopyMany(dst, src []Buf) {
	defer o.op("CopyMany", "CopyMany", first(dst))()
	o.B.CopyMany(dst, src)
}

func (o *Observed) CastMany(dst, src []Buf) {
	defer o.op("CastMany", "CastMany", first(dst))()
	o.B.CastMany(dst, src)
}

func (o *Observed) AccumulateMany(dst, src []Buf) {
	defer o.op("AccumulateMany", "AccumulateMany", first(dst))()
	o.B.AccumulateMany(dst, src)
}

func (o *Observed) Fill(dst Buf, v float32) {
	defer o.op("Fill", "Fill", dst)()
	o.B.Fill(dst, v)
}

func (o *Observed) Cast(dst, src Buf) {
	defer o.op("Cast", "Cast "+src.DType.String()+" to", dst)()
	o.B.Cast(dst, src)
}
