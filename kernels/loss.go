package kernels

import "fmt"

// LossOps are the losses and the metrics a training run keeps on the device.
type LossOps interface {
	// CrossEntropy computes, for logits (n×k) and I32 labels (n), the mean
	// over rows of -log softmax(logits)[label] into loss (F32, 1), and each
	// row's log-sum-exp into lse (F32, n) for the backward.
	CrossEntropy(logits, labels, lse, loss Buf, n, k int)

	// CrossEntropyBackward computes dlogits = (softmax(logits) - onehot(labels))·dloss/n,
	// dloss being the F32 gradient of the mean loss, read on the device.
	CrossEntropyBackward(logits, labels, lse, dloss, dlogits Buf, n, k int)

	// ClassifierLoss computes the logits h·wᵀ (h: N×C, w: V×C, one dtype;
	// the logits rounded to it, as a product into that dtype stores them and
	// as PyTorch's autocast classifier holds them) a chunk of rows at a
	// time, never all at once, and from each chunk the
	// mean over all rows of −log softmax[label] into loss (F32, 1), the
	// rows whose first maximum is at their I32 label into right (F32, 1)
	// and, with p.Grad, the gradients of the mean loss: dh (F32, N×C) and
	// dw (F32, V×C).
	ClassifierLoss(p ClassifierParams, h, w, labels, loss, right, dh, dw Buf)

	// CountCorrect writes into right (F32, 1 element) the number of rows of
	// logits (n×k) whose first maximum is at the row's I32 label.
	CountCorrect(right, logits, labels Buf, n, k int)

	// AccumulateMetrics adds to sums (F32, 3 elements) loss·n (loss: F32,
	// 1 element, a mean over n predictions), right (F32, 1 element: how
	// many were right) and n: a training run's loss and accuracy, kept on
	// the device until they are read.
	AccumulateMetrics(sums, loss, right Buf, n int)
}

// ClassifierParams describes the fused classifier: N rows of width C
// against a vocabulary of V, with the gradients when Grad is set. With
// GradScale (F32, one value; or invalid) the gradients are those of the
// loss multiplied by GradScale[0], read on the device (a GradScaler's
// scale): the logits' gradient is scaled (and divided by N) before a
// backend rounds it to the logits' dtype, as an autocast loss's scaled
// gradient reaches a 16-bit head.
type ClassifierParams struct {
	N, C, V   int
	Grad      bool
	GradScale Buf
}

// CheckClassifier checks the fused classifier's operands against p.
func CheckClassifier(p ClassifierParams, h, w, labels, loss, right, dh, dw Buf) {
	if p.N <= 0 || p.C <= 0 || p.V <= 0 {
		panic(fmt.Sprintf("kernels: classifier loss: invalid parameters %+v", p))
	}
	CheckLen("classifier input", p.N*p.C, h)
	CheckLen("classifier weight", p.V*p.C, w)
	CheckLen("classifier labels", p.N, labels)
	CheckLen("classifier loss", 1, loss, right)
	CheckF32("classifier loss", loss, right)
	if labels.DType != I32 || h.DType != w.DType || !h.DType.Float() {
		panic(fmt.Sprintf("kernels: classifier loss of %v input, %v weight, %v labels", h.DType, w.DType, labels.DType))
	}
	if p.Grad {
		CheckLen("classifier input gradient", p.N*p.C, dh)
		CheckLen("classifier weight gradient", p.V*p.C, dw)
		CheckF32("classifier gradients", dh, dw)
	}
	if p.GradScale.Valid() {
		CheckLen("classifier gradient scale", 1, p.GradScale)
		CheckF32("classifier gradient scale", p.GradScale)
	}
}

// CheckCrossEntropy checks logits (n×k), I32 labels (n) and the F32 row
// log-sum-exps (n).
func CheckCrossEntropy(op string, logits, labels, lse Buf, n, k int) {
	if n <= 0 || k <= 0 {
		panic(fmt.Sprintf("kernels: %s of %d rows of %d classes", op, n, k))
	}
	CheckLen(op+" logits", n*k, logits)
	CheckLen(op+" labels", n, labels)
	CheckLen(op+" log-sum-exp", n, lse)
	if labels.DType != I32 {
		panic(fmt.Sprintf("kernels: %s labels are %v, want i32", op, labels.DType))
	}
	CheckF32(op, lse)
}

// CheckMetrics checks AccumulateMetrics' operands: F32 sums of 3, an F32
// loss and right count of 1 each, and n > 0 predictions.
func CheckMetrics(sums, loss, right Buf, n int) {
	if n <= 0 {
		panic(fmt.Sprintf("kernels: metrics of %d predictions", n))
	}
	CheckLen("metrics sums", 3, sums)
	CheckLen("metrics loss", 1, loss, right)
	CheckF32("metrics", sums, loss, right)
}

// CheckCountCorrect checks CountCorrect's operands: an F32 count of 1,
// logits of n×k and I32 labels of n.
func CheckCountCorrect(right, logits, labels Buf, n, k int) {
	if n <= 0 || k <= 0 {
		panic(fmt.Sprintf("kernels: count correct of %d rows of %d classes", n, k))
	}
	CheckLen("count correct", 1, right)
	CheckF32("count correct", right)
	CheckLen("count correct logits", n*k, logits)
	CheckLen("count correct labels", n, labels)
	if labels.DType != I32 {
		panic(fmt.Sprintf("kernels: count correct labels are %v, want i32", labels.DType))
	}
}

func (o *Observed) CrossEntropy(logits, labels, lse, loss Buf, n, k int) {
	defer o.op("CrossEntropy", "CrossEntropy", logits)()
	o.B.CrossEntropy(logits, labels, lse, loss, n, k)
}

func (o *Observed) CrossEntropyBackward(logits, labels, lse, dloss, dlogits Buf, n, k int) {
	defer o.op("CrossEntropyBackward", "CrossEntropyBackward", logits)()
	o.B.CrossEntropyBackward(logits, labels, lse, dloss, dlogits, n, k)
}

func (o *Observed) CountCorrect(right, logits, labels Buf, n, k int) {
	defer o.op("CountCorrect", "CountCorrect", logits)()
	o.B.CountCorrect(right, logits, labels, n, k)
}

func (o *Observed) AccumulateMetrics(sums, loss, right Buf, n int) {
	defer o.op("AccumulateMetrics", "AccumulateMetrics", sums)()
	o.B.AccumulateMetrics(sums, loss, right, n)
}

func (o *Observed) ClassifierLoss(p ClassifierParams, hb, w, labels, loss, right, dh, dw Buf) {
	defer o.op("ClassifierLoss", "ClassifierLoss", hb)()
	o.B.ClassifierLoss(p, hb, w, labels, loss, right, dh, dw)
}
