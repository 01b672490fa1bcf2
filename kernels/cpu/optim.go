package cpu

import (
	"fmt"
	"math"
	"sync/atomic"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu/internal/half"
)

// skipped reports whether a Skip flag is set.
func skipped(flag kernels.Buf) bool {
	kernels.CheckScalar("skip flag", flag)
	return flag.Valid() && f32s(flag)[0] != 0
}

// SGD is torch.optim.SGD's update:
//
//	g = grad + wd·p;  buf = momentum·buf + (1−dampening)·g (buf = g at the first step)
//	g = g + momentum·buf if Nesterov else buf;  p -= lr·g
func (c *Backend) SGD(hp kernels.SGDParams, params, grads, moms []kernels.Buf) {
	if hp.Momentum != 0 {
		kernels.CheckLists("sgd", params, grads, moms)
	} else {
		kernels.CheckLists("sgd", params, grads)
	}
	kernels.CheckLen("sgd learning rate", 1, hp.LR)
	kernels.CheckScalar("sgd learning rate", hp.LR)
	if skipped(hp.Skip) {
		return
	}
	lr := f32s(hp.LR)[0]
	for t := range params {
		p, g := f32s(params[t]), f32s(grads[t])
		var buf []float32
		if hp.Momentum != 0 {
			buf = f32s(moms[t])
		}
		parallel(len(p), elemGrain, yielding(yieldRun, func(lo, hi int) {
			sgdUpdate(hp, lr, p[lo:hi], g[lo:hi], optSlice(buf, lo, hi))
		}))
	}
}

// optSlice is x[lo:hi], or nil for a missing x.
func optSlice(x []float32, lo, hi int) []float32 {
	if x == nil {
		return nil
	}
	return x[lo:hi]
}

// sgdUpdate is SGD's update of one stretch of a parameter, with the
// hyperparameters in locals and one loop per case, so that the loops carry
// no branches.
func sgdUpdate(hp kernels.SGDParams, lr float32, p, g, buf []float32) {
	g = g[:len(p)]
	wd, mom, damp := hp.WeightDecay, hp.Momentum, 1-hp.Dampening
	switch {
	case buf == nil:
		for i, v := range p {
			p[i] = v - lr*(g[i]+wd*v)
		}
	case hp.FirstStep:
		buf = buf[:len(p)]
		for i, v := range p {
			d := g[i] + wd*v
			buf[i] = d
			if hp.Nesterov {
				d += mom * d
			}
			p[i] = v - lr*d
		}
	case hp.Nesterov:
		n := sgdMomentumVec(hp, lr, p, g, buf)
		p, g, buf = p[n:], g[n:], buf[n:len(p)]
		for i, v := range p {
			d := g[i] + wd*v
			b := mom*buf[i] + damp*d
			buf[i] = b
			p[i] = v - lr*(d+mom*b)
		}
	default:
		n := sgdMomentumVec(hp, lr, p, g, buf)
		p, g, buf = p[n:], g[n:], buf[n:len(p)]
		for i, v := range p {
			b := mom*buf[i] + damp*(g[i]+wd*v)
			buf[i] = b
			p[i] = v - lr*b
		}
	}
}

// AdamW is torch.optim.AdamW's update with decoupled weight decay, at step
// t read from hp.Step:
//
//	p -= lr·wd·p;  m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
//	p -= lr·(m/(1−β1ᵗ)) / (√(v/(1−β2ᵗ)) + ε)
func (c *Backend) AdamW(hp kernels.AdamWParams, params, grads, m, v []kernels.Buf) {
	kernels.CheckLists("adamw", params, grads, m, v)
	a, ok := adamwStep(hp)
	if !ok {
		return
	}
	for t := range params {
		p, gr, ms, vs := f32s(params[t]), f32s(grads[t]), f32s(m[t]), f32s(v[t])
		parallel(len(p), elemGrain, yielding(yieldRun, func(lo, hi int) { a.update(p[lo:hi], gr[lo:hi], ms[lo:hi], vs[lo:hi]) }))
	}
}

// AdamWMaster is AdamW over F32 masters from 16-bit gradients, rounding
// the masters into the working weights (kernels.MasterAdamW): a stretch
// of masterChunk values at a time, its gradient widened into a buffer
// that stays in cache, updated by AdamW's pass and rounded, so that each
// value crosses memory once (where widening, updating and rounding in
// passes of their own cross it three times).
func (c *Backend) AdamWMaster(hp kernels.AdamWParams, masters, grads, m, v, working []kernels.Buf) {
	kernels.CheckMasterAdamW(masters, grads, m, v, working)
	a, ok := adamwStep(hp)
	if !ok {
		return
	}
	for t := range masters {
		p, ms, vs, w := f32s(masters[t]), f32s(m[t]), f32s(v[t]), u16s(working[t])
		round := half.FromFloat32
		if working[t].DType == kernels.BF16 {
			round = half.BF16FromFloat32
		}
		var g32 []float32 // a micro-batched step's sum, read as it is
		var g16 []uint16
		var widen func(dst []float32, src []uint16)
		if grads[t].DType == kernels.F32 {
			g32 = f32s(grads[t])
		} else {
			g16, widen = u16s(grads[t]), widener(grads[t].DType)
		}
		parallel(len(p), elemGrain, yielding(yieldRun, func(lo, hi int) {
			wide := getScratch(masterChunk) // scratch, not an array on the stack: widen's call would move that to the heap each time
			defer putScratch(wide)
			for s := lo; s < hi; s += masterChunk {
				e := min(s+masterChunk, hi)
				g := wide[:e-s]
				if widen != nil {
					widen(g, g16[s:e]) // all of the stretch's gradient read before w, which may be g16, is written
				} else {
					g = g32[s:e]
				}
				a.update(p[s:e], g, ms[s:e], vs[s:e])
				round(w[s:e], p[s:e])
			}
		}))
	}
}

// widener is the conversion of dt's values, BF16 or F16, to float32.
func widener(dt kernels.DType) func(dst []float32, src []uint16) {
	if dt == kernels.BF16 {
		return half.BF16ToFloat32
	}
	return half.ToFloat32
}

// SumPart writes part widened, plus sum when it is valid, into dst and
// returns the sum of the squares of the values written
// (kernels.PartSummer): a stretch of chunkLen values at a time through a
// buffer that stays in cache, with AVX-512 where there is; each stretch's
// squares summed (sumSquares), in float64 over the stretches of a block of
// elemGrain values in order, and the blocks' sums added in order.
func (c *Backend) SumPart(dst, sum, part kernels.Buf) float64 {
	kernels.CheckF32("sum of parts", dst)
	kernels.CheckLen("sum of parts", dst.N, part)
	if sum.Valid() {
		kernels.CheckF32("sum of parts", sum)
		kernels.CheckLen("sum of parts", dst.N, sum)
	}
	var widen func(dst []float32, src []uint16)
	switch part.DType {
	case kernels.F32:
	case kernels.BF16, kernels.F16:
		if overlaps(dst, part) {
			panic(fmt.Sprintf("cpu: sum of parts: a %v part overlaps its F32 destination", part.DType))
		}
		widen = widener(part.DType)
	default:
		panic(fmt.Sprintf("cpu: sum of parts: a %v part; want F32, BF16 or F16", part.DType))
	}
	d := f32s(dst)
	var s []float32
	if sum.Valid() {
		s = f32s(sum)
	}
	blocks := (len(d) + elemGrain - 1) / elemGrain
	squares := make([]float64, blocks)
	parallel(blocks, 1, yielding(1, func(lo, hi int) {
		wide := getScratch(chunkLen)
		defer putScratch(wide)
		for b := lo; b < hi; b++ {
			var sq float64
			for k := b * elemGrain; k < min(len(d), (b+1)*elemGrain); k += chunkLen {
				e := min(k+chunkLen, len(d), (b+1)*elemGrain)
				x := wide[:e-k] // dst may be sum, or the F32 part: each stretch is read before it is written
				if widen != nil {
					widen(x, u16s(part)[k:e])
				} else {
					copy(x, f32s(part)[k:e])
				}
				if s != nil {
					addInto(x, s[k:e])
				}
				sq += sumSquares(x)
				copy(d[k:e], x)
			}
			squares[b] = sq
		}
	}))
	var total float64
	for _, sq := range squares {
		total += sq
	}
	return total
}

// masterChunk is how many values AdamWMaster widens, updates and rounds
// at a time: their widened gradient, 4 KiB, stays in the core's cache.
const masterChunk = 1024

// adamwStep checks hp's scalars and returns the step's constants, or
// false when its skip flag is set.
func adamwStep(hp kernels.AdamWParams) (adamw, bool) {
	kernels.CheckLen("adamw learning rate", 1, hp.LR)
	kernels.CheckScalar("adamw learning rate", hp.LR, hp.GradScale)
	kernels.CheckCounter("adamw step", hp.Step)
	if skipped(hp.Skip) {
		return adamw{}, false
	}
	return adamwConstants(hp), true
}

// adamw is one AdamW step's constants, in locals for its loop.
type adamw struct{ decay, b1, b2, c1, c2, eps, stepSize, bc2Sqrt, gs float32 }

// adamwConstants are the constants of the AdamW step hp, its step count,
// learning rate and gradient multiplier read from their buffers.
func adamwConstants(hp kernels.AdamWParams) adamw {
	step := *counter(hp.Step)
	if step < 1 {
		panic(fmt.Sprintf("cpu: adamw step %d, want >= 1", step))
	}
	lr := f32s(hp.LR)[0]
	bc1 := 1 - math.Pow(float64(hp.Beta1), float64(step))
	bc2 := 1 - math.Pow(float64(hp.Beta2), float64(step))
	a := adamw{decay: 1 - float32(lr*hp.WeightDecay), b1: hp.Beta1, b2: hp.Beta2, c1: 1 - hp.Beta1, c2: 1 - hp.Beta2,
		eps: hp.Eps, stepSize: float32(float64(lr) / bc1), bc2Sqrt: float32(math.Sqrt(bc2)), gs: 1} // a gradient times 1 is itself: one loop for both
	if hp.GradScale.Valid() {
		a.gs = f32s(hp.GradScale)[0]
	}
	return a
}

// update is the step over one stretch of a parameter, its gradient and
// moments, in one pass: sixteen values an instruction with AVX-512
// (adamwVec), the rest in Go, with the same rounding.
func (a adamw) update(p, g, m, v []float32) {
	g, m, v = g[:len(p)], m[:len(p)], v[:len(p)]
	k := adamwVec(&a, p, g, m, v)
	a.loop(p[k:], g[k:], m[k:], v[k:])
}

// loop is update's Go loop.
func (a adamw) loop(p, g, m, v []float32) {
	for i, x := range p {
		gi := g[i] * a.gs
		mi := a.b1*m[i] + a.c1*gi
		vi := a.b2*v[i] + a.c2*gi*gi
		m[i], v[i] = mi, vi
		p[i] = x*a.decay - a.stepSize*mi/(float32(math.Sqrt(float64(vi)))/a.bc2Sqrt+a.eps)
	}
}

// UnscaleClip computes the norm, the update's gradient multiplier and the
// inf check from the scaled gradients' sum of squares
// (kernels.Backend.UnscaleClip), with ClipGradNorm's arithmetic.
func (c *Backend) UnscaleClip(maxNorm float32, sumsq, scale, norm, mult, found kernels.Buf) {
	kernels.CheckLen("unscale and clip", 1, sumsq, norm, mult)
	kernels.CheckScalar("unscale and clip", sumsq, scale, norm, mult, found)
	ss, s := f32s(sumsq)[0], float32(1)
	if scale.Valid() {
		s = f32s(scale)[0]
	}
	n := float32(math.Sqrt(float64(ss))) / s
	f32s(norm)[0] = n
	coef := float32(1)
	if maxNorm > 0 {
		if coef = maxNorm / (n + 1e-6); coef == coef { // NaN stays
			coef = min(coef, 1)
		}
	}
	f32s(mult)[0] = coef / s
	if found.Valid() && (math.IsInf(float64(ss), 0) || math.IsNaN(float64(ss))) {
		f32s(found)[0] = 1
	}
}

// UnscaleCheck multiplies every grad by 1/scale and raises found on inf/NaN.
func (c *Backend) UnscaleCheck(grads []kernels.Buf, scale, found kernels.Buf) {
	kernels.CheckLen("unscale", 1, scale, found)
	kernels.CheckScalar("unscale", scale, found)
	inv := 1 / f32s(scale)[0]
	var bad atomic.Bool
	for _, gb := range grads {
		g := f32s(gb)
		parallel(len(g), elemGrain, func(lo, hi int) {
			if unscale(g[lo:hi], inv) {
				bad.Store(true)
			}
		})
	}
	if bad.Load() {
		f32s(found)[0] = 1
	}
}

// unscale multiplies g by inv in place, reporting whether any product is
// infinite or NaN.
func unscale(g []float32, inv float32) bool {
	i, bad := unscaleVec(g, inv)
	// v·0 is 0 for every finite v and NaN for ±Inf and NaN: one
	// multiply-and-accumulate an element, no branch, no conversion, into
	// four sums so that the additions do not wait on each other.
	var p0, p1, p2, p3 float32
	for ; i+4 <= len(g); i += 4 {
		v := g[i : i+4 : i+4]
		v0, v1, v2, v3 := v[0]*inv, v[1]*inv, v[2]*inv, v[3]*inv
		v[0], v[1], v[2], v[3] = v0, v1, v2, v3
		p0, p1, p2, p3 = p0+v0*0, p1+v1*0, p2+v2*0, p3+v3*0
	}
	for ; i < len(g); i++ {
		g[i] *= inv
		p0 += g[i] * 0
	}
	poison := p0 + p1 + p2 + p3
	return bad || poison != poison // NaN
}

// UpdateScale is torch's _amp_update_scale_.
func (c *Backend) UpdateScale(p kernels.ScalerParams, scale, tracker, found, skipped kernels.Buf) {
	kernels.CheckLen("update scale", 1, scale, tracker, found, skipped)
	kernels.CheckScalar("update scale", scale, found, skipped)
	s, tr := f32s(scale), i32s(tracker)
	if f32s(found)[0] != 0 {
		s[0] *= p.Backoff
		tr[0] = 0
		f32s(skipped)[0]++
		return
	}
	tr[0]++
	if int(tr[0]) >= p.Interval {
		s[0] *= p.Growth
		tr[0] = 0
	}
}

// Increment adds n to the counter unless the flag is set.
func (c *Backend) Increment(ctr kernels.Buf, n int64, unless kernels.Buf) {
	kernels.CheckCounter("increment", ctr)
	if skipped(unless) {
		return
	}
	*counter(ctr) += n
}

// SumSquares sums the squares of every gradient in float64, in blocks of
// elemGrain values added in order.
func (c *Backend) SumSquares(grads []kernels.Buf, sumsq kernels.Buf) {
	kernels.CheckLen("sum of squares", 1, sumsq)
	kernels.CheckF32("sum of squares", append([]kernels.Buf{sumsq}, grads...)...)
	var total float64
	for _, gb := range grads {
		g := f32s(gb)
		blocks := (len(g) + elemGrain - 1) / elemGrain
		part := make([]float64, blocks)
		parallel(blocks, 1, func(lo, hi int) {
			for b := lo; b < hi; b++ {
				var s float64
				for _, v := range g[b*elemGrain : min(len(g), (b+1)*elemGrain)] {
					s += float64(v) * float64(v)
				}
				part[b] = s
			}
		})
		for _, s := range part {
			total += s
		}
	}
	f32s(sumsq)[0] = float32(total)
}

// ClipGradNorm scales every gradient by the clip coefficient of the norm
// √sumsq.
func (c *Backend) ClipGradNorm(grads []kernels.Buf, maxNorm float32, sumsq, norm kernels.Buf) {
	kernels.CheckLen("clip grad norm", 1, sumsq, norm)
	kernels.CheckF32("clip grad norm", append([]kernels.Buf{sumsq, norm}, grads...)...)
	n := float32(math.Sqrt(float64(f32s(sumsq)[0])))
	f32s(norm)[0] = n
	coef := min(1, maxNorm/(n+1e-6))
	if coef == 1 {
		return
	}
	for _, gb := range grads {
		g := f32s(gb)
		parallel(len(g), elemGrain, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				g[i] *= coef
			}
		})
	}
}

// AdamW8 is AdamW over 8-bit block-wise quantised moments
// (kernels.OptimOps.AdamW8), block by block over the cores.
func (c *Backend) AdamW8(hp kernels.AdamWParams, qmap kernels.Buf, params, grads, codes, absmax []kernels.Buf) {
	kernels.CheckQuant8("adamw8", qmap, params, grads, codes, absmax)
	kernels.CheckLen("adamw8 learning rate", 1, hp.LR)
	kernels.CheckScalar("adamw8", hp.LR, hp.Skip, hp.GradScale)
	kernels.CheckCounter("adamw8 step", hp.Step)
	if skipped(hp.Skip) {
		return
	}
	a := adamwConstants(hp)
	maps := f32s(qmap)
	for t := range params {
		p, g, cs, am := f32s(params[t]), f32s(grads[t]), raw(codes[t]), f32s(absmax[t])
		parallel(kernels.Quant8Blocks(len(p)), elemGrain/kernels.Quant8Block, yielding(yieldRun/kernels.Quant8Block, func(lo, hi int) {
			for b := lo; b < hi; b++ {
				i0, i1 := b*kernels.Quant8Block, min((b+1)*kernels.Quant8Block, len(p))
				a.update8(maps, p[i0:i1], g[i0:i1], cs[2*i0:2*i1], am[2*b:2*b+2])
			}
		}))
	}
}

// update8 is AdamW8's update of one block: its parameters p, gradients g,
// codes (two a value) and absmax (two).
func (a adamw) update8(maps, p, g []float32, codes []byte, absmax []float32) {
	var m, s [kernels.Quant8Block]float32
	signed, unsigned := maps[:256], maps[256:512]
	var mMax, sMax float32
	for i, x := range p {
		mi := signed[codes[2*i]] * absmax[0]
		si := unsigned[codes[2*i+1]] * absmax[1]
		gi := g[i] * a.gs
		mi = float32(a.b1*mi) + float32(a.c1*gi)
		vi := float32(a.b2*float32(si*si)) + float32(float32(a.c2*gi)*gi)
		si = float32(math.Sqrt(float64(vi)))
		p[i] = float32(x*a.decay) - float32(a.stepSize*mi)/(si/a.bc2Sqrt+a.eps)
		m[i], s[i] = mi, si
		mMax, sMax = max(mMax, float32(math.Abs(float64(mi)))), max(sMax, si)
	}
	for i := range p {
		var qm, qs float32
		if mMax > 0 {
			qm = m[i] / mMax
		}
		if sMax > 0 {
			qs = s[i] / sMax
		}
		codes[2*i], codes[2*i+1] = quant8Signed.code(qm), quant8Unsigned.code(qs)
	}
	absmax[0], absmax[1] = mMax, sMax
}

// quant8Book is a code book (kernels.Quant8Maps' halves) with a table that
// finds a value's code without a branch: guess[b] is the last code not
// above any value of bucket b, where a value's bucket is its sign, its
// binary exponent from 2⁻⁴⁰ (smaller ones share the lowest) to 2⁰, and
// the top 7 bits of its mantissa; from it, code steps up (quant8Steps
// times at most, as the table's making checks) to the last value not above
// x, and rounds to the nearer neighbour: the codes of kernels.Quant8Code,
// without its eight dependent halvings (BenchmarkAdamW8).
type quant8Book struct {
	book  [257]float32 // the 256 values, then +Inf
	guess [2 * quant8Exps * 128]uint8
}

// quant8Exps are the binary exponents the table tells apart, and
// quant8Steps the most codes past its guess a value of a bucket can be.
const quant8Exps, quant8Steps = 41, 2

var quant8Signed, quant8Unsigned = newQuant8Book(kernels.Quant8Maps[:256]), newQuant8Book(kernels.Quant8Maps[256:512])

func newQuant8Book(book []float32) *quant8Book {
	q := &quant8Book{}
	copy(q.book[:], book)
	q.book[256] = float32(math.Inf(1))
	last := func(v float64) int { // the last code not above v (0 if none)
		g := 0
		for i, b := range book {
			if float64(b) <= v {
				g = i
			}
		}
		return g
	}
	for sign := range 2 {
		for e := range quant8Exps {
			for m := range 128 {
				scale := math.Ldexp(1, e-quant8Exps+1)
				lo, hi := scale*(1+float64(m)/128), scale*(1+float64(m+1)/128) // the bucket's values' magnitudes
				if e == 0 {
					lo = 0 // the smaller exponents too, down to 0
				}
				if sign == 1 {
					lo, hi = -hi, -lo
				}
				g := last(lo)
				if steps := last(hi) - g; steps > quant8Steps {
					panic(fmt.Sprintf("cpu: 8-bit code book: %d codes in the bucket [%v, %v]", steps, lo, hi))
				}
				q.guess[(sign*quant8Exps+e)*128+m] = uint8(g)
			}
		}
	}
	return q
}

// code is kernels.Quant8Code(book, x).
func (q *quant8Book) code(x float32) uint8 {
	b := math.Float32bits(x)
	e := int(b>>23&0xff) - (127 - quant8Exps + 1)
	if e >= quant8Exps { // |x| ≥ 2, an infinity or a NaN: not in the table
		return kernels.Quant8Code(q.book[:256], x)
	}
	lo := int(q.guess[(int(b>>31)*quant8Exps+max(e, 0))*128+int(b>>16&0x7f)])
	for range quant8Steps {
		lo += b2i(q.book[lo+1] <= x)
	}
	return uint8(lo + b2i(!(x-q.book[lo] <= q.book[lo+1]-x)))
}

// b2i is 1 for true, 0 for false (a SETcc, not a branch).
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// sumSquares is the sum of x's squares: in float32 over sixteen lanes
// with AVX-512 (the batch-norm pass with a mean of 0), added in float64,
// else in float64 over four accumulators.
func sumSquares(x []float32) float64 {
	if maskedPasses && len(x) > 0 {
		return sumSqDevPass(channel{f: x, planes: 1, ld: len(x), hw: len(x)}, 0)
	}
	var a [4]float64
	i := 0
	for ; i+4 <= len(x); i += 4 {
		for j := range a {
			v := float64(x[i+j])
			a[j] += v * v
		}
	}
	for ; i < len(x); i++ {
		a[0] += float64(x[i]) * float64(x[i])
	}
	return (a[0] + a[1]) + (a[2] + a[3])
}
