package cuda

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
	"github.com/x448/float16"
)

// suffix names a kernel's storage-type variant.
func suffix(dt kernels.DType) string {
	switch dt {
	case kernels.F32:
		return "f32"
	case kernels.F16:
		return "f16"
	case kernels.I32:
		return "i32"
	}
	panic(fmt.Sprintf("cuda: unknown dtype %v", dt))
}

// floatType returns the variant suffix of buffers that must share a float dtype.
func floatType(op string, bufs ...kernels.Buf) string {
	dt := bufs[0].DType
	for _, b := range bufs {
		if b.Block != nil && b.DType != dt {
			panic(fmt.Sprintf("cuda: %s of mixed dtypes %v and %v", op, dt, b.DType))
		}
	}
	if dt != kernels.F32 && dt != kernels.F16 {
		panic(fmt.Sprintf("cuda: %s of %v data", op, dt))
	}
	return suffix(dt)
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
		b.d.must("cuMemsetD32Async", call(b.d.cuMemsetD32Async, p, uintptr(math.Float32bits(v)), n, b.stream))
	case kernels.I32:
		b.d.must("cuMemsetD32Async", call(b.d.cuMemsetD32Async, p, uintptr(uint32(int32(v))), n, b.stream))
	case kernels.F16:
		b.d.must("cuMemsetD16Async", call(b.d.cuMemsetD16Async, p, uintptr(float16.Fromfloat32(v).Bits()), n, b.stream))
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
	b.kernel().i64(int64(src.N)).ptr(ptrOf(src)).ptr(ptrOf(dst))
	b.launch("cast_"+suffix(src.DType)+"_"+suffix(dst.DType), b.grid(int64(src.N), 256), 1, 256)
}

// Unary computes dst = op(x).
func (b *Backend) Unary(op kernels.UnaryOp, dst, x kernels.Buf) {
	kernels.CheckLen("unary "+op.String(), x.N, dst)
	s := floatType("unary "+op.String(), dst, x)
	b.enter()
	defer b.exit()
	b.kernel().i32(int(op)).i64(int64(x.N)).ptr(ptrOf(x)).ptr(ptrOf(dst))
	b.launch("unary_"+s, b.grid(int64(x.N), 256), 1, 256)
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
	b.kernel().i32(int(op)).i64(int64(dy.N)).ptr(ptrOf(dy)).ptr(ptrOf(x)).ptr(ptrOf(y)).ptr(ptrOf(dx))
	b.launch("unary_bwd_"+s, b.grid(int64(dy.N), 256), 1, 256)
}

// Affine computes dst = alpha·x + beta.
func (b *Backend) Affine(dst, x kernels.Buf, alpha, beta float32) {
	kernels.CheckLen("affine", x.N, dst)
	s := floatType("affine", dst, x)
	b.enter()
	defer b.exit()
	b.kernel().i64(int64(x.N)).ptr(ptrOf(x)).ptr(ptrOf(dst)).f32(alpha).f32(beta)
	b.launch("affine_"+s, b.grid(int64(x.N), 256), 1, 256)
}

// bcast mirrors the kernels' struct Bcast.
type bcast struct {
	ndim          int32
	shape, sa, sb [6]int32
}

// Binary computes dst = a op b with broadcasting; a, b and dst share a dtype.
func (b *Backend) Binary(op kernels.BinaryOp, dst, a, bb kernels.Buf, bc kernels.Broadcast) {
	n := bc.Len()
	kernels.CheckLen("binary "+op.String(), n, dst)
	s := floatType("binary "+op.String(), dst, a, bb)
	if n > math.MaxInt32 {
		panic(fmt.Sprintf("cuda: binary of %d elements", n))
	}
	var c bcast
	c.ndim = int32(bc.NDim)
	for i := 0; i < bc.NDim; i++ {
		c.shape[i], c.sa[i], c.sb[i] = int32(bc.Shape[i]), int32(bc.StrideA[i]), int32(bc.StrideB[i])
	}
	b.enter()
	defer b.exit()
	b.kernel().i32(int(op)).i64(int64(n)).val(unsafe.Pointer(&c), unsafe.Sizeof(c)).ptr(ptrOf(a)).ptr(ptrOf(bb)).ptr(ptrOf(dst))
	b.launch("binary_"+s, b.grid(int64(n), 256), 1, 256)
}

// Reduce reduces along the middle axis: a block per row when the axis is
// innermost, a thread per output otherwise.
func (b *Backend) Reduce(op kernels.ReduceOp, dst, x kernels.Buf, r kernels.Reduction) {
	kernels.CheckReduction("reduce "+op.String(), r, x, dst)
	s := floatType("reduce "+op.String(), dst, x)
	b.enter()
	defer b.exit()
	if r.Inner == 1 {
		threads := min(256, (r.Len+31)/32*32)
		b.kernel().i32(int(op)).i32(r.Outer).i32(r.Len).ptr(ptrOf(x)).ptr(ptrOf(dst))
		b.launch("reduce_rows_"+s, uint32(min(r.Outer, 1<<16)), 1, uint32(threads))
		return
	}
	b.kernel().i32(int(op)).i32(r.Outer).i32(r.Len).i32(r.Inner).ptr(ptrOf(x)).ptr(ptrOf(dst))
	b.launch("reduce_cols_"+s, b.grid(int64(r.Outer*r.Inner), 256), 1, 256)
}

// ReduceMaxBackward routes dy to the elements equal to their maximum.
func (b *Backend) ReduceMaxBackward(dx, dy, x, y kernels.Buf, r kernels.Reduction) {
	kernels.CheckReduction("reduce max backward", r, x, dy)
	kernels.CheckLen("reduce max backward", x.N, dx)
	kernels.CheckLen("reduce max backward", dy.N, y)
	s := floatType("reduce max backward", dx, dy, x, y)
	b.enter()
	defer b.exit()
	b.kernel().i32(r.Len).i32(r.Inner).i64(int64(x.N)).ptr(ptrOf(dy)).ptr(ptrOf(x)).ptr(ptrOf(y)).ptr(ptrOf(dx))
	b.launch("reduce_max_bwd_"+s, b.grid(int64(x.N), 256), 1, 256)
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
	b.kernel().i32(r.Outer).i32(r.Len).i32(r.Inner).ptr(ptrOf(x)).ptr(ptrOf(dst))
	b.launch("argmax_"+s, b.grid(int64(r.Outer*r.Inner), 256), 1, 256)
}

// poolArgs mirrors the kernels' struct Pool.
type poolArgs struct{ N, C, H, W, KH, KW, SH, SW, PH, PW, OH, OW int32 }

func toPool(p kernels.PoolParams) poolArgs {
	return poolArgs{int32(p.N), int32(p.C), int32(p.H), int32(p.W), int32(p.KH), int32(p.KW),
		int32(p.SH), int32(p.SW), int32(p.PH), int32(p.PW), int32(p.OutH()), int32(p.OutW())}
}

func (b *Backend) pool(name string, p kernels.PoolParams, n int, bufs ...kernels.Buf) {
	s := floatType(name, bufs...)
	pa := toPool(p)
	b.enter()
	defer b.exit()
	a := b.kernel().val(unsafe.Pointer(&pa), unsafe.Sizeof(pa))
	for _, buf := range bufs {
		a.ptr(ptrOf(buf))
	}
	b.launch(name+"_"+s, b.grid(int64(n), 256), 1, 256)
}

// MaxPool2d takes the maximum of each window.
func (b *Backend) MaxPool2d(p kernels.PoolParams, x, y kernels.Buf) {
	kernels.CheckPool("max pool", p, x, y)
	b.pool("maxpool", p, y.N, x, y)
}

// MaxPool2dBackward routes dy to each window's first maximum (a gather per input).
func (b *Backend) MaxPool2dBackward(p kernels.PoolParams, x, dy, dx kernels.Buf) {
	kernels.CheckPool("max pool backward", p, x, dy)
	kernels.CheckLen("max pool backward", x.N, dx)
	b.pool("maxpool_bwd", p, x.N, x, dy, dx)
}

// AvgPool2d averages each window.
func (b *Backend) AvgPool2d(p kernels.PoolParams, x, y kernels.Buf) {
	kernels.CheckPool("avg pool", p, x, y)
	b.pool("avgpool", p, y.N, x, y)
}

// AvgPool2dBackward spreads dy over the windows.
func (b *Backend) AvgPool2dBackward(p kernels.PoolParams, dy, dx kernels.Buf) {
	kernels.CheckPool("avg pool backward", p, dx, dy)
	b.pool("avgpool_bwd", p, dx.N, dy, dx)
}

// CrossEntropy computes the mean loss in one single-block launch. Labels
// outside [0, k) make the loss NaN.
func (b *Backend) CrossEntropy(logits, labels, lse, loss kernels.Buf, n, k int) {
	kernels.CheckCrossEntropy("cross entropy", logits, labels, lse, n, k)
	kernels.CheckLen("cross entropy loss", 1, loss)
	kernels.CheckF32("cross entropy", loss)
	s := floatType("cross entropy", logits)
	b.enter()
	defer b.exit()
	b.kernel().i32(n).i32(k).ptr(ptrOf(logits)).ptr(ptrOf(labels)).ptr(ptrOf(lse)).ptr(ptrOf(loss))
	b.launch("ce_fwd_"+s, 1, 1, 512)
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
	b.kernel().i32(n).i32(k).ptr(ptrOf(logits)).ptr(ptrOf(labels)).ptr(ptrOf(lse)).ptr(ptrOf(dloss)).ptr(ptrOf(dlogits))
	b.launch("ce_bwd_"+s, b.grid(int64(n*k), 256), 1, 256)
}

// Uniform fills dst from the Philox state g.
func (b *Backend) Uniform(dst kernels.Buf, lo, hi float32, g kernels.Philox) {
	s := floatType("uniform", dst)
	b.enter()
	defer b.exit()
	b.kernel().i64(int64(dst.N)).u64(g.Seed).u64(g.Offset).ptr(basePtr(g)).f32(lo).f32(hi).ptr(ptrOf(dst))
	b.launch("uniform_"+s, b.grid(int64(dst.N+3)/4, 256), 1, 256)
}

// Normal fills dst from the Philox state g.
func (b *Backend) Normal(dst kernels.Buf, mean, std float32, g kernels.Philox) {
	s := floatType("normal", dst)
	b.enter()
	defer b.exit()
	b.kernel().i64(int64(dst.N)).u64(g.Seed).u64(g.Offset).ptr(basePtr(g)).f32(mean).f32(std).ptr(ptrOf(dst))
	b.launch("normal_"+s, b.grid(int64(dst.N+3)/4, 256), 1, 256)
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
	b.kernel().i64(int64(x.N)).u64(g.Seed).u64(g.Offset).ptr(basePtr(g)).f32(p).ptr(ptrOf(x)).ptr(ptrOf(dst))
	b.launch("dropout_"+s, b.grid(int64(x.N+3)/4, 256), 1, 256)
}

// basePtr is the device address of g's Base counter, or 0.
func basePtr(g kernels.Philox) uintptr {
	if !g.Base.Valid() {
		return 0
	}
	kernels.CheckCounter("philox base", g.Base)
	return ptrOf(g.Base)
}

// AccumulateMetrics adds the batch's loss and right predictions to sums, in one single-block launch.
func (b *Backend) AccumulateMetrics(sums, loss, logits, labels kernels.Buf, n, k int) {
	kernels.CheckMetrics(sums, loss, logits, labels, n, k)
	s := floatType("metrics", logits)
	b.enter()
	defer b.exit()
	b.kernel().i32(n).i32(k).ptr(ptrOf(logits)).ptr(ptrOf(labels)).ptr(ptrOf(loss)).ptr(ptrOf(sums))
	b.launch("metrics_"+s, 1, 1, 256)
}

// tensorList mirrors the kernels' struct TensorList.
type tensorList struct {
	n     [mtMax]int64
	p     [4][mtMax]uintptr
	count int32
	_     int32
}

const mtMax = 32

// multiTensor launches name over the lists in groups of mtMax tensors; extra
// appends the scalar arguments after the list.
func (b *Backend) multiTensor(name string, lists [][]kernels.Buf, extra func(a *arena)) {
	for i := range lists[0] {
		for _, l := range lists {
			if l[i].N != lists[0][i].N || l[i].DType != kernels.F32 {
				panic(fmt.Sprintf("cuda: %s: tensor %d: %d %v elements, want %d f32", name, i, l[i].N, l[i].DType, lists[0][i].N))
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
		a := b.kernel().val(unsafe.Pointer(&tl), unsafe.Sizeof(tl))
		extra(a)
		b.launch(name, min(b.grid(most, 256), 64), uint32(hi-lo), 256)
	}
}

// CopyMany copies each src[i] into dst[i], one launch per 32 tensors (a
// graph's memcpy nodes cost a launch each).
func (b *Backend) CopyMany(dst, src []kernels.Buf) {
	kernels.CheckLists("copy many", dst, src)
	if len(dst) == 0 {
		return
	}
	b.multiTensor("copy_multi", [][]kernels.Buf{dst, src}, func(*arena) {})
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
	b.multiTensor("sgd_multi", lists, func(a *arena) {
		a.ptr(lr).f32(hp.Momentum).f32(hp.Dampening).f32(hp.WeightDecay).i32(boolInt(hp.Nesterov)).i32(boolInt(hp.FirstStep)).ptr(skip)
	})
}

// AdamW updates every parameter in one launch per 32 tensors.
func (b *Backend) AdamW(hp kernels.AdamWParams, params, grads, m, v []kernels.Buf) {
	kernels.CheckLists("adamw", params, grads, m, v)
	kernels.CheckLen("adamw learning rate", 1, hp.LR)
	kernels.CheckScalar("adamw", hp.LR, hp.Skip)
	kernels.CheckCounter("adamw step", hp.Step)
	lr, step, skip := ptrOf(hp.LR), ptrOf(hp.Step), ptrOf(hp.Skip)
	b.multiTensor("adamw_multi", [][]kernels.Buf{params, grads, m, v}, func(a *arena) {
		a.ptr(lr).f32(hp.Beta1).f32(hp.Beta2).f32(hp.Eps).f32(hp.WeightDecay).ptr(step).ptr(skip)
	})
}

// UnscaleCheck divides every grad by the device scale and raises found on
// inf/NaN, one launch per 32 tensors.
func (b *Backend) UnscaleCheck(grads []kernels.Buf, scale, found kernels.Buf) {
	kernels.CheckLen("unscale", 1, scale, found)
	kernels.CheckScalar("unscale", scale, found)
	sp, fp := ptrOf(scale), ptrOf(found)
	b.multiTensor("unscale_multi", [][]kernels.Buf{grads}, func(a *arena) { a.ptr(sp).ptr(fp) })
}

// UpdateScale runs torch's _amp_update_scale_ in one thread.
func (b *Backend) UpdateScale(p kernels.ScalerParams, scale, tracker, found, skipped kernels.Buf) {
	kernels.CheckLen("update scale", 1, scale, tracker, found, skipped)
	kernels.CheckScalar("update scale", scale, found, skipped)
	b.enter()
	defer b.exit()
	b.kernel().ptr(ptrOf(scale)).ptr(ptrOf(tracker)).ptr(ptrOf(found)).ptr(ptrOf(skipped)).
		f32(p.Growth).f32(p.Backoff).i32(p.Interval)
	b.launch("update_scale", 1, 1, 1)
}

// Increment adds n to a counter on the device unless the flag is set.
func (b *Backend) Increment(counter kernels.Buf, n int64, unless kernels.Buf) {
	kernels.CheckCounter("increment", counter)
	kernels.CheckScalar("increment", unless)
	b.enter()
	defer b.exit()
	b.kernel().ptr(ptrOf(counter)).i64(n).ptr(ptrOf(unless))
	b.launch("increment", 1, 1, 1)
}

func boolInt(v bool) int {
	if v {
		return 1
	}
	return 0
}
