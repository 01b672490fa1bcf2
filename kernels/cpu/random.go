package cpu

import (
	"fmt"
	"math"
	"slices"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
)

// Uniform fills dst from g; element i uses word i%4 of Philox block i/4.
func (c *Backend) Uniform(dst kernels.Buf, lo, hi float32, g kernels.Philox) {
	g = resolve(g)
	o, done := out(dst)
	parallel(len(o)/4+1, 1<<12, func(b0, b1 int) {
		for b := b0; b < b1; b++ {
			w := kernels.PhiloxBlock(g.Seed, g.Offset+uint64(b))
			for j := 0; j < 4 && 4*b+j < len(o); j++ {
				o[4*b+j] = lo + (hi-lo)*kernels.ToUniform(w[j])
			}
		}
	})
	done()
}

// Normal fills dst from g with Box–Muller pairs.
func (c *Backend) Normal(dst kernels.Buf, mean, std float32, g kernels.Philox) {
	g = resolve(g)
	o, done := out(dst)
	parallel(len(o)/4+1, 1<<12, func(b0, b1 int) {
		for b := b0; b < b1; b++ {
			w := kernels.PhiloxBlock(g.Seed, g.Offset+uint64(b))
			z0, z1 := kernels.BoxMuller(w[0], w[1])
			z2, z3 := kernels.BoxMuller(w[2], w[3])
			for j, z := range [4]float32{z0, z1, z2, z3} {
				if 4*b+j < len(o) {
					o[4*b+j] = mean + std*z
				}
			}
		}
	})
	done()
}

// Dropout keeps element i when its uniform is at least p, scaling it by 1/(1−p).
func (c *Backend) Dropout(dst, x kernels.Buf, p float32, g kernels.Philox) {
	if p < 0 || p >= 1 {
		panic(fmt.Sprintf("cpu: dropout probability %v outside [0, 1)", p))
	}
	kernels.CheckLen("dropout", x.N, dst)
	g = resolve(g)
	xs, doneX := view(x)
	defer doneX()
	o, done := out(dst)
	scale := 1 / (1 - p)
	parallel(len(o)/4+1, 1<<12, func(b0, b1 int) {
		for b := b0; b < b1; b++ {
			w := kernels.PhiloxBlock(g.Seed, g.Offset+uint64(b))
			for j := 0; j < 4 && 4*b+j < len(o); j++ {
				i := 4*b + j
				if kernels.ToUniform(w[j]) >= p {
					o[i] = xs[i] * scale
				} else {
					o[i] = 0
				}
			}
		}
	})
	done()
}

// resolve folds g's device Base, if any, into its Offset.
func resolve(g kernels.Philox) kernels.Philox {
	if g.Base.Valid() {
		kernels.CheckCounter("philox base", g.Base)
		g.Offset += uint64(*counter(g.Base))
		g.Base = kernels.Buf{}
	}
	return g
}

// counter is the int64 a counter buffer holds.
func counter(b kernels.Buf) *int64 { return (*int64)(unsafe.Pointer(&raw(b)[0])) }

// Sample draws each row's token as kernels.SampleParams describes: sums
// in float64, a row a goroutine.
func (c *Backend) Sample(p kernels.SampleParams, logits, temperature, topK, topP, seeds, steps, tokens, logprobs, topTokens, topLogprobs kernels.Buf) {
	kernels.CheckSample(p, logits, temperature, topK, topP, seeds, steps, tokens, logprobs, topTokens, topLogprobs)
	lv := valuesOf(logits)
	temp, ks, ps, sd, st := f32s(temperature), i32s(topK), f32s(topP), i32s(seeds), i32s(steps)
	tok, lp := i32s(tokens), f32s(logprobs)
	var tt []int32
	var tl []float32
	if p.TopN > 0 {
		tt, tl = i32s(topTokens), f32s(topLogprobs)
	}
	parallel(p.Rows, 1, func(lo, hi int) {
		buf := make([]float32, p.V)
		w := make([]float32, p.V)
		for r := lo; r < hi; r++ {
			z := lv.span(r*p.V, p.V, buf)
			best := 0
			for i, x := range z {
				if x > z[best] {
					best = i
				}
			}
			m := z[best]
			var sum float64
			for _, x := range z {
				sum += float64(expf(x - m))
			}
			logZ := m + float32(math.Log(sum))
			pick := best
			if t := temp[r]; t > 0 {
				seed := uint64(uint32(sd[2*r])) | uint64(uint32(sd[2*r+1]))<<32
				u := kernels.ToUniform(kernels.PhiloxBlock(seed, uint64(uint32(st[r])))[0])
				pick = sampleRow(z, w, m, t, int(ks[r]), ps[r], u)
			}
			tok[r], lp[r] = int32(pick), z[pick]-logZ
			for n := range p.TopN {
				b := -1
				for i, x := range z {
					if slices.Contains(tt[r*p.TopN:r*p.TopN+n], int32(i)) {
						continue
					}
					if b < 0 || x > z[b] {
						b = i
					}
				}
				tt[r*p.TopN+n], tl[r*p.TopN+n] = int32(b), z[b]-logZ
			}
		}
	})
}

// sampleRow draws from the row z (whose maximum is m) at temperature t,
// restricted to its top k and then its top p, with the uniform u in [0, 1),
// by kernels.SampleParams' rule; w is scratch of z's length.
func sampleRow(z, w []float32, m, t float32, k int, topP, u float32) int {
	lo, inv := float32(0), 1/t
	for i, x := range z {
		w[i] = (x - m) * inv
		lo = min(lo, w[i])
	}
	cut := float32(math.Inf(-1))
	if k > 0 && k < len(z) {
		hi := float32(0)
		for range kernels.SampleRounds {
			mid := (lo + hi) * 0.5
			n := 0
			for _, x := range w {
				if x >= mid {
					n++
				}
			}
			if n >= k {
				lo = mid
			} else {
				hi = mid
			}
		}
		cut = lo
	}
	var total float64
	for i, x := range w {
		if x >= cut {
			w[i] = expf(x)
		} else {
			w[i] = 0
		}
		total += float64(w[i])
	}
	floor := float32(0)
	if topP < 1 {
		lo, hi := float32(0), float32(1)
		need := float64(topP) * total
		for range kernels.SampleRounds {
			mid := (lo + hi) * 0.5
			var s float64
			for _, e := range w {
				if e >= mid {
					s += float64(e)
				}
			}
			if s >= need {
				lo = mid
			} else {
				hi = mid
			}
		}
		floor = lo
	}
	var kept float64
	last := 0
	for i, e := range w {
		if e > 0 && e >= floor {
			kept += float64(e)
			last = i
		}
	}
	target := float64(u) * kept
	var acc float64
	for i, e := range w {
		if e > 0 && e >= floor {
			if acc += float64(e); acc > target {
				return i
			}
		}
	}
	return last
}
