package kernels

import "fmt"

// OptimOps are the optimisers' updates and what AMP and clipping do to the
// gradients before them, all on the device.
type OptimOps interface {
	// SGD updates params in place (and their momentum buffers, when Momentum != 0).
	SGD(p SGDParams, params, grads, moms []Buf)

	// AdamW updates params and their moment estimates in place.
	AdamW(p AdamWParams, params, grads, m, v []Buf)

	// AdamW8 is AdamW with each parameter's moments held in 8 bits a value,
	// quantised block by block (Quant8Block values a block): codes[i]
	// (U8, two a value of params[i]) holds each value's first-moment code
	// into qmap's signed half, then the code of its second moment's square
	// root into the unsigned half; absmax[i] (F32, two a block) the
	// block's largest |first moment| and largest root, which scale the
	// codes' values. qmap is Quant8Maps (F32, 512) on the device. Each
	// value's update dequantises its moments (m, and v = s·s), runs
	//
	//	p ← p·(1−lr·wd);  m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g·g;  s ← √v
	//	p ← p − (lr/(1−β1ᵗ))·m / (s/√(1−β2ᵗ) + ε)
	//
	// in F32, each operation rounded (no fused multiply-adds), and stores
	// the new m and s as the codes nearest m/max|m| and s/max s over the
	// block (Quant8Code; 0 for a block of zeros), the maxima as its absmax:
	// every backend's codes are the CPU's, bit for bit. A fresh state is
	// absmax 0 (any codes). Skip, Step, LR and GradScale are as AdamW's.
	AdamW8(p AdamWParams, qmap Buf, params, grads, codes, absmax []Buf)

	// UnscaleCheck divides every grad by scale (F32, 1 element, read on the
	// device) in place and sets found (F32, 1 element, not cleared) to 1 if
	// any value is infinite or NaN.
	UnscaleCheck(grads []Buf, scale, found Buf)

	// UnscaleClip is UnscaleCheck and ClipGradNorm for an update that
	// multiplies the gradients as it reads them (AdamWParams.GradScale),
	// in one thread on the device: from the sum of squares sumsq (F32, 1)
	// of gradients still multiplied by scale (F32, 1; invalid: 1), it
	// writes their norm √sumsq/scale to norm, mult = c/scale where c is
	// the clip coefficient min(1, maxNorm/(norm + 10⁻⁶)) (1 for maxNorm
	// 0), and sets found (F32, 1, not cleared; invalid: none) to 1 if
	// sumsq is not finite: an inf or NaN gradient, or one whose square
	// overflows.
	UnscaleClip(maxNorm float32, sumsq, scale, norm, mult, found Buf)

	// SumSquares writes the sum of the squares of all of grads together
	// (F32) into sumsq (F32, 1), summed in a fixed order (0 for no grads).
	SumSquares(grads []Buf, sumsq Buf)

	// ClipGradNorm writes the L2 norm √sumsq into norm (F32, 1) and
	// multiplies every grad (F32) in place by min(1, maxNorm/(norm+1e-6)),
	// as torch.nn.utils.clip_grad_norm_ once SumSquares has summed the
	// squares (of one rank's gradients, or of a sharded job's ranks' shards
	// after an all-reduce): on the device, without the host.
	ClipGradNorm(grads []Buf, maxNorm float32, sumsq, norm Buf)

	// UpdateScale is torch's _amp_update_scale_, on the device: when found
	// is set, scale ← scale·Backoff and tracker (I32, 1) ← 0, and skipped
	// (F32, 1) counts one more skipped step; otherwise the tracker counts up
	// and at Interval the scale grows by Growth and the tracker restarts.
	UpdateScale(p ScalerParams, scale, tracker, found, skipped Buf)

	// Increment adds n to a counter, unless unless is valid and holds a
	// value other than zero.
	Increment(counter Buf, n int64, unless Buf)
}

// CounterLen is the I32 elements of a device counter, a little-endian
// two's-complement int64 that operations read and advance without the
// host (tensor.Counter owns them; Philox bases, AdamW's step count).
const CounterLen = 2

// SGDParams are the hyper-parameters of one SGD step, as in torch.optim.SGD.
// The learning rate is read on the device, so that a captured step follows
// the schedule; with FirstStep, momentum buffers are initialised to the
// gradient.
type SGDParams struct {
	LR                               Buf // F32, 1 element
	Momentum, Dampening, WeightDecay float32
	Nesterov                         bool
	FirstStep                        bool
	// Skip, when valid (F32, 1 element), makes the update do nothing if its
	// value is not zero: GradScaler's found-inf flag, read on the device.
	Skip Buf
}

// AdamWParams are the hyper-parameters of one AdamW step, as in
// torch.optim.AdamW. Step is a counter holding the step number, counted from
// 1, that drives the bias correction; it is read on the device.
type AdamWParams struct {
	LR                             Buf // F32, 1 element
	Beta1, Beta2, Eps, WeightDecay float32
	Step                           Buf // a counter
	Skip                           Buf // as SGDParams.Skip
	// GradScale, when valid (F32, 1 element, read on the device),
	// multiplies each gradient as the update reads it: UnscaleClip's
	// multiplier, the GradScaler's 1/scale and the clip's coefficient
	// applied without a pass of their own over the gradients.
	GradScale Buf
}

// MasterAdamW is a backend that updates F32 master weights of 16-bit
// working weights in one pass (the host's side of an offloaded optimizer
// over BF16 or F16 weights, Note [working weights in 16 bits] in optim).
type MasterAdamW interface {
	// AdamWMaster is AdamW over masters (F32) from gradients in a 16-bit
	// dtype, widened as the update reads them, or in F32 (a micro-batched
	// step's sums, PartSummer), with the same arithmetic as AdamW over the
	// F32 gradients; each updated master is rounded, nearest even, into
	// working[i], 16-bit and as long. A working buffer may be its 16-bit
	// gradient's: each value is read before it is written.
	AdamWMaster(hp AdamWParams, masters, grads, m, v, working []Buf)
}

// CheckMasterAdamW panics unless AdamWMaster's lists agree: masters, m
// and v F32, working one 16-bit dtype, grads that dtype or F32, every list
// as long and each i's buffers of one length.
func CheckMasterAdamW(masters, grads, m, v, working []Buf) {
	CheckLists("adamw over masters", masters, m, v)
	for _, l := range [][]Buf{grads, working} {
		if len(l) != len(masters) {
			panic(fmt.Sprintf("kernels: adamw over masters: %d masters and a list of %d", len(masters), len(l)))
		}
	}
	for i := range masters {
		g, w := grads[i], working[i]
		if !w.DType.Half() || g.DType != w.DType && g.DType != F32 || g.N != masters[i].N || w.N != g.N {
			panic(fmt.Sprintf("kernels: adamw over masters: tensor %d: a master of %d, a gradient of %d %v and working weights of %d %v; want 16-bit working weights, a gradient of their dtype or F32, one length", i, masters[i].N, g.N, g.DType, w.N, w.DType))
		}
	}
}

// PartSummer is a backend that sums a step's gradients from its
// micro-batches' parts in F32 (the host's side of an offloaded optimizer
// over micro-batches, Note [parts summed on the host] in optim).
type PartSummer interface {
	// SumPart writes into dst, F32, part widened (F32, BF16 or F16; sum
	// invalid) or sum, F32, plus part widened, and returns the sum of the
	// squares of the values written, in float64. dst may be sum, or part
	// when part is F32: each value is read before it is written. The
	// squares are summed in a fixed order whatever the threads.
	SumPart(dst, sum, part Buf) float64
}

// ScalerParams are GradScaler's growth and backoff, as in torch.amp.GradScaler.
type ScalerParams struct {
	Growth, Backoff float32
	Interval        int
}

func (o *Observed) SGD(p SGDParams, params, grads, moms []Buf) {
	defer o.op("SGD", "SGD", first(params))()
	o.B.SGD(p, params, grads, moms)
}

func (o *Observed) AdamW(p AdamWParams, params, grads, m, v []Buf) {
	defer o.op("AdamW", "AdamW", first(params))()
	o.B.AdamW(p, params, grads, m, v)
}

func (o *Observed) AdamW8(p AdamWParams, qmap Buf, params, grads, codes, absmax []Buf) {
	defer o.op("AdamW8", "AdamW8", first(params))()
	o.B.AdamW8(p, qmap, params, grads, codes, absmax)
}

func (o *Observed) UnscaleClip(maxNorm float32, sumsq, scale, norm, mult, found Buf) {
	defer o.op("UnscaleClip", "UnscaleClip", sumsq)()
	o.B.UnscaleClip(maxNorm, sumsq, scale, norm, mult, found)
}

func (o *Observed) UnscaleCheck(grads []Buf, scale, found Buf) {
	defer o.op("UnscaleCheck", "UnscaleCheck", first(grads))()
	o.B.UnscaleCheck(grads, scale, found)
}

func (o *Observed) UpdateScale(p ScalerParams, scale, tracker, found, skipped Buf) {
	defer o.op("UpdateScale", "UpdateScale", scale)()
	o.B.UpdateScale(p, scale, tracker, found, skipped)
}

func (o *Observed) Increment(counter Buf, n int64, unless Buf) {
	defer o.op("Increment", "Increment", counter)()
	o.B.Increment(counter, n, unless)
}

func (o *Observed) SumSquares(grads []Buf, sumsq Buf) {
	defer o.op("SumSquares", "SumSquares", first(grads))()
	o.B.SumSquares(grads, sumsq)
}

func (o *Observed) ClipGradNorm(grads []Buf, maxNorm float32, sumsq, norm Buf) {
	defer o.op("ClipGradNorm", "ClipGradNorm", first(grads))()
	o.B.ClipGradNorm(grads, maxNorm, sumsq, norm)
}
