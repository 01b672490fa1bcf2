package cpu

import (
	"math"

	"github.com/leangrad/leangrad/kernels"
)

// Batch norm runs a channel at a time: N planes of HW values, C·HW apart in
// an N×C×HW array. With AVX-512 (maskedPasses) each pass over a channel is one
// assembly call (norm_amd64.s) over float32 planes in place or, on the half
// path, F16 planes in place; otherwise Go loops run a plane at a time over
// float32 planes, F16 and BF16 ones converted into scratch first.

// halfPath reports whether a normalisation over vs runs its passes on F16
// planes in place: every buffer given is F16, and the CPU has the passes
// (halfPasses).
func halfPath(vs ...values) bool {
	if !halfPasses {
		return false
	}
	some := false
	for _, v := range vs {
		if v.f32 != nil || v.bf16 != nil {
			return false
		}
		some = some || v.f16 != nil
	}
	return some
}

// channel is one channel's planes: float32 values (in place for F32,
// converted from F16 into scratch otherwise) or, on the half path, F16
// values in place, which the passes load and store as they are; neither for
// no values. Plane n is values [n·ld, n·ld+hw).
type channel struct {
	f              []float32
	h              []uint16
	planes, ld, hw int
}

// channelOf is channel ch of the N×C×HW array v: in place for F32 and, with
// half, for F16; otherwise F16 converted into buf (N·HW values, planes HW
// apart) when read, so that the passes read float32 from cache, or buf as
// room for values about to be written (commit rounds them in).
func channelOf(v values, p kernels.BNParams, ch int, buf []float32, half, read bool) channel {
	c := channel{planes: p.N, ld: p.C * p.HW, hw: p.HW}
	off, n := ch*p.HW, (p.N-1)*p.C*p.HW+p.HW
	switch {
	case v.f32 != nil:
		c.f = v.f32[off : off+n]
	case v.f16 != nil && half:
		c.h = v.f16[off : off+n]
	case !v.none():
		c.f, c.ld = buf[:p.N*p.HW], p.HW
		for i := 0; read && i < p.N; i++ {
			v.read(c.plane(i), off+i*p.C*p.HW)
		}
	}
	return c
}

// commit rounds values written into a converted channel back into v
// (nothing to do in place).
func (c channel) commit(v values, p kernels.BNParams, ch int) {
	if v.f32 != nil || v.none() || c.f == nil {
		return
	}
	c.store(v, p, ch)
}

// scratchChannel is channel ch of v in buf (N·HW values, planes HW apart)
// whatever v's dtype, read into it with read: the layout of a channel that
// exists only in scratch.
func scratchChannel(v values, p kernels.BNParams, ch int, buf []float32, read bool) channel {
	c := channel{f: buf[:p.N*p.HW], planes: p.N, ld: p.HW, hw: p.HW}
	for i := 0; read && i < p.N; i++ {
		v.read(c.plane(i), ch*p.HW+i*p.C*p.HW)
	}
	return c
}

// store writes a scratchChannel's values into channel ch of v.
func (c channel) store(v values, p kernels.BNParams, ch int) {
	for i := range c.planes {
		v.write(ch*p.HW+i*p.C*p.HW, c.plane(i))
	}
}

// plane is plane n's float32 values, or nil for none.
func (c channel) plane(n int) []float32 {
	if c.f == nil {
		return nil
	}
	return c.f[n*c.ld : n*c.ld+c.hw]
}

// assembly reports whether the passes over these channels run in assembly:
// the CPU has them, and the channels given share one layout (a mix of F32
// in place and F16 converted does not).
func assembly(cs ...channel) bool {
	if !maskedPasses {
		return false
	}
	ld := -1
	for _, c := range cs {
		if c.f == nil && c.h == nil {
			continue
		}
		if ld >= 0 && c.ld != ld {
			return false
		}
		ld = c.ld
	}
	return true
}

// channelBufs are one goroutine's scratch for the channels of a
// normalisation: k buffers of N·HW values, or none on the half path
// (nothing is converted).
type channelBufs [][]float32

func newChannelBufs(p kernels.BNParams, k int, half bool) channelBufs {
	cb := make(channelBufs, k)
	for i := range cb {
		if !half {
			cb[i] = getScratch(p.N * p.HW)
		}
	}
	return cb
}

func (cb channelBufs) release() {
	for _, b := range cb {
		putScratch(b)
	}
}

// affineAct writes y = x·scale + shift (+ residual), through the ReLU with
// relu: the output of a normalisation whose statistics are folded into
// scale and shift.
func affineAct(y, x, res []float32, scale, shift float32, relu bool) {
	y = y[:len(x)]
	if res != nil {
		res = res[:len(x)]
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

// sum32 is Σ x, summed in float32 over four interleaved accumulators (so
// the additions overlap) and returned as float64.
func sum32(x []float32) float64 {
	var s0, s1, s2, s3 float32
	i := 0
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
	return float64(s0) + float64(s1) + float64(s2) + float64(s3)
}

// sumSqDev is Σ (x − mean)², accumulated as sum32.
func sumSqDev(x []float32, mean float32) float64 {
	var s0, s1, s2, s3 float32
	i := 0
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
	return float64(s0) + float64(s1) + float64(s2) + float64(s3)
}

// bnGrad returns Σ g and Σ g·(x − mean) over one plane for batch norm's
// backward, with g = dy, or dy where y > 0 when y is given (the ReLU's mask),
// and stores g into gout when it is given (the residual's gradient).
func bnGrad(dy, y, x []float32, mean float32, gout []float32) (sumG, sumGX float64) {
	var b0, b1, x0, x1 float32
	for i := range dy {
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
	return float64(b0) + float64(b1), float64(x0) + float64(x1)
}

// bnApply writes batch norm's dx = a·g + b·x + c over one plane, g as in
// bnGrad.
func bnApply(dx, dy, y, x []float32, a, b, c float32) {
	for i := range dy {
		g := dy[i]
		if y != nil && y[i] <= 0 {
			g = 0
		}
		dx[i] = a*g + b*x[i] + c
	}
}

// The passes over a channel: one assembly call (see assembly), or the
// float32 functions above a plane at a time.

func (x channel) sum() float64 {
	if assembly(x) {
		return sumPass(x)
	}
	var s float64
	for n := range x.planes {
		s += sum32(x.plane(n))
	}
	return s
}

func (x channel) sumSqDev(mean float32) float64 {
	if assembly(x) {
		return sumSqDevPass(x, mean)
	}
	var s float64
	for n := range x.planes {
		s += sumSqDev(x.plane(n), mean)
	}
	return s
}

func affineChannel(y, x, res channel, scale, shift float32, relu bool) {
	if assembly(y, x, res) {
		affinePass(y, x, res, scale, shift, relu)
		return
	}
	for n := range x.planes {
		affineAct(y.plane(n), x.plane(n), res.plane(n), scale, shift, relu)
	}
}

func bnGradChannel(dy, y, x channel, mean float32, g channel) (sumG, sumGX float64) {
	if assembly(dy, y, x, g) {
		return bnGradPass(dy, y, x, mean, g)
	}
	for n := range dy.planes {
		sb, sx := bnGrad(dy.plane(n), y.plane(n), x.plane(n), mean, g.plane(n))
		sumG += sb
		sumGX += sx
	}
	return sumG, sumGX
}

func bnApplyChannel(dx, dy, y, x channel, a, b, c float32) {
	if assembly(dx, dy, y, x) {
		bnApplyPass(dx, dy, y, x, a, b, c)
		return
	}
	for n := range dy.planes {
		bnApply(dx.plane(n), dy.plane(n), y.plane(n), x.plane(n), a, b, c)
	}
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
			xs := channelOf(xv, p, ch, cb[0], half, true)
			res := channelOf(resv, p, ch, cb[1], half, true)
			mean := xs.sum() / m
			variance := xs.sumSqDev(float32(mean)) / m
			invStd := 1 / math.Sqrt(variance+float64(p.Eps))
			sm[ch], sis[ch] = float32(mean), float32(invStd)
			scale, shift := batchAffine(gs[ch], bs[ch], sm[ch], sis[ch])
			ys := channelOf(yv, p, ch, cb[2], half, false)
			affineChannel(ys, xs, res, scale, shift, p.ReLU)
			ys.commit(yv, p, ch)
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

// batchAffine is y = x·scale + shift for the batch statistics saved, in
// float64 from their F32 values, so that BatchNormApply computes what
// BatchNormTrain did.
func batchAffine(gamma, beta, mean, invStd float32) (scale, shift float32) {
	g, is := float64(gamma), float64(invStd)
	return float32(g * is), float32(float64(beta) - float64(mean)*g*is)
}

// BatchNormApply is BatchNormTrain's output from its saved statistics.
func (c *Backend) BatchNormApply(p kernels.BNParams, x, residual, gamma, beta, saveMean, saveInvStd, y kernels.Buf) {
	kernels.CheckBN("batch norm apply", p, x, gamma, beta, saveMean, saveInvStd)
	gs, bs, sm, sis := in(gamma), in(beta), in(saveMean), in(saveInvStd)
	applyChannels("batch norm apply", p, x, residual, y, func(ch int) (scale, shift float32) {
		return batchAffine(gs[ch], bs[ch], sm[ch], sis[ch])
	})
}

// BatchNormEval normalises with the running statistics, adds the residual
// and applies the ReLU.
func (c *Backend) BatchNormEval(p kernels.BNParams, x, residual, gamma, beta, runMean, runVar, y kernels.Buf) {
	kernels.CheckBN("batch norm eval", p, x, gamma, beta, runMean, runVar)
	gs, bs, rm, rv := in(gamma), in(beta), in(runMean), in(runVar)
	applyChannels("batch norm eval", p, x, residual, y, func(ch int) (scale, shift float32) {
		invStd := 1 / math.Sqrt(float64(rv[ch])+float64(p.Eps))
		scale = float32(float64(gs[ch]) * invStd)
		return scale, bs[ch] - rm[ch]*scale
	})
}

// applyChannels writes y = act(x·scale + shift + residual), each channel's
// scale and shift from affine.
func applyChannels(op string, p kernels.BNParams, x, residual, y kernels.Buf, affine func(ch int) (scale, shift float32)) {
	kernels.CheckLen(op+" output", x.N, y)
	kernels.CheckLike(op+" residual", x, residual)
	xv, resv, yv := valuesOf(x), optValuesOf(residual), valuesOf(y)
	half := halfPath(xv, resv, yv)
	parallel(p.C, 1, func(lo, hi int) {
		cb := newChannelBufs(p, 3, half)
		defer cb.release()
		for ch := lo; ch < hi; ch++ {
			scale, shift := affine(ch)
			xs := channelOf(xv, p, ch, cb[0], half, true)
			res := channelOf(resv, p, ch, cb[1], half, true)
			ys := channelOf(yv, p, ch, cb[2], half, false)
			affineChannel(ys, xs, res, scale, shift, p.ReLU)
			ys.commit(yv, p, ch)
		}
	})
}

// BatchNormBackward computes, with g = dy (masked by y > 0 with the ReLU),
//
//	dβ = Σ g,  dγ = Σ g·x̂,  dx = γ·invstd/M · (M·g − dβ − x̂·dγ),  dresidual = g
//
// with x̂ = (x − mean)·invstd and M = N·HW. Without y, each channel's y is
// written again, as BatchNormApply writes it from x and the residual, into
// scratch.
func (c *Backend) BatchNormBackward(p kernels.BNParams, x, y, residual, dy, gamma, beta, saveMean, saveInvStd, dx, dresidual, dgamma, dbeta kernels.Buf) {
	kernels.CheckBN("batch norm backward", p, x, gamma, saveMean, saveInvStd, dgamma, dbeta)
	kernels.CheckLen("batch norm backward", x.N, dy, dx)
	kernels.CheckLike("batch norm backward residual gradient", dx, dresidual)
	again := kernels.CheckBNMask("batch norm backward", p, x, y, residual, beta, dresidual)
	var yv, resv values
	if p.ReLU && !again {
		yv = valuesOf(y)
	}
	if again {
		resv = optValuesOf(residual)
	}
	xv, dyv, dxv, drv := valuesOf(x), valuesOf(dy), valuesOf(dx), optValuesOf(dresidual)
	half := !again && halfPath(xv, yv, dyv, dxv, drv)
	gamma32, sm, sis := in(gamma), f32s(saveMean), f32s(saveInvStd)
	var beta32 []float32
	if again {
		beta32 = in(beta)
	}
	dgs, doneG := out(dgamma)
	dbs, doneB := out(dbeta)
	m := float64(p.N * p.HW)
	parallel(p.C, 1, func(lo, hi int) {
		cb := newChannelBufs(p, 6, half)
		defer cb.release()
		var tmp []uint16
		if again && x.DType == kernels.F16 {
			tmp = make([]uint16, p.N*p.HW)
		}
		for ch := lo; ch < hi; ch++ {
			mean, invStd := float64(sm[ch]), float64(sis[ch])
			mean32 := float32(mean)
			var dys, ys, xs channel
			if again { // every channel in scratch, y's layout, so that the passes are those with y
				dys, xs = scratchChannel(dyv, p, ch, cb[0], true), scratchChannel(xv, p, ch, cb[2], true)
				ys = scratchChannel(values{}, p, ch, cb[1], false)
				var res channel
				if !resv.none() {
					res = scratchChannel(resv, p, ch, cb[5], true)
				}
				scale, shift := batchAffine(gamma32[ch], beta32[ch], sm[ch], sis[ch])
				affineChannel(ys, xs, res, scale, shift, true)
				roundLike(x.DType, ys.f, tmp)
			} else {
				dys = channelOf(dyv, p, ch, cb[0], half, true)
				ys = channelOf(yv, p, ch, cb[1], half, true)
				xs = channelOf(xv, p, ch, cb[2], half, true)
			}
			scratchG := again && !drv.none() // dresidual in scratch too: one layout, the passes with y's
			gs := channelOf(drv, p, ch, cb[3], half, false)
			if scratchG {
				gs = scratchChannel(drv, p, ch, cb[3], false)
			}
			db, dxm := bnGradChannel(dys, ys, xs, mean32, gs)
			if scratchG {
				gs.store(drv, p, ch)
			} else {
				gs.commit(drv, p, ch)
			}
			dg := dxm * invStd
			dbs[ch], dgs[ch] = float32(db), float32(dg)
			// dx = k·(g − db/M − x̂·dg/M) = a·g + b·x + c
			k := float64(gamma32[ch]) * invStd
			a := float32(k)
			bx := float32(-k * invStd * dg / m)
			c := float32(-k*db/m + k*invStd*dg/m*mean)
			var dxs channel
			if again {
				dxs = scratchChannel(dxv, p, ch, cb[4], false)
			} else {
				dxs = channelOf(dxv, p, ch, cb[4], half, false)
			}
			bnApplyChannel(dxs, dys, ys, xs, a, bx, c)
			if again {
				dxs.store(dxv, p, ch)
			} else {
				dxs.commit(dxv, p, ch)
			}
		}
	})
	doneG()
	doneB()
}

// LayerNorm normalises each row, with its statistics in float64.
func (c *Backend) LayerNorm(p kernels.LayerNormParams, x, gamma, beta, y, mean, rstd kernels.Buf) {
	kernels.CheckLayerNorm("layer norm", p, x, gamma, mean, rstd, y)
	kernels.CheckLen("layer norm bias", p.Cols, beta)
	kernels.CheckF32("layer norm bias", beta)
	xv, yv, g, b := valuesOf(x), valuesOf(y), f32s(gamma), f32s(beta)
	mu, rs := f32s(mean), f32s(rstd)
	parallel(p.Rows, max(1, elemGrain/p.Cols), func(lo, hi int) {
		xb, yb := getScratch(p.Cols), getScratch(p.Cols)
		defer putScratch(xb)
		defer putScratch(yb)
		for r := lo; r < hi; r++ {
			xs := xv.span(r*p.Cols, p.Cols, xb)
			var s float64
			for _, v := range xs {
				s += float64(v)
			}
			m := s / float64(p.Cols)
			var ss float64
			for _, v := range xs {
				d := float64(v) - m
				ss += d * d
			}
			inv := 1 / math.Sqrt(ss/float64(p.Cols)+float64(p.Eps))
			mu[r], rs[r] = float32(m), float32(inv)
			mf, is := float32(m), float32(inv)
			ys := yv.target(r*p.Cols, p.Cols, yb)
			for j, v := range xs {
				ys[j] = (v-mf)*is*g[j] + b[j]
			}
			yv.commit(r*p.Cols, ys)
		}
	})
}

// LayerNormBackward: dx = rstd·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂)) with ĝ = dy·γ
// (added to dx's values with p.Accumulate), per row; dγ = Σ dy·x̂ and dβ =
// Σ dy over the rows (and p.Sums = Σ dx), in blocks of rowBlock rows
// added in order.
func (c *Backend) LayerNormBackward(p kernels.LayerNormParams, x, gamma, mean, rstd, dy, dx, dgamma, dbeta kernels.Buf) {
	kernels.CheckLayerNorm("layer norm backward", p, x, gamma, mean, rstd, dy, dx)
	kernels.CheckLike("layer norm backward dx", x, dx)
	kernels.CheckLen("layer norm backward gradients", p.Cols, dgamma, dbeta)
	kernels.CheckF32("layer norm backward gradients", dgamma, dbeta)
	kernels.CheckLayerNormRounded("layer norm backward", p, dy, dx)
	xv, dyv, dxv, g := valuesOf(x), valuesOf(dy), valuesOf(dx), f32s(gamma)
	rv := optValuesOf(p.Rounded)
	mu, rs := f32s(mean), f32s(rstd)
	blocks := (p.Rows + rowBlock - 1) / rowBlock
	sets := 2
	if p.Sums.Valid() {
		sets = 3
	}
	partial := make([]float64, blocks*sets*p.Cols) // per block: dγ, dβ, then Σ dx
	parallel(blocks, 1, func(lo, hi int) {
		xb, gb, db := getScratch(p.Cols), getScratch(p.Cols), getScratch(p.Cols)
		defer putScratch(xb)
		defer putScratch(gb)
		defer putScratch(db)
		for blk := lo; blk < hi; blk++ {
			pg, pb := partial[blk*sets*p.Cols:][:p.Cols], partial[(blk*sets+1)*p.Cols:][:p.Cols]
			var pd []float64
			if sets == 3 {
				pd = partial[(blk*sets+2)*p.Cols:][:p.Cols]
			}
			for r := blk * rowBlock; r < min(p.Rows, (blk+1)*rowBlock); r++ {
				xs, gs := xv.span(r*p.Cols, p.Cols, xb), dyv.span(r*p.Cols, p.Cols, gb)
				m, is := mu[r], rs[r]
				var sg, sgx float64
				for j, v := range xs {
					xh := (v - m) * is
					gh := gs[j] * g[j]
					sg += float64(gh)
					sgx += float64(gh) * float64(xh)
					pg[j] += float64(gs[j]) * float64(xh)
					pb[j] += float64(gs[j])
				}
				mg, mgx := float32(sg/float64(p.Cols)), float32(sgx/float64(p.Cols))
				ds := dxv.target(r*p.Cols, p.Cols, db)
				for j, v := range xs {
					xh := (v - m) * is
					d := is * (gs[j]*g[j] - mg - xh*mgx)
					if p.Accumulate { // F32 (CheckLayerNorm): ds is dx itself
						d = ds[j] + float32(d) // the conversion rounds d first: no fused multiply-add
					}
					ds[j] = d
				}
				for j, d := range pd { // dx is F32 (CheckLayerNormRounded)
					pd[j] = d + float64(ds[j])
				}
				dxv.commit(r*p.Cols, ds)
				rv.commit(r*p.Cols, ds) // 16-bit: ds rounded
			}
		}
	})
	dg, dbt := f32s(dgamma), f32s(dbeta)
	var sums []float32
	if sets == 3 {
		sums = f32s(p.Sums)
	}
	for j := 0; j < p.Cols; j++ {
		var sg, sb, sd float64
		for blk := 0; blk < blocks; blk++ {
			sg += partial[blk*sets*p.Cols+j]
			sb += partial[(blk*sets+1)*p.Cols+j]
			if sums != nil {
				sd += partial[(blk*sets+2)*p.Cols+j]
			}
		}
		dg[j], dbt[j] = float32(sg), float32(sb)
		if sums != nil {
			sums[j] = float32(sd)
		}
	}
}
