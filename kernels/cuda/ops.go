package cuda

import (
	"fmt"
	"github.com/leangrad/leangrad/kernels"
	"github.com/x448/float16"
	"math"
)

// floatType returns the dtype of buffers that must share a float dtype: the
// instantiation of a typed kernel that runs on them.
func floatType(op string, bufs ...kernels.Buf) kernels.DType {
	dt := bufs[0].DType
	for _, b := range bufs {
		if b.Block != nil && b.DType != dt {
			panic(fmt.Sprintf("cuda: %s of mixed dtypes %v and %v", op, dt, b.DType))
		}
	}
	if _, ok := cTypeNames[dt]; !ok {
		panic(fmt.Sprintf("cuda: %s of %v data", op, dt))
	}
	return dt
}

// The elementwise kernels (elementwise.cu).
type (
	castArgs struct {
		N    int64
		X, Y uintptr
	}
	unaryArgs struct {
		Op   int32
		N    int64
		X, Y uintptr
	}
	unaryBwdArgs struct {
		Op           int32
		N            int64
		Dy, X, Y, Dx uintptr
	}
	affineArgs struct {
		N           int64
		X, Y        uintptr
		Alpha, Beta float32
	}
	binaryArgs struct {
		Op      int32
		N       int64
		Bc      bcast
		A, B, Y uintptr
	}
	binaryMixedArgs struct { // binary_mixed: A and Y F32, B of the instantiation's type
		Op, Swap int32
		N        int64
		Bc       bcast
		A, B, Y  uintptr
	}
)

var (
	kUnary      = declareTyped[unaryArgs]("unary")
	kUnaryBwd   = declareTyped[unaryBwdArgs]("unary_bwd")
	kAffine     = declareTyped[affineArgs]("affine")
	kBinary     = declareTyped[binaryArgs]("binary")
	kBinaryMix  = declareTyped[binaryMixedArgs]("binary_mixed")
	castKernels = map[[2]kernels.DType]kernel[castArgs]{}
)

func init() {
	for _, c := range [][2]kernels.DType{{kernels.F32, kernels.F16}, {kernels.F16, kernels.F32}, {kernels.I32, kernels.F32},
		{kernels.F32, kernels.I32}, {kernels.I32, kernels.F16}, {kernels.F16, kernels.I32},
		{kernels.F32, kernels.BF16}, {kernels.BF16, kernels.F32}, {kernels.I32, kernels.BF16}, {kernels.BF16, kernels.I32}} {
		castKernels[c] = declareKernel[castArgs]("cast_" + c[0].String() + "_" + c[1].String())
	}
}

// Fill sets every element with a memset of its bit pattern.
func (b *Backend) Fill(dst kernels.Buf, v float32) {
	b.enter()
	defer b.exit()
	if dst.N == 0 {
		return
	}
	p, n := ptrOf(dst), uintptr(dst.N)
	b.queued("memset")
	switch dst.DType {
	case kernels.F32:
		b.d.must("cuMemsetD32Async", b.d.memsetD32Async(p, math.Float32bits(v), n, b.stream))
	case kernels.I32:
		b.d.must("cuMemsetD32Async", b.d.memsetD32Async(p, uint32(int32(v)), n, b.stream))
	case kernels.F16:
		b.d.must("cuMemsetD16Async", b.d.memsetD16Async(p, float16.Fromfloat32(v).Bits(), n, b.stream))
	case kernels.BF16:
		b.d.must("cuMemsetD16Async", b.d.memsetD16Async(p, bf16Bits(v), n, b.stream))
	}
}

// Cast converts between F32, F16 and I32.
func (b *Backend) Cast(dst, src kernels.Buf) {
	kernels.CheckLen("cast", src.N, dst)
	if dst.DType == src.DType {
		b.Copy(dst, src)
		return
	}
	b.enter()
	defer b.exit()
	b.cast(dst, src)
}

// cast queues Cast's kernel (the caller holds the lock; the dtypes differ).
func (b *Backend) cast(dst, src kernels.Buf) {
	k, ok := castKernels[[2]kernels.DType{src.DType, dst.DType}]
	if !ok {
		panic(fmt.Sprintf("cuda: cast of %v to %v", src.DType, dst.DType))
	}
	k.launch(b, 0, b.elems(int64(src.N)), castArgs{int64(src.N), ptrOf(src), ptrOf(dst)})
}

// Unary computes dst = op(x).
func (b *Backend) Unary(op kernels.UnaryOp, dst, x kernels.Buf) {
	kernels.CheckLen("unary "+op.String(), x.N, dst)
	s := floatType("unary "+op.String(), dst, x)
	b.enter()
	defer b.exit()
	kUnary.launch(b, s, b.elems(int64(x.N)), unaryArgs{int32(op), int64(x.N), ptrOf(x), ptrOf(dst)})
}

// UnaryBackward computes dx = dy·op'(x or y).
func (b *Backend) UnaryBackward(op kernels.UnaryOp, dx, dy, x, y kernels.Buf) {
	kernels.CheckLen("unary backward "+op.String(), dy.N, dx)
	s := floatType("unary backward "+op.String(), dx, dy, x, y)
	if x.Valid() {
		kernels.CheckLen("unary backward x", dy.N, x)
	}
	if y.Valid() {
		kernels.CheckLen("unary backward y", dy.N, y)
	}
	b.enter()
	defer b.exit()
	kUnaryBwd.launch(b, s, b.elems(int64(dy.N)), unaryBwdArgs{int32(op), int64(dy.N), ptrOf(dy), ptrOf(x), ptrOf(y), ptrOf(dx)})
}

// Affine computes dst = alpha·x + beta.
func (b *Backend) Affine(dst, x kernels.Buf, alpha, beta float32) {
	kernels.CheckLen("affine", x.N, dst)
	s := floatType("affine", dst, x)
	b.enter()
	defer b.exit()
	kAffine.launch(b, s, b.elems(int64(x.N)), affineArgs{int64(x.N), ptrOf(x), ptrOf(dst), alpha, beta})
}

// bcast is the kernels' struct Bcast (kernels.Broadcast in 32 bits).
type bcast struct {
	ndim          int32
	shape, sa, sb [kernels.MaxDims]int32
}

// Binary computes dst = a op b with broadcasting; a, b and dst share a
// dtype, or dst is F32 and so is one of a and b (binary_mixed reads the
// other as stored).
func (b *Backend) Binary(op kernels.BinaryOp, dst, a, bb kernels.Buf, bc kernels.Broadcast) {
	n := bc.Len()
	kernels.CheckLen("binary "+op.String(), n, dst)
	if n > math.MaxInt32 {
		panic(fmt.Sprintf("cuda: binary of %d elements", n))
	}
	var c bcast
	c.ndim = int32(bc.NDim)
	for i := 0; i < bc.NDim; i++ {
		c.shape[i], c.sa[i], c.sb[i] = int32(bc.Shape[i]), int32(bc.StrideA[i]), int32(bc.StrideB[i])
	}
	if dst.DType == kernels.F32 && a.DType != bb.DType && (a.DType == kernels.F32 || bb.DType == kernels.F32) {
		swap, f32, other := int32(0), a, bb
		if a.DType != kernels.F32 {
			swap, f32, other = 1, bb, a
			c.sa, c.sb = c.sb, c.sa
		}
		s := floatType("binary "+op.String(), other)
		b.enter()
		defer b.exit()
		kBinaryMix.launch(b, s, b.elems(int64(n)), binaryMixedArgs{int32(op), swap, int64(n), c, ptrOf(f32), ptrOf(other), ptrOf(dst)})
		return
	}
	s := floatType("binary "+op.String(), dst, a, bb)
	b.enter()
	defer b.exit()
	kBinary.launch(b, s, b.elems(int64(n)), binaryArgs{int32(op), int64(n), c, ptrOf(a), ptrOf(bb), ptrOf(dst)})
}

// The reductions (reduce.cu).
type (
	reduceRowsArgs struct {
		Op, Outer, Len int32
		X, Y           uintptr
	}
	reduceColsArgs struct {
		Op, Outer, Len, Inner int32
		X, Y                  uintptr
	}
	reduceColsSplitArgs struct {
		Op, Outer, Len, Inner, Splits int32
		OutF32                        int32 // Y is F32 whatever X's dtype
		X, Part, Done, Y              uintptr
	}
	reduceMaxBwdArgs struct {
		Len, Inner   int32
		N            int64
		Dy, X, Y, Dx uintptr
	}
	argmaxArgs struct {
		Outer, Len, Inner int32
		X, Y              uintptr
	}
)

var (
	kReduceRows   = declareTyped[reduceRowsArgs]("reduce_rows")
	kReduceCols   = declareTyped[reduceColsArgs]("reduce_cols")
	kReduceColsS  = declareTyped[reduceColsSplitArgs]("reduce_cols_split")
	kReduceColsS4 = declareTyped[reduceColsSplitArgs]("reduce_cols_split4")
	kReduceMaxBwd = declareTyped[reduceMaxBwdArgs]("reduce_max_bwd")
	kArgmax       = declareTyped[argmaxArgs]("argmax")
)

// Reduce reduces along the middle axis: a block per row when the axis is
// innermost, a thread per output when there are outputs enough to fill the
// device, and otherwise the axis split into stretches that blocks reduce
// to partials, the last block of each tile of outputs combining them in
// order (reduce_cols_split).
func (b *Backend) Reduce(op kernels.ReduceOp, dst, x kernels.Buf, r kernels.Reduction) {
	kernels.CheckReduction("reduce "+op.String(), r, x, dst)
	floatType("reduce "+op.String(), dst, x)
	b.enter()
	defer b.exit()
	b.reduce(op, dst, x, r)
}

// reduce is Reduce for a checked call (the caller holds the lock), dst of
// x's dtype or, where x is 16-bit, F32: the split columns write it
// directly, the other paths through a scratch of x's dtype and a cast.
func (b *Backend) reduce(op kernels.ReduceOp, dst, x kernels.Buf, r kernels.Reduction) {
	s := x.DType
	outputs := r.Outer * r.Inner
	fill := b.sms * 2048 // threads the device runs at once
	splits := min((r.Len+63)/64, fill/(8*outputs))
	if r.Inner > 1 && splits >= 2 {
		// Four columns a lane where the rows allow, the axis in up to four
		// times as many stretches, so that as many blocks fill the device,
		// but each of at least 512 rows: more, shorter stretches wait
		// longer than they read (on the H200, 16384 bf16 rows of 768, 2304
		// and 3072 columns took 24.2, 34.7 and 39.9 µs in 176, 56 and 44
		// stretches, 20.4, 33.2 and 38.5 in 32; scripts/reduce-bench.py,
		// 2026-12-02).
		k, vec := kReduceColsS, 1
		if r.Inner%4 == 0 && ptrOf(x)%uintptr(4*x.DType.Size()) == 0 {
			k, vec = kReduceColsS4, 4
			splits = max(1, min((r.Len+511)/512, 4*splits))
		}
		tiles := (r.Inner + 32*vec - 1) / (32 * vec)
		if tiles*r.Outer > b.reduceDone.n {
			panic(fmt.Sprintf("cuda: reduce of %+v: %d tiles of outputs, %d counters", r, tiles*r.Outer, b.reduceDone.n))
		}
		part := b.workspace(int64(splits*outputs) * 4)
		defer b.alloc.Free(part)
		outF32 := int32(0)
		if dst.DType != s {
			outF32 = 1
		}
		k.launch(b, s, dims{uint32(tiles * splits), uint32(r.Outer), 32 * 8},
			reduceColsSplitArgs{int32(op), int32(r.Outer), int32(r.Len), int32(r.Inner), int32(splits), outF32,
				ptrOf(x), part.Addr(), b.reduceDone.addr, ptrOf(dst)})
		return
	}
	if dst.DType != s {
		blk := b.workspace(int64(dst.N * s.Size()))
		defer b.alloc.Free(blk)
		scratch := kernels.Buf{Block: blk, N: dst.N, DType: s}
		b.reduce(op, scratch, x, r)
		b.cast(dst, scratch)
		return
	}
	if r.Inner == 1 {
		threads := min(blockSize, (r.Len+31)/32*32)
		kReduceRows.launch(b, s, dims{uint32(min(r.Outer, 1<<16)), 1, uint32(threads)},
			reduceRowsArgs{int32(op), int32(r.Outer), int32(r.Len), ptrOf(x), ptrOf(dst)})
		return
	}
	kReduceCols.launch(b, s, b.elems(int64(outputs)),
		reduceColsArgs{int32(op), int32(r.Outer), int32(r.Len), int32(r.Inner), ptrOf(x), ptrOf(dst)})
}

// ReduceMaxBackward routes dy to the elements equal to their maximum.
func (b *Backend) ReduceMaxBackward(dx, dy, x, y kernels.Buf, r kernels.Reduction) {
	kernels.CheckReduction("reduce max backward", r, x, dy)
	kernels.CheckLen("reduce max backward", x.N, dx)
	kernels.CheckLen("reduce max backward", dy.N, y)
	s := floatType("reduce max backward", dx, dy, x, y)
	b.enter()
	defer b.exit()
	kReduceMaxBwd.launch(b, s, b.elems(int64(x.N)),
		reduceMaxBwdArgs{int32(r.Len), int32(r.Inner), int64(x.N), ptrOf(dy), ptrOf(x), ptrOf(y), ptrOf(dx)})
}

// ArgMax writes the index of the first maximum along the middle axis.
func (b *Backend) ArgMax(dst, x kernels.Buf, r kernels.Reduction) {
	kernels.CheckReduction("argmax", r, x, dst)
	if dst.DType != kernels.I32 {
		panic("cuda: argmax into a " + dst.DType.String() + " buffer")
	}
	s := floatType("argmax", x)
	b.enter()
	defer b.exit()
	kArgmax.launch(b, s, b.elems(int64(r.Outer*r.Inner)), argmaxArgs{int32(r.Outer), int32(r.Len), int32(r.Inner), ptrOf(x), ptrOf(dst)})
}

// poolArgs is the kernels' struct Pool.
type poolArgs struct{ N, C, H, W, KH, KW, SH, SW, PH, PW, OH, OW int32 }

// The pooling kernels (pool.cu).
type (
	poolFwdArgs struct {
		P    poolArgs
		X, Y uintptr
	}
	maxPoolBwdArgs struct {
		P         poolArgs
		X, Dy, Dx uintptr
	}
	avgPoolBwdArgs struct {
		P      poolArgs
		Dy, Dx uintptr
	}
)

var (
	kMaxPool    = declareTyped[poolFwdArgs]("maxpool")
	kMaxPoolBwd = declareTyped[maxPoolBwdArgs]("maxpool_bwd")
	kAvgPool    = declareTyped[poolFwdArgs]("avgpool")
	kAvgPoolBwd = declareTyped[avgPoolBwdArgs]("avgpool_bwd")
)

func toPool(p kernels.PoolParams) poolArgs {
	return poolArgs{int32(p.N), int32(p.C), int32(p.H), int32(p.W), int32(p.KH), int32(p.KW),
		int32(p.SH), int32(p.SW), int32(p.PH), int32(p.PW), int32(p.OutH()), int32(p.OutW())}
}

// MaxPool2d takes the maximum of each window.
func (b *Backend) MaxPool2d(p kernels.PoolParams, x, y kernels.Buf) {
	kernels.CheckPool("max pool", p, x, y)
	s := floatType("max pool", x, y)
	b.enter()
	defer b.exit()
	kMaxPool.launch(b, s, b.elems(int64(y.N)), poolFwdArgs{toPool(p), ptrOf(x), ptrOf(y)})
}

// MaxPool2dBackward routes dy to each window's first maximum (a gather per input).
func (b *Backend) MaxPool2dBackward(p kernels.PoolParams, x, dy, dx kernels.Buf) {
	kernels.CheckPool("max pool backward", p, x, dy)
	kernels.CheckLen("max pool backward", x.N, dx)
	s := floatType("max pool backward", x, dy, dx)
	b.enter()
	defer b.exit()
	kMaxPoolBwd.launch(b, s, b.elems(int64(x.N)), maxPoolBwdArgs{toPool(p), ptrOf(x), ptrOf(dy), ptrOf(dx)})
}

// AvgPool2d averages each window.
func (b *Backend) AvgPool2d(p kernels.PoolParams, x, y kernels.Buf) {
	kernels.CheckPool("avg pool", p, x, y)
	s := floatType("avg pool", x, y)
	b.enter()
	defer b.exit()
	kAvgPool.launch(b, s, b.elems(int64(y.N)), poolFwdArgs{toPool(p), ptrOf(x), ptrOf(y)})
}

// AvgPool2dBackward spreads dy over the windows.
func (b *Backend) AvgPool2dBackward(p kernels.PoolParams, dy, dx kernels.Buf) {
	kernels.CheckPool("avg pool backward", p, dx, dy)
	s := floatType("avg pool backward", dy, dx)
	b.enter()
	defer b.exit()
	kAvgPoolBwd.launch(b, s, b.elems(int64(dx.N)), avgPoolBwdArgs{toPool(p), ptrOf(dy), ptrOf(dx)})
}

// The loss kernels (loss.cu).
type (
	ceFwdArgs struct {
		N, K                   int32
		Logits, Labels, Lse, L uintptr
	}
	ceBwdArgs struct {
		N, K                                int32
		Logits, Labels, Lse, Dloss, Dlogits uintptr
	}
	countCorrectArgs struct {
		N, K                  int32
		Logits, Labels, Right uintptr
	}
	metricsArgs struct {
		N                 int32
		Loss, Right, Sums uintptr
	}
)

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

// The random kernels (random.cu).
type (
	randArgs struct {
		N            int64
		Seed, Offset uint64
		Base         uintptr
		A, B         float32 // lo and hi, or mean and std
		Y            uintptr
	}
	dropoutArgs struct {
		N            int64
		Seed, Offset uint64
		Base         uintptr
		P            float32
		X, Y         uintptr
	}
)

var (
	kUniform = declareTyped[randArgs]("uniform")
	kNormal  = declareTyped[randArgs]("normal")
	kDropout = declareTyped[dropoutArgs]("dropout")
)

// Uniform fills dst from the Philox state g.
func (b *Backend) Uniform(dst kernels.Buf, lo, hi float32, g kernels.Philox) {
	s := floatType("uniform", dst)
	b.enter()
	defer b.exit()
	kUniform.launch(b, s, b.elems(int64(dst.N+3)/4), randArgs{int64(dst.N), g.Seed, g.Offset, basePtr(g), lo, hi, ptrOf(dst)})
}

// Normal fills dst from the Philox state g.
func (b *Backend) Normal(dst kernels.Buf, mean, std float32, g kernels.Philox) {
	s := floatType("normal", dst)
	b.enter()
	defer b.exit()
	kNormal.launch(b, s, b.elems(int64(dst.N+3)/4), randArgs{int64(dst.N), g.Seed, g.Offset, basePtr(g), mean, std, ptrOf(dst)})
}

// Dropout applies the mask drawn from g.
func (b *Backend) Dropout(dst, x kernels.Buf, p float32, g kernels.Philox) {
	if p < 0 || p >= 1 {
		panic(fmt.Sprintf("cuda: dropout probability %v outside [0, 1)", p))
	}
	kernels.CheckLen("dropout", x.N, dst)
	s := floatType("dropout", dst, x)
	b.enter()
	defer b.exit()
	kDropout.launch(b, s, b.elems(int64(x.N+3)/4), dropoutArgs{int64(x.N), g.Seed, g.Offset, basePtr(g), p, ptrOf(x), ptrOf(dst)})
}

// basePtr is the device address of g's Base counter, or 0.
func basePtr(g kernels.Philox) uintptr {
	if !g.Base.Valid() {
		return 0
	}
	kernels.CheckCounter("philox base", g.Base)
	return ptrOf(g.Base)
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

// tensorList is the kernels' struct TensorList: up to mtMax tensors of up
// to four lists (parameters, gradients, moments), their lengths, and how
// many there are.
type tensorList struct {
	n     [mtMax]int64
	p     [4][mtMax]uintptr `c:"float*"`
	count int32
}

const mtMax = 32

// The multi-tensor kernels (optim.cu).
type (
	listArgs     struct{ L tensorList } // copy_multi, cast_multi_*, accumulate_multi_*
	sgdMultiArgs struct {
		L                       tensorList
		LR                      uintptr
		Momentum, Dampening, WD float32
		Nesterov, First         int32
		Skip                    uintptr
	}
	adamwMultiArgs struct {
		L                     tensorList
		LR                    uintptr
		Beta1, Beta2, Eps, WD float32
		Step, Skip, GradScale uintptr
	}
	unscaleMultiArgs struct {
		L            tensorList
		Scale, Found uintptr
	}
	updateScaleArgs struct {
		Scale, Tracker, Found, Skipped uintptr
		Growth, Backoff                float32
		Interval                       int32
	}
	incrementArgs struct {
		Counter uintptr
		N       int64
		Unless  uintptr
	}
)

var (
	kCopyMulti    = declareKernel[listArgs]("copy_multi")
	kSGDMulti     = declareKernel[sgdMultiArgs]("sgd_multi")
	kAdamWMulti   = declareKernel[adamwMultiArgs]("adamw_multi")
	kUnscaleMulti = declareKernel[unscaleMultiArgs]("unscale_multi")
	kUpdateScale  = declareKernel[updateScaleArgs]("update_scale")
	kIncrement    = declareKernel[incrementArgs]("increment")

	// castMultiKernels by (from, to); accumulateMultiKernels by from.
	castMultiKernels       = map[[2]kernels.DType]kernel[listArgs]{}
	accumulateMultiKernels = map[kernels.DType]kernel[listArgs]{}
)

func init() {
	for _, h := range []kernels.DType{kernels.F16, kernels.BF16} {
		castMultiKernels[[2]kernels.DType{kernels.F32, h}] = declareKernel[listArgs]("cast_multi_f32_" + h.String())
		castMultiKernels[[2]kernels.DType{h, kernels.F32}] = declareKernel[listArgs]("cast_multi_" + h.String() + "_f32")
		accumulateMultiKernels[h] = declareKernel[listArgs]("accumulate_multi_" + h.String())
	}
}

// multiTensor launches the lists, pairwise of the same lengths (their
// dtypes checked by the caller), in groups of mtMax tensors: launch is
// called with each group's list and dims.
func (b *Backend) multiTensor(name string, lists [][]kernels.Buf, launch func(l tensorList, d dims)) {
	for i := range lists[0] {
		for _, l := range lists {
			if l[i].N != lists[0][i].N {
				panic(fmt.Sprintf("cuda: %s: tensor %d: %d elements, want %d", name, i, l[i].N, lists[0][i].N))
			}
		}
	}
	b.enter()
	defer b.exit()
	for lo := 0; lo < len(lists[0]); lo += mtMax {
		hi := min(lo+mtMax, len(lists[0]))
		var tl tensorList
		var most int64
		for i := lo; i < hi; i++ {
			tl.n[i-lo] = int64(lists[0][i].N)
			most = max(most, tl.n[i-lo])
			for j, l := range lists {
				tl.p[j][i-lo] = ptrOf(l[i])
			}
		}
		tl.count = int32(hi - lo)
		launch(tl, b.multiDims(most, hi-lo))
	}
}

// multiDims is a multi-tensor launch's grid for tensors of up to most
// elements: a row of blocks per tensor, as many as fill the device for
// the largest (a token embedding holds a third of GPT-2's parameters);
// the blocks past a smaller tensor's end return at once.
func (b *Backend) multiDims(most int64, tensors int) dims {
	return dims{min(b.blocks(most, blockSize), uint32(4*b.sms)), uint32(tensors), blockSize}
}

// CopyMany copies each src[i] into dst[i], one launch per 32 tensors (a
// graph's memcpy nodes cost a launch each).
func (b *Backend) CopyMany(dst, src []kernels.Buf) {
	kernels.CheckLists("copy many", dst, src)
	if len(dst) == 0 {
		return
	}
	b.multiTensor("copy many", [][]kernels.Buf{dst, src}, func(l tensorList, d dims) { kCopyMulti.launch(b, 0, d, listArgs{l}) })
}

// CastMany converts each src[i] into dst[i], one launch per 32 tensors.
func (b *Backend) CastMany(dst, src []kernels.Buf) {
	from, to := kernels.CheckCastLists("cast many", dst, src)
	if len(dst) == 0 {
		return
	}
	k := castMultiKernels[[2]kernels.DType{from, to}]
	b.multiTensor("cast many", [][]kernels.Buf{dst, src}, func(l tensorList, d dims) { k.launch(b, 0, d, listArgs{l}) })
}

// AccumulateMany adds each src[i], converted, into dst[i], one launch per
// 32 tensors.
func (b *Backend) AccumulateMany(dst, src []kernels.Buf) {
	from := kernels.CheckAccumulateLists("accumulate many", dst, src)
	if len(dst) == 0 {
		return
	}
	k := accumulateMultiKernels[from]
	b.multiTensor("accumulate many", [][]kernels.Buf{dst, src}, func(l tensorList, d dims) { k.launch(b, 0, d, listArgs{l}) })
}

// SGD updates every parameter in one launch per 32 tensors.
func (b *Backend) SGD(hp kernels.SGDParams, params, grads, moms []kernels.Buf) {
	lists := [][]kernels.Buf{params, grads}
	if hp.Momentum != 0 {
		lists = append(lists, moms)
	}
	kernels.CheckLists("sgd", lists...)
	kernels.CheckLen("sgd learning rate", 1, hp.LR)
	kernels.CheckScalar("sgd", hp.LR, hp.Skip)
	lr, skip := ptrOf(hp.LR), ptrOf(hp.Skip)
	b.multiTensor("sgd", lists, func(l tensorList, d dims) {
		kSGDMulti.launch(b, 0, d, sgdMultiArgs{l, lr, hp.Momentum, hp.Dampening, hp.WeightDecay, boolInt(hp.Nesterov), boolInt(hp.FirstStep), skip})
	})
}

// AdamW updates every parameter in one launch per 32 tensors.
func (b *Backend) AdamW(hp kernels.AdamWParams, params, grads, m, v []kernels.Buf) {
	kernels.CheckLists("adamw", params, grads, m, v)
	kernels.CheckLen("adamw learning rate", 1, hp.LR)
	kernels.CheckScalar("adamw", hp.LR, hp.Skip, hp.GradScale)
	kernels.CheckCounter("adamw step", hp.Step)
	lr, step, skip, gs := ptrOf(hp.LR), ptrOf(hp.Step), ptrOf(hp.Skip), ptrOf(hp.GradScale)
	b.multiTensor("adamw", [][]kernels.Buf{params, grads, m, v}, func(l tensorList, d dims) {
		kAdamWMulti.launch(b, 0, d, adamwMultiArgs{l, lr, hp.Beta1, hp.Beta2, hp.Eps, hp.WeightDecay, step, skip, gs})
	})
}

// UnscaleCheck divides every grad by the device scale and raises found on
// inf/NaN, one launch per 32 tensors.
func (b *Backend) UnscaleCheck(grads []kernels.Buf, scale, found kernels.Buf) {
	kernels.CheckLen("unscale", 1, scale, found)
	kernels.CheckScalar("unscale", scale, found)
	kernels.CheckLists("unscale", grads)
	sp, fp := ptrOf(scale), ptrOf(found)
	b.multiTensor("unscale", [][]kernels.Buf{grads}, func(l tensorList, d dims) { kUnscaleMulti.launch(b, 0, d, unscaleMultiArgs{l, sp, fp}) })
}

// UpdateScale runs torch's _amp_update_scale_ in one thread.
func (b *Backend) UpdateScale(p kernels.ScalerParams, scale, tracker, found, skipped kernels.Buf) {
	kernels.CheckLen("update scale", 1, scale, tracker, found, skipped)
	kernels.CheckScalar("update scale", scale, found, skipped)
	b.enter()
	defer b.exit()
	kUpdateScale.launch(b, 0, dims{1, 1, 1}, updateScaleArgs{ptrOf(scale), ptrOf(tracker), ptrOf(found), ptrOf(skipped),
		p.Growth, p.Backoff, int32(p.Interval)})
}

// Increment adds n to a counter on the device unless the flag is set.
func (b *Backend) Increment(counter kernels.Buf, n int64, unless kernels.Buf) {
	kernels.CheckCounter("increment", counter)
	kernels.CheckScalar("increment", unless)
	b.enter()
	defer b.exit()
	kIncrement.launch(b, 0, dims{1, 1, 1}, incrementArgs{ptrOf(counter), n, ptrOf(unless)})
}

// bf16Bits rounds v to bfloat16, to nearest even (as the kernels' f2bf).
func bf16Bits(v float32) uint16 {
	u := math.Float32bits(v)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

func boolInt(v bool) int32 {
	if v {
		return 1
	}
	return 0
}
