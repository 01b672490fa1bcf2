package cpu

import (
	"slices"
	"sync"

	"github.com/leangrad/leangrad/kernels"
)

// Convolution by im2col: for one image, the column matrix holds, for each
// filter tap (c, r, s) (a row) and each output pixel (a column), the input
// value under that tap, zero in the padding. The convolution is then one
// matrix product: y[n] (K×OH·OW) = w (K×C·R·S) · col (C·R·S×OH·OW).

// direct reports whether the convolution is a plain 1×1 product, for which
// the column matrix is the input itself.
func direct(p kernels.ConvParams) bool {
	return p.R == 1 && p.S == 1 && p.StrideH == 1 && p.StrideW == 1 && p.PadH == 0 && p.PadW == 0
}

func im2col(p kernels.ConvParams, x, col []float32) {
	oh, ow := p.OutH(), p.OutW()
	l := oh * ow
	for c := 0; c < p.C; c++ {
		plane := x[c*p.H*p.W : (c+1)*p.H*p.W]
		for r := 0; r < p.R; r++ {
			for s := 0; s < p.S; s++ {
				dst := col[((c*p.R+r)*p.S+s)*l:][:l]
				j0, j1 := validRange(ow, p.W, p.StrideW, p.PadW, s)
				for i := 0; i < oh; i++ {
					row := dst[i*ow : (i+1)*ow]
					ih := i*p.StrideH - p.PadH + r
					if ih < 0 || ih >= p.H || j0 >= j1 {
						clear(row)
						continue
					}
					src := plane[ih*p.W : (ih+1)*p.W]
					clear(row[:j0])
					clear(row[j1:])
					if p.StrideW == 1 {
						copy(row[j0:j1], src[j0-p.PadW+s:])
						continue
					}
					for j := j0; j < j1; j++ {
						row[j] = src[j*p.StrideW-p.PadW+s]
					}
				}
			}
		}
	}
}

// validRange is the range [j0, j1) of output columns whose input column
// j·stride − pad + s lies inside a row of width w.
func validRange(ow, w, stride, pad, s int) (j0, j1 int) {
	// j·stride ≥ pad − s  and  j·stride ≤ w − 1 + pad − s
	lo := pad - s
	if lo > 0 {
		j0 = (lo + stride - 1) / stride
	}
	hi := w - 1 + pad - s
	if hi < 0 {
		return 0, 0
	}
	j1 = min(ow, hi/stride+1)
	return min(j0, j1), j1
}

// col2im adds the column matrix back into the image it was gathered from.
func col2im(p kernels.ConvParams, col, x []float32) {
	oh, ow := p.OutH(), p.OutW()
	l := oh * ow
	for c := 0; c < p.C; c++ {
		plane := x[c*p.H*p.W : (c+1)*p.H*p.W]
		for r := 0; r < p.R; r++ {
			for s := 0; s < p.S; s++ {
				src := col[((c*p.R+r)*p.S+s)*l:][:l]
				j0, j1 := validRange(ow, p.W, p.StrideW, p.PadW, s)
				for i := 0; i < oh; i++ {
					ih := i*p.StrideH - p.PadH + r
					if ih < 0 || ih >= p.H || j0 >= j1 {
						continue
					}
					dst := plane[ih*p.W : (ih+1)*p.W]
					row := src[i*ow : (i+1)*ow]
					if p.StrideW == 1 {
						d := dst[j0-p.PadW+s:][:j1-j0]
						for j, v := range row[j0:j1] {
							d[j] += v
						}
						continue
					}
					for j := j0; j < j1; j++ {
						dst[j*p.StrideW-p.PadW+s] += row[j]
					}
				}
			}
		}
	}
}

// Conv2d computes y from x and w.
func (c *Backend) Conv2d(p kernels.ConvParams, x, w, y kernels.Buf) {
	kernels.CheckConv("conv2d", p, x, w, y)
	xs, ws := in(x), in(w)
	ys, done := out(y)
	chw, crs, l := p.C*p.H*p.W, p.C*p.R*p.S, p.OutH()*p.OutW()
	parallel(p.N, 1, func(lo, hi int) {
		var col []float32
		if !direct(p) {
			col = make([]float32, crs*l)
		}
		for n := lo; n < hi; n++ {
			img := xs[n*chw : (n+1)*chw]
			if direct(p) {
				col = img
			} else {
				im2col(p, img, col)
			}
			sgemm(false, false, p.K, l, crs, 1, ws, col, 0, ys[n*p.K*l:])
		}
	})
	done()
}

// Conv2dBackwardData computes dx = col2im(wᵀ·dy) image by image.
func (c *Backend) Conv2dBackwardData(p kernels.ConvParams, dy, w, dx kernels.Buf) {
	kernels.CheckConv("conv2d backward data", p, dx, w, dy)
	dys, ws := in(dy), in(w)
	dxs, done := out(dx)
	chw, crs, l := p.C*p.H*p.W, p.C*p.R*p.S, p.OutH()*p.OutW()
	parallel(p.N, 1, func(lo, hi int) {
		col := make([]float32, crs*l)
		for n := lo; n < hi; n++ {
			img := dxs[n*chw : (n+1)*chw]
			if direct(p) {
				sgemm(true, false, crs, l, p.K, 1, ws, dys[n*p.K*l:], 0, img)
				continue
			}
			sgemm(true, false, crs, l, p.K, 1, ws, dys[n*p.K*l:], 0, col)
			clear(img)
			col2im(p, col, img)
		}
	})
	done()
}

// Conv2dBackwardFilter computes dw = Σₙ dy[n]·col[n]ᵀ, each goroutine
// accumulating its images before the partial sums are added.
func (c *Backend) Conv2dBackwardFilter(p kernels.ConvParams, x, dy, dw kernels.Buf) {
	kernels.CheckConv("conv2d backward filter", p, x, dw, dy)
	xs, dys := in(x), in(dy)
	dws, done := out(dw)
	chw, crs, l := p.C*p.H*p.W, p.C*p.R*p.S, p.OutH()*p.OutW()
	// Partial sums are added in image order, so the result is deterministic.
	type partial struct {
		lo  int
		acc []float32
	}
	var (
		mu       sync.Mutex
		partials []partial
	)
	parallel(p.N, 1, func(lo, hi int) {
		acc := make([]float32, p.K*crs)
		var col []float32
		if !direct(p) {
			col = make([]float32, crs*l)
		}
		for n := lo; n < hi; n++ {
			img := xs[n*chw : (n+1)*chw]
			if direct(p) {
				col = img
			} else {
				im2col(p, img, col)
			}
			sgemm(false, true, p.K, crs, l, 1, dys[n*p.K*l:], col, 1, acc)
		}
		mu.Lock()
		partials = append(partials, partial{lo, acc})
		mu.Unlock()
	})
	slices.SortFunc(partials, func(a, b partial) int { return a.lo - b.lo })
	copy(dws, partials[0].acc)
	for _, part := range partials[1:] {
		for i, v := range part.acc {
			dws[i] += v
		}
	}
	done()
}
