package autograd

import (
	"fmt"

	"github.com/leangrad/leangrad/tensor"
)

// CrossEntropy returns the mean over rows of −log softmax(logits)[label], for
// logits of N×K and I32 labels of N, fused: the backward needs only the
// logits and each row's log-sum-exp. The loss is F32 of shape [1]. Under
// Autocast, 16-bit logits are cast to F32 first.
func CrossEntropy(logits, labels *T) *T {
	required("CrossEntropy", logits, labels)
	if dev := ModeOf(logits, labels); AutocastEnabled(dev) {
		logits = autocastTo(dev, logits, tensor.F32)
		defer logits.Release()
	}
	ls := logits.Shape()
	if len(ls) != 2 || labels.NDim() != 1 || labels.Dim(0) != ls[0] {
		panic(fmt.Sprintf("autograd: cross entropy of logits %v and labels %v: want N×K and N", ls, labels.Shape()))
	}
	if labels.DType() != tensor.I32 {
		panic(fmt.Sprintf("autograd: cross entropy labels are %v, want i32", labels.DType()))
	}
	sameDevice("cross entropy", logits, labels)
	n, k := ls[0], ls[1]
	be := logits.Backend()
	lse := tensor.Empty(logits.Device(), tensor.F32, n)
	loss := tensor.Empty(logits.Device(), tensor.F32, 1)
	be.CrossEntropy(logits.Buf(), labels.Buf(), lse.Buf(), loss.Buf(), n, k)
	rec := begin("cross_entropy", logits)
	if rec == nil {
		lse.Release()
		return loss
	}
	xs, ys := rec.save(logits), rec.save(labels)
	rec.keep(lse)
	rec.finish(loss, func(g *T) []*T {
		dx := emptyLike(xs)
		be.CrossEntropyBackward(xs.Buf(), ys.Buf(), lse.Buf(), g.Buf(), dx.Buf(), n, k)
		return []*T{dx}
	})
	return loss
}

// Dropout zeroes each element of x with probability p and scales the rest by
// 1/(1−p), drawing the mask from gen (the device's generator if nil). The
// mask is not stored: the backward regenerates it from the generator state
// the forward used.
func Dropout(x *T, p float32, gen *tensor.Generator) *T {
	if p < 0 || p >= 1 {
		panic(fmt.Sprintf("autograd: dropout probability %v outside [0, 1)", p))
	}
	if gen == nil {
		gen = x.Device().Generator()
	}
	state := gen.Next(x.Numel())
	y := emptyLike(x)
	be := x.Backend()
	be.Dropout(y.Buf(), x.Buf(), p, state)
	if rec := begin("dropout", x); rec != nil {
		rec.finish(y, func(g *T) []*T {
			dx := emptyLike(g)
			be.Dropout(dx.Buf(), g.Buf(), p, state)
			return []*T{dx}
		})
	}
	return y
}

// CountCorrect returns, as an F32 tensor of shape [1], how many rows of
// logits (N×K) have their first maximum at the row's I32 label, computed on
// the device. It is not differentiable and records nothing.
func CountCorrect(logits, labels *T) *T {
	ls := logits.Shape()
	if len(ls) != 2 || labels.NDim() != 1 || labels.Dim(0) != ls[0] || labels.DType() != tensor.I32 {
		panic(fmt.Sprintf("autograd: count correct of %v logits %v and %v labels %v: want N×K and i32 N",
			logits.DType(), ls, labels.DType(), labels.Shape()))
	}
	sameDevice("count correct", logits, labels)
	right := tensor.Empty(ModeOf(logits, labels), tensor.F32, 1)
	logits.Backend().CountCorrect(right.Buf(), logits.Buf(), labels.Buf(), ls[0], ls[1])
	return right
}
