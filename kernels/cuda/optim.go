package cuda

import "github.com/leangrad/leangrad/kernels"

// The optimisers' updates, the GradScaler's unscale and the gradient-norm
// clip (kernels.OptimOps; optim.cu), each over a list of tensors a launch.

type sgdMultiArgs struct {
	L                       tensorList
	LR                      uintptr
	Momentum, Dampening, WD float32
	Nesterov, First         int32
	Skip                    uintptr
}

type adamwMultiArgs struct {
	L                     tensorList
	LR                    uintptr
	Beta1, Beta2, Eps, WD float32
	Step, Skip, GradScale uintptr
}

type adamw8MultiArgs struct {
	L                     tensorList
	QMap, LR              uintptr
	Beta1, Beta2, Eps, WD float32
	Step, Skip, GradScale uintptr
}

type unscaleMultiArgs struct {
	L            tensorList
	Scale, Found uintptr
}

type updateScaleArgs struct {
	Scale, Tracker, Found, Skipped uintptr
	Growth, Backoff                float32
	Interval                       int32
}

type incrementArgs struct {
	Counter uintptr
	N       int64
	Unless  uintptr
}

var (
	kSGDMulti     = declareKernel[sgdMultiArgs]("sgd_multi")
	kAdamWMulti   = declareKernel[adamwMultiArgs]("adamw_multi")
	kAdamW8Multi  = declareKernel[adamw8MultiArgs]("adamw8_multi")
	kUnscaleMulti = declareKernel[unscaleMultiArgs]("unscale_multi")
	kUpdateScale  = declareKernel[updateScaleArgs]("update_scale")
	kIncrement    = declareKernel[incrementArgs]("increment")
)

// AdamW8 updates every parameter over its 8-bit moments in one launch per
// 32 tensors: a thread block a quantisation block (kernels.Quant8Block
// threads), as many as fill the device for the largest tensor.
func (b *Backend) AdamW8(hp kernels.AdamWParams, qmap kernels.Buf, params, grads, codes, absmax []kernels.Buf) {
	kernels.CheckQuant8("adamw8", qmap, params, grads, codes, absmax)
	kernels.CheckLen("adamw8 learning rate", 1, hp.LR)
	kernels.CheckScalar("adamw8", hp.LR, hp.Skip, hp.GradScale)
	kernels.CheckCounter("adamw8 step", hp.Step)
	qm, lr, step, skip, gs := ptrOf(qmap), ptrOf(hp.LR), ptrOf(hp.Step), ptrOf(hp.Skip), ptrOf(hp.GradScale)
	b.multiGroups([][]kernels.Buf{params, grads, codes, absmax}, func(l tensorList, most int64) {
		blocks := int64(kernels.Quant8Blocks(int(most)))
		d := dims{uint32(max(1, min(blocks, int64(8*b.sms)))), uint32(l.count), kernels.Quant8Block}
		kAdamW8Multi.launch(b, 0, d, adamw8MultiArgs{l, qm, lr, hp.Beta1, hp.Beta2, hp.Eps, hp.WeightDecay, step, skip, gs})
	})
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

type sumsqMultiArgs struct {
	L       tensorList
	Base    int32
	Partial uintptr
}

type sumsqFinishArgs struct {
	N                           int32
	Partial, Stretch, Done, Out uintptr
}

type clipCoefArgs struct {
	Sumsq      uintptr
	MaxNorm    float32
	Norm, Coef uintptr
}

type unscaleClipArgs struct {
	Sumsq, Scale      uintptr
	MaxNorm           float32
	Norm, Mult, Found uintptr
}

type scaleMultiArgs struct {
	L    tensorList
	Coef uintptr
}

var (
	kSumsqMulti  = declareKernel[sumsqMultiArgs]("sumsq_multi")
	kSumsqFinish = declareKernel[sumsqFinishArgs]("sumsq_finish")
	kClipCoef    = declareKernel[clipCoefArgs]("clip_coef")
	kUnscaleClip = declareKernel[unscaleClipArgs]("unscale_clip")
	kScaleMulti  = declareKernel[scaleMultiArgs]("scale_multi")
)

// SumSquares: each tensor's squares summed by as many blocks as fill the
// device for the largest (multiDims), the same number for every tensor of
// the call, so that the order of the sums is fixed; the partial sums in
// double, by stretches and then the stretches in order (sumsq_finish).
func (b *Backend) SumSquares(grads []kernels.Buf, sumsq kernels.Buf) {
	kernels.CheckLen("sum of squares", 1, sumsq)
	kernels.CheckF32("sum of squares", append([]kernels.Buf{sumsq}, grads...)...)
	kernels.CheckLists("sum of squares", grads)
	if len(grads) == 0 {
		b.Fill(sumsq, 0)
		return
	}
	var most int64
	for _, g := range grads {
		most = max(most, int64(g.N))
	}
	b.enter()
	defer b.exit()
	d := b.multiDims((most+3)/4, 1) // four elements a load
	ws := b.workspace(int64(len(grads)) * int64(d.gx) * 4)
	defer b.alloc.Free(ws)
	partial := ws.Addr()
	for lo := 0; lo < len(grads); lo += mtMax {
		hi := min(lo+mtMax, len(grads))
		l, _ := listOf(grads[lo:hi])
		d.gy = uint32(hi - lo)
		kSumsqMulti.launch(b, 0, d, sumsqMultiArgs{l, int32(lo), partial})
	}
	n := len(grads) * int(d.gx)
	stretches := min(b.sms, (n+4*blockSize-1)/(4*blockSize)) // four partials a thread at least
	st := b.workspace(int64(stretches) * 8)
	defer b.alloc.Free(st)
	kSumsqFinish.launch(b, 0, dims{uint32(stretches), 1, blockSize}, sumsqFinishArgs{int32(n), partial, st.Addr(), b.reduceDone.addr, ptrOf(sumsq)})
}

// ClipGradNorm: the coefficient from the sum of squares (one thread), then
// every gradient scaled by it, read on the device.
func (b *Backend) ClipGradNorm(grads []kernels.Buf, maxNorm float32, sumsq, norm kernels.Buf) {
	kernels.CheckLen("clip grad norm", 1, sumsq, norm)
	kernels.CheckF32("clip grad norm", append([]kernels.Buf{sumsq, norm}, grads...)...)
	kernels.CheckLists("clip grad norm", grads)
	b.enter()
	defer b.exit()
	ws := b.workspace(4)
	defer b.alloc.Free(ws)
	coef := ws.Addr()
	kClipCoef.launch(b, 0, dims{1, 1, 1}, clipCoefArgs{ptrOf(sumsq), maxNorm, ptrOf(norm), coef})
	for lo := 0; lo < len(grads); lo += mtMax {
		hi := min(lo+mtMax, len(grads))
		l, most := listOf(grads[lo:hi])
		kScaleMulti.launch(b, 0, b.multiDims(most, hi-lo), scaleMultiArgs{l, coef})
	}
}

// UnscaleClip computes the update's gradient multiplier, the norm and the
// inf check in one thread (kernels.Backend.UnscaleClip).
func (b *Backend) UnscaleClip(maxNorm float32, sumsq, scale, norm, mult, found kernels.Buf) {
	kernels.CheckLen("unscale and clip", 1, sumsq, norm, mult)
	kernels.CheckScalar("unscale and clip", sumsq, scale, norm, mult, found)
	b.enter()
	defer b.exit()
	kUnscaleClip.launch(b, 0, dims{1, 1, 1}, unscaleClipArgs{ptrOf(sumsq), ptrOf(scale), maxNorm, ptrOf(norm), ptrOf(mult), ptrOf(found)})
}

// listOf is a tensorList of one list of up to mtMax buffers, and the
// largest one's length.
func listOf(bufs []kernels.Buf) (l tensorList, most int64) {
	for i, buf := range bufs {
		l.n[i], l.p[0][i] = int64(buf.N), ptrOf(buf)
		most = max(most, l.n[i])
	}
	l.count = int32(len(bufs))
	return l, most
}
