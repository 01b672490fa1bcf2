package cpu

import (
	"math"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu/internal/half"
	"github.com/x448/float16"
)

// span is one image's plane of a channel: float32 values (in place for
// F32, converted from F16 into scratch otherwise), or, on the half path,
// F16 values in place, which the passes load and store as they are.
type span struct {
	f []float32
	h []uint16
}

// halfPath reports whether a normalisation over vs runs its passes on F16
// planes in place: every buffer given is F16, and the CPU has the passes
// (halfPasses).
func halfPath(vs ...values) bool {
	if !halfPasses {
		return false
	}
	some := false
	for _, v := range vs {
		if v.f32 != nil {
			return false
		}
		some = some || v.f16 != nil
	}
	return some
}

// channelPlanes sets dst[n] to image n's HW values of channel ch of an
// N×C×HW array v: in place for F32 and, with half, for F16; otherwise F16
// converted once into buf (N·HW values), so that a normalisation's passes
// over the channel read float32 from cache; nil for no values.
func channelPlanes(v values, p kernels.BNParams, ch int, buf []float32, dst []span, half bool) []span {
	if v.f32 == nil && v.f16 == nil {
		return nil
	}
	for n := range dst {
		off := (n*p.C + ch) * p.HW
		if half {
			dst[n] = span{h: v.f16[off : off+p.HW]}
			continue
		}
		dst[n] = span{f: v.span(off, p.HW, buf[n*p.HW:])}
	}
	return dst
}

// channelTargets is channelPlanes for values about to be written: in place
// for F32 and, with half, F16; buf for F16 otherwise (then commitChannel
// rounds them in).
func channelTargets(v values, p kernels.BNParams, ch int, buf []float32, dst []span, half bool) []span {
	if v.f32 == nil && v.f16 == nil {
		return nil
	}
	for n := range dst {
		off := (n*p.C + ch) * p.HW
		if half {
			dst[n] = span{h: v.f16[off : off+p.HW]}
			continue
		}
		dst[n] = span{f: v.target(off, p.HW, buf[n*p.HW:])}
	}
	return dst
}

// commitChannel stores what channelTargets returned (nothing to do in
// place).
func commitChannel(v values, p kernels.BNParams, ch int, planes []span) {
	for n, t := range planes {
		if t.f != nil {
			v.commit((n*p.C+ch)*p.HW, t.f)
		}
	}
}

// plane is planes[n], or no values without planes.
func plane(planes []span, n int) span {
	if planes == nil {
		return span{}
	}
	return planes[n]
}

// channelBufs are one goroutine's scratch for the channels of a
// normalisation: k buffers of N·HW values and their plane slices.
type channelBufs struct {
	buf    [][]float32
	planes [][]span
}

// newChannelBufs makes k buffers, or only the plane slices with half
// (nothing is converted).
func newChannelBufs(p kernels.BNParams, k int, half bool) channelBufs {
	cb := channelBufs{buf: make([][]float32, k), planes: make([][]span, k)}
	for i := range cb.buf {
		if !half {
			cb.buf[i] = getScratch(p.N * p.HW)
		}
		cb.planes[i] = make([]span, p.N)
	}
	return cb
}

func (cb channelBufs) release() {
	for _, b := range cb.buf {
		putScratch(b)
	}
}

// affineAct writes y = x·scale + shift (+ residual), through the ReLU with
// relu: the output of a normalisation whose statistics are folded into
// scale and shift.
func affineAct(y, x, res []float32, scale, shift float32, relu bool) {
	n := affineVec(y, x, res, scale, shift, relu)
	y, x = y[n:len(x)], x[n:]
	if res != nil {
		res = res[n : len(x)+n]
		for i, v := range x {
			y[i] = v*scale + shift + res[i]
		}
	} else {
		for i, v := range x {
			y[i] = v*scale + shift
		}
	}
	if relu {
		for i, v := range y {
			y[i] = max(v, 0)
		}
	}
}

// sum32 is Σ x, summed in float32 (sixteen lanes at a time with AVX-512,
// over four interleaved accumulators otherwise, so the additions overlap)
// and returned as float64.
func sum32(x []float32) float64 {
	n, v := sumVec(x)
	var s0, s1, s2, s3 float32
	i := n
	for ; i+4 <= len(x); i += 4 {
		v := x[i : i+4 : i+4]
		s0 += v[0]
		s1 += v[1]
		s2 += v[2]
		s3 += v[3]
	}
	for ; i < len(x); i++ {
		s0 += x[i]
	}
	return float64(v) + float64(s0) + float64(s1) + float64(s2) + float64(s3)
}

// sumSqDev is Σ (x − mean)², accumulated as sum32.
func sumSqDev(x []float32, mean float32) float64 {
	n, v := sumSqDevVec(x, mean)
	var s0, s1, s2, s3 float32
	i := n
	for ; i+4 <= len(x); i += 4 {
		v := x[i : i+4 : i+4]
		d0, d1, d2, d3 := v[0]-mean, v[1]-mean, v[2]-mean, v[3]-mean
		s0 += d0 * d0
		s1 += d1 * d1
		s2 += d2 * d2
		s3 += d3 * d3
	}
	for ; i < len(x); i++ {
		d := x[i] - mean
		s0 += d * d
	}
	return float64(v) + float64(s0) + float64(s1) + float64(s2) + float64(s3)
}

// bnGrad returns Σ g and Σ g·(x − mean) over one plane for batch norm's
// backward, with g = dy, or dy where y > 0 when y is given (the ReLU's mask),
// and stores g into gout when it is given (the residual's gradient).
func bnGrad(dy, y, x []float32, mean float32, gout []float32) (sumG, sumGX float64) {
	n, sb, sx := bnGradVec(dy, y, x, mean, gout)
	sumG, sumGX = float64(sb), float64(sx)
	var b0, b1, x0, x1 float32
	for i := n; i < len(dy); i++ {
		g := dy[i]
		if y != nil && y[i] <= 0 {
			g = 0
		}
		if gout != nil {
			gout[i] = g
		}
		if i&1 == 0 {
			b0 += g
			x0 += g * (x[i] - mean)
		} else {
			b1 += g
			x1 += g * (x[i] - mean)
		}
	}
	return sumG + float64(b0) + float64(b1), sumGX + float64(x0) + float64(x1)
}

// bnApply writes batch norm's dx = a·g + b·x + c over one plane, g as in
// bnGrad.
func bnApply(dx, dy, y, x []float32, a, b, c float32) {
	for i := bnApplyVec(dx, dy, y, x, a, b, c); i < len(dy); i++ {
		g := dy[i]
		if y != nil && y[i] <= 0 {
			g = 0
		}
		dx[i] = a*g + b*x[i] + c
	}
}

// The passes over a span: the float32 functions above, or, for F16 spans,
// the half passes over the leading multiples of 16 and the float32
// functions over the rest, converted through a few values on the stack.

// tailOf is h from n on, or nil for no values.
func tailOf(h []uint16, n int) []uint16 {
	if h == nil {
		return nil
	}
	return h[n:]
}

// floatsOf converts h into buf (or, were h longer, into a new slice); nil
// for no values. A tail is a few values: a table lookup each.
func floatsOf(h []uint16, buf *[16]float32) []float32 {
	if h == nil {
		return nil
	}
	if len(h) > len(buf) {
		f := make([]float32, len(h))
		halfsToFloats(f, h)
		return f
	}
	f := buf[:len(h)]
	table := half.Table()
	for i, v := range h {
		f[i] = table[v]
	}
	return f
}

// storeTail rounds a tail's few values f into h, one at a time.
func storeTail(h []uint16, f []float32) {
	for i, v := range f {
		h[i] = float16.Fromfloat32(v).Bits()
	}
}

// outFloats is room for n values in buf (or a new slice).
func outFloats(n int, buf *[16]float32) []float32 {
	if n > len(buf) {
		return make([]float32, n)
	}
	return buf[:n]
}

func sumSpan(x span) float64 {
	if x.h == nil {
		return sum32(x.f)
	}
	n, v := sumHalfVec(x.h)
	var b [16]float32
	return float64(v) + sum32(floatsOf(x.h[n:], &b))
}

func sumSqDevSpan(x span, mean float32) float64 {
	if x.h == nil {
		return sumSqDev(x.f, mean)
	}
	n, v := sumSqDevHalfVec(x.h, mean)
	var b [16]float32
	return float64(v) + sumSqDev(floatsOf(x.h[n:], &b), mean)
}

func affineSpan(y, x, res span, scale, shift float32, relu bool) {
	if x.h == nil {
		affineAct(y.f, x.f, res.f, scale, shift, relu)
		return
	}
	n := affineHalfVec(y.h, x.h, res.h, scale, shift, relu)
	if n == len(x.h) {
		return
	}
	var xb, rb, yb [16]float32
	yt := outFloats(len(x.h)-n, &yb)
	affineAct(yt, floatsOf(x.h[n:], &xb), floatsOf(tailOf(res.h, n), &rb), scale, shift, relu)
	storeTail(y.h[n:], yt)
}

func bnGradSpan(dy, y, x span, mean float32, g span) (sumG, sumGX float64) {
	if dy.h == nil {
		return bnGrad(dy.f, y.f, x.f, mean, g.f)
	}
	n, sb, sx := bnGradHalfVec(dy.h, y.h, x.h, mean, g.h)
	if n == len(dy.h) {
		return float64(sb), float64(sx)
	}
	var db, yb, xb, gb [16]float32
	var gt []float32
	if g.h != nil {
		gt = outFloats(len(dy.h)-n, &gb)
	}
	tb, tx := bnGrad(floatsOf(dy.h[n:], &db), floatsOf(tailOf(y.h, n), &yb), floatsOf(x.h[n:], &xb), mean, gt)
	if gt != nil {
		storeTail(g.h[n:], gt)
	}
	return float64(sb) + tb, float64(sx) + tx
}

func bnApplySpan(dx, dy, y, x span, a, b, c float32) {
	if dy.h == nil {
		bnApply(dx.f, dy.f, y.f, x.f, a, b, c)
		return
	}
	n := bnApplyHalfVec(dx.h, dy.h, y.h, x.h, a, b, c)
	if n == len(dy.h) {
		return
	}
	var db, yb, xb, ob [16]float32
	dt := outFloats(len(dy.h)-n, &ob)
	bnApply(dt, floatsOf(dy.h[n:], &db), floatsOf(tailOf(y.h, n), &yb), floatsOf(x.h[n:], &xb), a, b, c)
	storeTail(dx.h[n:], dt)
}

// BatchNormTrain normalises with batch statistics (two passes, summed in
// float64), adds the residual, applies the ReLU and updates the running
// statistics (the variance unbiased) in place.
func (c *Backend) BatchNormTrain(p kernels.BNParams, x, residual, gamma, beta, y, runMean, runVar, saveMean, saveInvStd kernels.Buf) {
	kernels.CheckBN("batch norm", p, x, gamma, beta, runMean, runVar, saveMean, saveInvStd)
	kernels.CheckLen("batch norm output", x.N, y)
	kernels.CheckLike("batch norm residual", x, residual)
	xv, resv, yv := valuesOf(x), optValuesOf(residual), valuesOf(y)
	half := halfPath(xv, resv, yv)
	gs, bs := in(gamma), in(beta)
	rm, doneRM := inout(runMean)
	rv, doneRV := inout(runVar)
	sm, sis := f32s(saveMean), f32s(saveInvStd)
	m := float64(p.N * p.HW)
	parallel(p.C, 1, func(lo, hi int) {
		cb := newChannelBufs(p, 3, half)
		defer cb.release()
		for ch := lo; ch < hi; ch++ {
			xs := channelPlanes(xv, p, ch, cb.buf[0], cb.planes[0], half)
			res := channelPlanes(resv, p, ch, cb.buf[1], cb.planes[1], half)
			var sum float64
			for _, x := range xs {
				sum += sumSpan(x)
			}
			mean := sum / m
			var sq float64
			mean32 := float32(mean)
			for _, x := range xs {
				sq += sumSqDevSpan(x, mean32)
			}
			variance := sq / m
			invStd := 1 / math.Sqrt(variance+float64(p.Eps))
			scale := float32(float64(gs[ch]) * invStd)
			shift := float32(float64(bs[ch]) - mean*float64(gs[ch])*invStd)
			ys := channelTargets(yv, p, ch, cb.buf[2], cb.planes[2], half)
			for n, x := range xs {
				affineSpan(ys[n], x, plane(res, n), scale, shift, p.ReLU)
			}
			commitChannel(yv, p, ch, ys)
			sm[ch], sis[ch] = float32(mean), float32(invStd)
			unbiased := variance
			if m > 1 {
				unbiased = variance * m / (m - 1)
			}
			mom := float64(p.Momentum)
			rm[ch] = float32((1-mom)*float64(rm[ch]) + mom*mean)
			rv[ch] = float32((1-mom)*float64(rv[ch]) + mom*unbiased)
		}
	})
	doneRM()
	doneRV()
}

// BatchNormEval normalises with the running statistics, adds the residual
// and applies the ReLU.
func (c *Backend) BatchNormEval(p kernels.BNParams, x, residual, gamma, beta, runMean, runVar, y kernels.Buf) {
	kernels.CheckBN("batch norm eval", p, x, gamma, beta, runMean, runVar)
	kernels.CheckLen("batch norm eval output", x.N, y)
	kernels.CheckLike("batch norm eval residual", x, residual)
	xv, resv, yv := valuesOf(x), optValuesOf(residual), valuesOf(y)
	half := halfPath(xv, resv, yv)
	gs, bs, rm, rv := in(gamma), in(beta), in(runMean), in(runVar)
	parallel(p.C, 1, func(lo, hi int) {
		cb := newChannelBufs(p, 3, half)
		defer cb.release()
		for ch := lo; ch < hi; ch++ {
			invStd := 1 / math.Sqrt(float64(rv[ch])+float64(p.Eps))
			scale := float32(float64(gs[ch]) * invStd)
			shift := bs[ch] - rm[ch]*scale
			xs := channelPlanes(xv, p, ch, cb.buf[0], cb.planes[0], half)
			res := channelPlanes(resv, p, ch, cb.buf[1], cb.planes[1], half)
			ys := channelTargets(yv, p, ch, cb.buf[2], cb.planes[2], half)
			for n, x := range xs {
				affineSpan(ys[n], x, plane(res, n), scale, shift, p.ReLU)
			}
			commitChannel(yv, p, ch, ys)
		}
	})
}

// BatchNormBackward computes, with g = dy (masked by y > 0 with the ReLU),
//
//	dβ = Σ g,  dγ = Σ g·x̂,  dx = γ·invstd/M · (M·g − dβ − x̂·dγ),  dresidual = g
//
// with x̂ = (x − mean)·invstd and M = N·HW.
func (c *Backend) BatchNormBackward(p kernels.BNParams, x, y, dy, gamma, saveMean, saveInvStd, dx, dresidual, dgamma, dbeta kernels.Buf) {
	kernels.CheckBN("batch norm backward", p, x, gamma, saveMean, saveInvStd, dgamma, dbeta)
	kernels.CheckLen("batch norm backward", x.N, dy, dx)
	kernels.CheckLike("batch norm backward residual gradient", dx, dresidual)
	var yv values
	if p.ReLU {
		kernels.CheckLen("batch norm backward output", x.N, y)
		yv = valuesOf(y)
	}
	xv, dyv, dxv, drv := valuesOf(x), valuesOf(dy), valuesOf(dx), optValuesOf(dresidual)
	half := halfPath(xv, yv, dyv, dxv, drv)
	gamma32, sm, sis := in(gamma), f32s(saveMean), f32s(saveInvStd)
	dgs, doneG := out(dgamma)
	dbs, doneB := out(dbeta)
	m := float64(p.N * p.HW)
	parallel(p.C, 1, func(lo, hi int) {
		cb := newChannelBufs(p, 5, half)
		defer cb.release()
		for ch := lo; ch < hi; ch++ {
			mean, invStd := float64(sm[ch]), float64(sis[ch])
			mean32 := float32(mean)
			dys := channelPlanes(dyv, p, ch, cb.buf[0], cb.planes[0], half)
			ys := channelPlanes(yv, p, ch, cb.buf[1], cb.planes[1], half)
			xs := channelPlanes(xv, p, ch, cb.buf[2], cb.planes[2], half)
			gs := channelTargets(drv, p, ch, cb.buf[3], cb.planes[3], half)
			var db, dxm float64
			for n, dy := range dys {
				sb, sx := bnGradSpan(dy, plane(ys, n), xs[n], mean32, plane(gs, n))
				db += sb
				dxm += sx
			}
			commitChannel(drv, p, ch, gs)
			dg := dxm * invStd
			dbs[ch], dgs[ch] = float32(db), float32(dg)
			// dx = k·(g − db/M − x̂·dg/M) = a·g + b·x + c
			k := float64(gamma32[ch]) * invStd
			a := float32(k)
			bx := float32(-k * invStd * dg / m)
			c := float32(-k*db/m + k*invStd*dg/m*mean)
			dxs := channelTargets(dxv, p, ch, cb.buf[4], cb.planes[4], half)
			for n, dy := range dys {
				bnApplySpan(dxs[n], dy, plane(ys, n), xs[n], a, bx, c)
			}
			commitChannel(dxv, p, ch, dxs)
		}
	})
	doneG()
	doneB()
}
