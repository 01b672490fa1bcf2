package cpu

import (
	"math"

	"github.com/leangrad/leangrad/kernels"
)

// window calls f with the flat input index of every in-bounds element of the
// window of output pixel (i, j) of plane base.
func window(p kernels.PoolParams, base, i, j int, f func(idx int)) {
	for r := 0; r < p.KH; r++ {
		ih := i*p.SH - p.PH + r
		if ih < 0 || ih >= p.H {
			continue
		}
		for s := 0; s < p.KW; s++ {
			iw := j*p.SW - p.PW + s
			if iw >= 0 && iw < p.W {
				f(base + ih*p.W + iw)
			}
		}
	}
}

// forOutputs runs f over every output pixel, planes in parallel.
func forOutputs(p kernels.PoolParams, f func(base, o, i, j int)) {
	oh, ow := p.OutH(), p.OutW()
	parallel(p.N*p.C, 1, func(lo, hi int) {
		for plane := lo; plane < hi; plane++ {
			for i := 0; i < oh; i++ {
				for j := 0; j < ow; j++ {
					f(plane*p.H*p.W, (plane*oh+i)*ow+j, i, j)
				}
			}
		}
	})
}

// argmax is the flat input index of the first maximum of a window.
func argmax(p kernels.PoolParams, xs []float32, base, i, j int) int {
	best, bi := float32(math.Inf(-1)), -1
	window(p, base, i, j, func(idx int) {
		if v := xs[idx]; v > best || bi < 0 {
			best, bi = v, idx
		}
	})
	return bi
}

// MaxPool2d computes the maximum of each window (padding ignored).
func (c *Backend) MaxPool2d(p kernels.PoolParams, x, y kernels.Buf) {
	kernels.CheckPool("max pool", p, x, y)
	xs, doneX := view(x)
	defer doneX()
	ys, done := out(y)
	forOutputs(p, func(base, o, i, j int) { ys[o] = xs[argmax(p, xs, base, i, j)] })
	done()
}

// MaxPool2dBackward adds each dy to the first maximum of its window.
func (c *Backend) MaxPool2dBackward(p kernels.PoolParams, x, dy, dx kernels.Buf) {
	kernels.CheckPool("max pool backward", p, x, dy)
	kernels.CheckLen("max pool backward", x.N, dx)
	xs, doneX := view(x)
	defer doneX()
	dys, doneDY := view(dy)
	defer doneDY()
	dxs, done := out(dx)
	clear(dxs)
	// Windows of one plane only touch that plane, so planes run in parallel.
	forOutputs(p, func(base, o, i, j int) { dxs[argmax(p, xs, base, i, j)] += dys[o] })
	done()
}

// AvgPool2d computes each window's sum over KH·KW.
func (c *Backend) AvgPool2d(p kernels.PoolParams, x, y kernels.Buf) {
	kernels.CheckPool("avg pool", p, x, y)
	xs, doneX := view(x)
	defer doneX()
	ys, done := out(y)
	inv := 1 / float32(p.KH*p.KW)
	forOutputs(p, func(base, o, i, j int) {
		var s float32
		window(p, base, i, j, func(idx int) { s += xs[idx] })
		ys[o] = s * inv
	})
	done()
}

// AvgPool2dBackward spreads each dy/(KH·KW) over its window.
func (c *Backend) AvgPool2dBackward(p kernels.PoolParams, dy, dx kernels.Buf) {
	kernels.CheckPool("avg pool backward", p, dx, dy)
	dys, doneDY := view(dy)
	defer doneDY()
	dxs, done := out(dx)
	clear(dxs)
	inv := 1 / float32(p.KH*p.KW)
	forOutputs(p, func(base, o, i, j int) {
		g := dys[o] * inv
		window(p, base, i, j, func(idx int) { dxs[idx] += g })
	})
	done()
}
