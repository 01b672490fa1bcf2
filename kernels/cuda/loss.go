package cuda

import "github.com/leangrad/leangrad/kernels"

// The losses and metrics (kernels.LossOps; loss.cu): cross-entropy in one
// block, and the fused classifier, whose products run on cuBLAS a chunk of
// rows at a time (as attention's, transformer.go) around loss.cu's kernels
// over each chunk's logits.

type ceFwdArgs struct {
	N, K                   int32
	Logits, Labels, Lse, L uintptr
}

type ceBwdArgs struct {
	N, K                                int32
	Logits, Labels, Lse, Dloss, Dlogits uintptr
}

type countCorrectArgs struct {
	N, K                  int32
	Logits, Labels, Right uintptr
}

type metricsArgs struct {
	N                 int32
	Loss, Right, Sums uintptr
}

var (
	kCEFwd        = declareTyped[ceFwdArgs]("ce_fwd")
	kCEBwd        = declareTyped[ceBwdArgs]("ce_bwd")
	kCountCorrect = declareTyped[countCorrectArgs]("count_correct")
	kMetrics      = declareKernel[metricsArgs]("metrics")
)

// CrossEntropy computes the mean loss in one single-block launch. Labels
// outside [0, k) make the loss NaN.
func (b *Backend) CrossEntropy(logits, labels, lse, loss kernels.Buf, n, k int) {
	kernels.CheckCrossEntropy("cross entropy", logits, labels, lse, n, k)
	kernels.CheckLen("cross entropy loss", 1, loss)
	kernels.CheckF32("cross entropy", loss)
	s := floatType("cross entropy", logits)
	b.enter()
	defer b.exit()
	kCEFwd.launch(b, s, dims{1, 1, 512}, ceFwdArgs{int32(n), int32(k), ptrOf(logits), ptrOf(labels), ptrOf(lse), ptrOf(loss)})
}

// CrossEntropyBackward computes dlogits.
func (b *Backend) CrossEntropyBackward(logits, labels, lse, dloss, dlogits kernels.Buf, n, k int) {
	kernels.CheckCrossEntropy("cross entropy backward", logits, labels, lse, n, k)
	kernels.CheckLen("cross entropy backward", n*k, dlogits)
	kernels.CheckLen("cross entropy backward dloss", 1, dloss)
	kernels.CheckF32("cross entropy backward", dloss)
	s := floatType("cross entropy backward", logits, dlogits)
	b.enter()
	defer b.exit()
	kCEBwd.launch(b, s, b.elems(int64(n*k)),
		ceBwdArgs{int32(n), int32(k), ptrOf(logits), ptrOf(labels), ptrOf(lse), ptrOf(dloss), ptrOf(dlogits)})
}

// CountCorrect counts the rows whose first maximum is at the label, in one
// single-block launch.
func (b *Backend) CountCorrect(right, logits, labels kernels.Buf, n, k int) {
	kernels.CheckCountCorrect(right, logits, labels, n, k)
	s := floatType("count correct", logits)
	b.enter()
	defer b.exit()
	kCountCorrect.launch(b, s, dims{1, 1, blockSize}, countCorrectArgs{int32(n), int32(k), ptrOf(logits), ptrOf(labels), ptrOf(right)})
}

// AccumulateMetrics adds the batch's loss, right predictions and their
// number to sums, in one thread.
func (b *Backend) AccumulateMetrics(sums, loss, right kernels.Buf, n int) {
	kernels.CheckMetrics(sums, loss, right, n)
	b.enter()
	defer b.exit()
	kMetrics.launch(b, 0, dims{1, 1, 1}, metricsArgs{int32(n), ptrOf(loss), ptrOf(right), ptrOf(sums)})
}

type clsRowsArgs struct {
	V, Ld, R0                    int32
	Z, Labels, RowLoss, RowRight uintptr
	Grad                         int32
	Dz                           uintptr
	Scale                        uintptr // kernels.ClassifierParams.GradScale, or 0
	Inv                          float32 // 1/N, which the rows take with a scale
}

type clsFinishArgs struct {
	N                           int32
	RowLoss, RowRight, Loss, Rt uintptr
}

var (
	kClsRows      = declareTyped[clsRowsArgs]("cls_rows")
	kClsRowsStash = declareTyped[clsRowsArgs]("cls_rows_stash")
	kClsFinish    = declareKernel[clsFinishArgs]("cls_finish")
)

// ClassifierLoss: per chunk of rows, the logits (cuBLAS, in the operands'
// dtype), each row's loss, right prediction and softmax − one-hot (written
// over the logits), then dh = softmax·w/N and dw += softmaxᵀ·h/N; the mean
// loss and the right count summed at the end in one block. cuBLAS's tensor-core kernels want
// aligned shapes, and GPT-2's vocabulary of 50,257 is odd (its products
// run 6× slower than 50,240's on the H200): each product is split into the
// vocabulary's first multiple of 64 tokens and the few left, the chunks'
// rows are a multiple of 64 and padded to a multiple of 16 values.
func (b *Backend) ClassifierLoss(p kernels.ClassifierParams, h, w, labels, loss, right, dh, dw kernels.Buf) {
	kernels.CheckClassifier(p, h, w, labels, loss, right, dh, dw)
	s := floatType("classifier loss", h, w)
	b.enter()
	defer b.exit()
	es := int64(h.DType.Size())
	ld := (p.V + 15) &^ 15
	// The logits in h's dtype, their gradient written over them. Twice the
	// chunk budget: each chunk's weight-gradient product reads and writes
	// all of dw (F32, V×C), so fewer chunks move less.
	m := clsChunkRows(p.N, 2*b.chunkBudget/(ld*int(es)))
	z := b.workspace(int64(m*ld) * es)
	defer b.alloc.Free(z)
	rows := b.workspace(int64(p.N) * 8)
	defer b.alloc.Free(rows)
	rowLoss, rowRight := rows.Addr(), rows.Addr()+uintptr(p.N*4)
	// The products scale the logits' gradient by 1/N, or with a gradient
	// scale, which the host does not know, the rows kernel does, by
	// scale/N, before rounding it (cls_scale).
	inv, alpha := 1/float32(p.N), 1/float32(p.N)
	if p.GradScale.Valid() {
		alpha = 1
	}
	type part struct{ lo, n int } // a stretch of the vocabulary
	parts := []part{{0, p.V &^ 63}, {p.V &^ 63, p.V % 64}}
	wAt := func(t int) uintptr { return ptrOf(w) + uintptr(int64(t*p.C)*es) }
	stash := b.clsStash(p, int(es))
	for r0 := 0; r0 < p.N; r0 += m {
		n := min(m, p.N-r0)
		hc := ptrOf(h) + uintptr(int64(r0*p.C)*es)
		for _, v := range parts {
			if v.n > 0 {
				b.gemm(gemmCall{transB: true, m: n, n: v.n, k: p.C, alpha: 1, a: hc, b: wAt(v.lo), c: z.Addr() + uintptr(int64(v.lo)*es),
					batch: 1, ab: h.DType, cType: h.DType, ldc: ld})
			}
		}
		args := clsRowsArgs{int32(p.V), int32(ld), int32(r0), z.Addr(), ptrOf(labels), rowLoss, rowRight, boolInt(p.Grad), z.Addr(),
			ptrOf(p.GradScale), inv}
		if stash > 0 {
			kClsRowsStash.launchShared(b, s, dims{uint32(n), 1, clsThreads}, stash, args)
		} else {
			kClsRows.launch(b, s, dims{uint32(n), 1, clsThreads}, args)
		}
		if !p.Grad {
			continue
		}
		beta := float32(1) // dw accumulates over the chunks
		if r0 == 0 {
			beta = 0
		}
		dhBeta := float32(0) // dh sums the stretches
		for _, v := range parts {
			if v.n == 0 {
				continue
			}
			dzv := z.Addr() + uintptr(int64(v.lo)*es)
			b.gemm(gemmCall{m: n, n: p.C, k: v.n, alpha: alpha, beta: dhBeta, a: dzv, b: wAt(v.lo), c: ptrOf(dh) + uintptr(r0*p.C*4),
				batch: 1, ab: h.DType, cType: kernels.F32, lda: ld})
			b.gemm(gemmCall{transA: true, m: v.n, n: p.C, k: n, alpha: alpha, beta: beta, a: dzv, b: hc, c: ptrOf(dw) + uintptr(v.lo*p.C*4),
				batch: 1, ab: h.DType, cType: kernels.F32, lda: ld})
			dhBeta = 1
		}
	}
	kClsFinish.launch(b, 0, dims{1, 1, 1024}, clsFinishArgs{int32(p.N), rowLoss, rowRight, ptrOf(loss), ptrOf(right)})
}

// clsChunkRows is how many of n rows each chunk of the classifier takes,
// at most most: as few chunks as that allows, of rows as even as multiples
// of 64 let them be (where a chunk is not all the rows), so that no chunk's
// products are left with a sliver of rows (GPT-2 small at batch 16: 4096
// rows four times rather than 5312 three times and 448).
func clsChunkRows(n, most int) int {
	m := max(1, min(n, most))
	if m == n || m <= 64 {
		return m
	}
	m &^= 63
	chunks := (n + m - 1) / m
	return min(m, ((n+chunks-1)/chunks+63)&^63)
}

// clsThreads is the threads of a block of the classifier's rows.
const clsThreads = 1024

// clsStash is the shared memory a block of cls_rows_stash keeps a row's
// 16-byte groups of logits (es bytes each) in, or 0 where cls_rows reads
// the logits twice instead: for the loss alone (one pass), or where two
// blocks a multiprocessor could not keep their rows (the stash pays for
// itself by the rows in flight it keeps in the L2 cache's stead).
// ClassifierLoss's chunks' rows are 16-byte aligned, their ld a multiple
// of 16 values.
func (b *Backend) clsStash(p kernels.ClassifierParams, es int) int {
	bytes := p.V / (16 / es) * 16
	if !p.Grad || 2*(bytes+2<<10) > b.sharedPerSM || bytes > b.sharedPerBlock {
		return 0
	}
	return bytes
}
