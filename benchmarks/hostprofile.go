package benchmarks

import (
	"sort"
	"time"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/memory"
)

// hostProfiler times each operation a synchronous backend (the CPU's) runs,
// by kind of operation and dtype: there the host time of a call is the
// operation's run time. It is the profiler of backends without a device
// profiler; Profile runs the steps on a device over it. It wraps every
// method of kernels.Backend by name (it does not embed the interface), so
// a new operation without a wrapper here does not compile, rather than
// drop out of the profile.
type hostProfiler struct {
	b  kernels.Backend
	by map[string]*kernels.OpTime // nil when not profiling
}

var _ kernels.Backend = (*hostProfiler)(nil)

// The methods that run no operation pass straight through.

func (h *hostProfiler) Name() string                 { return h.b.Name() }
func (h *hostProfiler) Info() kernels.Info           { return h.b.Info() }
func (h *hostProfiler) Allocator() *memory.Allocator { return h.b.Allocator() }
func (h *hostProfiler) Stream() memory.Stream        { return h.b.Stream() }
func (h *hostProfiler) Synchronize() error           { return h.b.Synchronize() }

// op starts timing an operation of kind op on operands of b's dtype; the
// function it returns ends it.
func (h *hostProfiler) op(op string, b kernels.Buf) func() {
	if h.by == nil {
		return func() {}
	}
	name := op + " " + b.DType.String()
	t0 := time.Now()
	return func() {
		t := h.by[name]
		if t == nil {
			t = &kernels.OpTime{Op: name}
			h.by[name] = t
		}
		t.Count++
		t.MS += float64(time.Since(t0).Nanoseconds()) / 1e6
	}
}

// first is the first of bufs, or none.
func first(bufs []kernels.Buf) kernels.Buf {
	if len(bufs) == 0 {
		return kernels.Buf{}
	}
	return bufs[0]
}

// StartProfile starts timing operations.
func (h *hostProfiler) StartProfile() { h.by = map[string]*kernels.OpTime{} }

// StopProfile returns each kind of operation's time since StartProfile, the
// most first.
func (h *hostProfiler) StopProfile() ([]kernels.OpTime, error) {
	out := make([]kernels.OpTime, 0, len(h.by))
	for _, t := range h.by {
		out = append(out, *t)
	}
	h.by = nil
	sort.Slice(out, func(i, j int) bool { return out[i].MS > out[j].MS })
	return out, nil
}

// Delay does nothing: a synchronous backend has no queue to fill.
func (h *hostProfiler) Delay(time.Duration) {}

func (h *hostProfiler) Write(dst kernels.Buf, src []byte) {
	defer h.op("Write", dst)()
	h.b.Write(dst, src)
}

func (h *hostProfiler) Read(dst []byte, src kernels.Buf) {
	defer h.op("Read", src)()
	h.b.Read(dst, src)
}

func (h *hostProfiler) Copy(dst, src kernels.Buf) {
	defer h.op("Copy", dst)()
	h.b.Copy(dst, src)
}

func (h *hostProfiler) Transpose(dst, src kernels.Buf, t kernels.Transposition) {
	defer h.op("Transpose", dst)()
	h.b.Transpose(dst, src, t)
}

func (h *hostProfiler) CopyMany(dst, src []kernels.Buf) {
	defer h.op("CopyMany", first(dst))()
	h.b.CopyMany(dst, src)
}

func (h *hostProfiler) CastMany(dst, src []kernels.Buf) {
	defer h.op("CastMany", first(dst))()
	h.b.CastMany(dst, src)
}

func (h *hostProfiler) AccumulateMany(dst, src []kernels.Buf) {
	defer h.op("AccumulateMany", first(dst))()
	h.b.AccumulateMany(dst, src)
}

func (h *hostProfiler) Fill(dst kernels.Buf, v float32) {
	defer h.op("Fill", dst)()
	h.b.Fill(dst, v)
}

func (h *hostProfiler) Cast(dst, src kernels.Buf) {
	defer h.op("Cast "+src.DType.String()+" to", dst)()
	h.b.Cast(dst, src)
}

func (h *hostProfiler) Unary(op kernels.UnaryOp, dst, x kernels.Buf) {
	defer h.op(op.String(), x)()
	h.b.Unary(op, dst, x)
}

func (h *hostProfiler) UnaryBackward(op kernels.UnaryOp, dx, dy, x, y kernels.Buf) {
	defer h.op(op.String()+" backward", dy)()
	h.b.UnaryBackward(op, dx, dy, x, y)
}

func (h *hostProfiler) Affine(dst, x kernels.Buf, alpha, beta float32) {
	defer h.op("Affine", x)()
	h.b.Affine(dst, x, alpha, beta)
}

func (h *hostProfiler) Binary(op kernels.BinaryOp, dst, a, b kernels.Buf, bc kernels.Broadcast) {
	defer h.op(op.String(), dst)()
	h.b.Binary(op, dst, a, b, bc)
}

func (h *hostProfiler) Reduce(op kernels.ReduceOp, dst, x kernels.Buf, r kernels.Reduction) {
	defer h.op("Reduce "+op.String(), x)()
	h.b.Reduce(op, dst, x, r)
}

func (h *hostProfiler) ReduceMaxBackward(dx, dy, x, y kernels.Buf, r kernels.Reduction) {
	defer h.op("ReduceMaxBackward", dy)()
	h.b.ReduceMaxBackward(dx, dy, x, y, r)
}

func (h *hostProfiler) ArgMax(dst, x kernels.Buf, r kernels.Reduction) {
	defer h.op("ArgMax", x)()
	h.b.ArgMax(dst, x, r)
}

func (h *hostProfiler) Gemm(p kernels.GemmParams, a, b, c kernels.Buf) {
	defer h.op("Gemm", a)()
	h.b.Gemm(p, a, b, c)
}

func (h *hostProfiler) GemmEpilogue(p kernels.GemmParams, e kernels.Epilogue, a, b, c kernels.Buf) {
	defer h.op("GemmEpilogue "+e.String(), a)()
	h.b.GemmEpilogue(p, e, a, b, c)
}

func (h *hostProfiler) Conv2d(p kernels.ConvParams, x, w, y kernels.Buf) {
	defer h.op("Conv2d", x)()
	h.b.Conv2d(p, x, w, y)
}

func (h *hostProfiler) Conv2dBackwardData(p kernels.ConvParams, dy, w, dx kernels.Buf) {
	defer h.op("Conv2dBackwardData", dy)()
	h.b.Conv2dBackwardData(p, dy, w, dx)
}

func (h *hostProfiler) Conv2dBackwardFilter(p kernels.ConvParams, x, dy, dw kernels.Buf) {
	defer h.op("Conv2dBackwardFilter", dy)()
	h.b.Conv2dBackwardFilter(p, x, dy, dw)
}

func (h *hostProfiler) BatchNormTrain(p kernels.BNParams, x, residual, gamma, beta, y, runMean, runVar, saveMean, saveInvStd kernels.Buf) {
	defer h.op("BatchNormTrain", x)()
	h.b.BatchNormTrain(p, x, residual, gamma, beta, y, runMean, runVar, saveMean, saveInvStd)
}

func (h *hostProfiler) BatchNormApply(p kernels.BNParams, x, residual, gamma, beta, saveMean, saveInvStd, y kernels.Buf) {
	defer h.op("BatchNormApply", x)()
	h.b.BatchNormApply(p, x, residual, gamma, beta, saveMean, saveInvStd, y)
}

func (h *hostProfiler) BatchNormEval(p kernels.BNParams, x, residual, gamma, beta, runMean, runVar, y kernels.Buf) {
	defer h.op("BatchNormEval", x)()
	h.b.BatchNormEval(p, x, residual, gamma, beta, runMean, runVar, y)
}

func (h *hostProfiler) BatchNormBackward(p kernels.BNParams, x, y, residual, dy, gamma, beta, saveMean, saveInvStd, dx, dresidual, dgamma, dbeta kernels.Buf) {
	defer h.op("BatchNormBackward", dy)()
	h.b.BatchNormBackward(p, x, y, residual, dy, gamma, beta, saveMean, saveInvStd, dx, dresidual, dgamma, dbeta)
}

func (h *hostProfiler) MaxPool2d(p kernels.PoolParams, x, y kernels.Buf) {
	defer h.op("MaxPool2d", x)()
	h.b.MaxPool2d(p, x, y)
}

func (h *hostProfiler) MaxPool2dBackward(p kernels.PoolParams, x, dy, dx kernels.Buf) {
	defer h.op("MaxPool2dBackward", dy)()
	h.b.MaxPool2dBackward(p, x, dy, dx)
}

func (h *hostProfiler) AvgPool2d(p kernels.PoolParams, x, y kernels.Buf) {
	defer h.op("AvgPool2d", x)()
	h.b.AvgPool2d(p, x, y)
}

func (h *hostProfiler) AvgPool2dBackward(p kernels.PoolParams, dy, dx kernels.Buf) {
	defer h.op("AvgPool2dBackward", dy)()
	h.b.AvgPool2dBackward(p, dy, dx)
}

func (h *hostProfiler) CrossEntropy(logits, labels, lse, loss kernels.Buf, n, k int) {
	defer h.op("CrossEntropy", logits)()
	h.b.CrossEntropy(logits, labels, lse, loss, n, k)
}

func (h *hostProfiler) CrossEntropyBackward(logits, labels, lse, dloss, dlogits kernels.Buf, n, k int) {
	defer h.op("CrossEntropyBackward", logits)()
	h.b.CrossEntropyBackward(logits, labels, lse, dloss, dlogits, n, k)
}

func (h *hostProfiler) Uniform(dst kernels.Buf, lo, hi float32, g kernels.Philox) {
	defer h.op("Uniform", dst)()
	h.b.Uniform(dst, lo, hi, g)
}

func (h *hostProfiler) Normal(dst kernels.Buf, mean, std float32, g kernels.Philox) {
	defer h.op("Normal", dst)()
	h.b.Normal(dst, mean, std, g)
}

func (h *hostProfiler) Dropout(dst, x kernels.Buf, p float32, g kernels.Philox) {
	defer h.op("Dropout", x)()
	h.b.Dropout(dst, x, p, g)
}

func (h *hostProfiler) SGD(p kernels.SGDParams, params, grads, moms []kernels.Buf) {
	defer h.op("SGD", first(params))()
	h.b.SGD(p, params, grads, moms)
}

func (h *hostProfiler) AdamW(p kernels.AdamWParams, params, grads, m, v []kernels.Buf) {
	defer h.op("AdamW", first(params))()
	h.b.AdamW(p, params, grads, m, v)
}

func (h *hostProfiler) UnscaleClip(maxNorm float32, sumsq, scale, norm, mult, found kernels.Buf) {
	defer h.op("UnscaleClip", sumsq)()
	h.b.UnscaleClip(maxNorm, sumsq, scale, norm, mult, found)
}

func (h *hostProfiler) UnscaleCheck(grads []kernels.Buf, scale, found kernels.Buf) {
	defer h.op("UnscaleCheck", first(grads))()
	h.b.UnscaleCheck(grads, scale, found)
}

func (h *hostProfiler) UpdateScale(p kernels.ScalerParams, scale, tracker, found, skipped kernels.Buf) {
	defer h.op("UpdateScale", scale)()
	h.b.UpdateScale(p, scale, tracker, found, skipped)
}

func (h *hostProfiler) Increment(counter kernels.Buf, n int64, unless kernels.Buf) {
	defer h.op("Increment", counter)()
	h.b.Increment(counter, n, unless)
}

func (h *hostProfiler) CountCorrect(right, logits, labels kernels.Buf, n, k int) {
	defer h.op("CountCorrect", logits)()
	h.b.CountCorrect(right, logits, labels, n, k)
}

func (h *hostProfiler) AccumulateMetrics(sums, loss, right kernels.Buf, n int) {
	defer h.op("AccumulateMetrics", sums)()
	h.b.AccumulateMetrics(sums, loss, right, n)
}

func (h *hostProfiler) Embedding(y, table, ids kernels.Buf, n, vocab, dim int) {
	defer h.op("Embedding", table)()
	h.b.Embedding(y, table, ids, n, vocab, dim)
}

func (h *hostProfiler) EmbeddingBackward(dtable, dy, ids kernels.Buf, n, vocab, dim int, accumulate bool) {
	defer h.op("EmbeddingBackward", dy)()
	h.b.EmbeddingBackward(dtable, dy, ids, n, vocab, dim, accumulate)
}

func (h *hostProfiler) LayerNorm(p kernels.LayerNormParams, x, gamma, beta, y, mean, rstd kernels.Buf) {
	defer h.op("LayerNorm", x)()
	h.b.LayerNorm(p, x, gamma, beta, y, mean, rstd)
}

func (h *hostProfiler) LayerNormBackward(p kernels.LayerNormParams, x, gamma, mean, rstd, dy, dx, dgamma, dbeta kernels.Buf) {
	defer h.op("LayerNormBackward", dy)()
	h.b.LayerNormBackward(p, x, gamma, mean, rstd, dy, dx, dgamma, dbeta)
}

func (h *hostProfiler) Attention(p kernels.AttentionParams, q, k, v, o, lse kernels.Buf) {
	defer h.op("Attention", q)()
	h.b.Attention(p, q, k, v, o, lse)
}

func (h *hostProfiler) AttentionBackward(p kernels.AttentionParams, q, k, v, o, lse, do, dq, dk, dv kernels.Buf) {
	defer h.op("AttentionBackward", q)()
	h.b.AttentionBackward(p, q, k, v, o, lse, do, dq, dk, dv)
}

func (h *hostProfiler) ClassifierLoss(p kernels.ClassifierParams, hb, w, labels, loss, right, dh, dw kernels.Buf) {
	defer h.op("ClassifierLoss", hb)()
	h.b.ClassifierLoss(p, hb, w, labels, loss, right, dh, dw)
}

func (h *hostProfiler) SumSquares(grads []kernels.Buf, sumsq kernels.Buf) {
	defer h.op("SumSquares", first(grads))()
	h.b.SumSquares(grads, sumsq)
}

func (h *hostProfiler) ClipGradNorm(grads []kernels.Buf, maxNorm float32, sumsq, norm kernels.Buf) {
	defer h.op("ClipGradNorm", first(grads))()
	h.b.ClipGradNorm(grads, maxNorm, sumsq, norm)
}
