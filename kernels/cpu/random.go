package cpu

import (
	"fmt"
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
