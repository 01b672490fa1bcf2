package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/leangrad/leangrad/kernels"
)

// The operations the other tests of this file's package do not reach, each
// against a float64 reference written from its definition in kernels.Backend.

func TestAffineCopyArgMax(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 1))
	x, xv := randBuf(t, rng, 37)
	y := buf(t, kernels.F32, 37)
	be.Affine(y, x, -1.5, 0.25)
	want := make([]float64, len(xv))
	for i, v := range xv {
		want[i] = -1.5*v + 0.25
	}
	check(t, "affine", y, want, 1e-6)
	c := buf(t, kernels.F32, 37)
	be.Copy(c, x)
	check(t, "copy", c, xv, 0)

	// (3, 4, 5) along its middle axis, with ties in some columns: the first
	// maximum wins.
	a, av := randBuf(t, rng, 60)
	r := kernels.Reduction{Outer: 3, Len: 4, Inner: 5}
	for _, tie := range [][2]int{{0, 5}, {33, 38}} { // (0, 0|1, 0) and (1, 2|3, 3): maxima of their columns
		for _, i := range tie {
			f32s(a)[i], av[i] = 9, 9
		}
	}
	idx := buf(t, kernels.I32, 15)
	be.ArgMax(idx, a, r)
	got := i32s(idx)
	for o := 0; o < r.Outer; o++ {
		for in := 0; in < r.Inner; in++ {
			best := 0
			for j := 1; j < r.Len; j++ {
				if av[(o*r.Len+j)*r.Inner+in] > av[(o*r.Len+best)*r.Inner+in] {
					best = j
				}
			}
			if g := got[o*r.Inner+in]; int(g) != best {
				t.Errorf("argmax (%d, :, %d) = %d, want %d", o, in, g, best)
			}
		}
	}
}

// ReduceMaxBackward gives dy to every element equal to its maximum (ties
// included: each takes the whole dy, as the definition says).
func TestReduceMaxBackward(t *testing.T) {
	rng := rand.New(rand.NewPCG(12, 1))
	x, xv := randBuf(t, rng, 60)
	r := kernels.Reduction{Outer: 3, Len: 4, Inner: 5}
	for _, i := range []int{2, 7} { // (0, 0, 2) and (0, 1, 2): a tie for the maximum of (0, :, 2)
		f32s(x)[i], xv[i] = 9, 9
	}
	y := buf(t, kernels.F32, 15)
	be.Reduce(kernels.Max, y, x, r)
	dy, dyv := randBuf(t, rng, 15)
	dx := buf(t, kernels.F32, 60)
	be.ReduceMaxBackward(dx, dy, x, y, r)
	want := make([]float64, 60)
	for o := 0; o < r.Outer; o++ {
		for in := 0; in < r.Inner; in++ {
			m := math.Inf(-1)
			for j := 0; j < r.Len; j++ {
				m = math.Max(m, xv[(o*r.Len+j)*r.Inner+in])
			}
			for j := 0; j < r.Len; j++ {
				if i := (o*r.Len+j)*r.Inner + in; xv[i] == m {
					want[i] = dyv[o*r.Inner+in]
				}
			}
		}
	}
	check(t, "reduce max backward", dx, want, 0)
}

func TestPoolingBackward(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 1))
	for _, p := range []kernels.PoolParams{
		{N: 2, C: 3, H: 6, W: 6, KH: 2, KW: 2, SH: 2, SW: 2},
		{N: 1, C: 2, H: 7, W: 5, KH: 3, KW: 3, SH: 2, SW: 2, PH: 1, PW: 1}, // overlapping windows, padding
		{N: 2, C: 2, H: 4, W: 5, KH: 4, KW: 5, SH: 1, SW: 1},
	} {
		t.Run(fmt.Sprintf("%+v", p), func(t *testing.T) {
			x, xv := randBuf(t, rng, p.N*p.C*p.H*p.W)
			oh, ow := p.OutH(), p.OutW()
			dy, dyv := randBuf(t, rng, p.N*p.C*oh*ow)
			maxRef, avgRef := make([]float64, len(xv)), make([]float64, len(xv))
			for pl := 0; pl < p.N*p.C; pl++ {
				for i := 0; i < oh; i++ {
					for j := 0; j < ow; j++ {
						g := dyv[(pl*oh+i)*ow+j]
						best, bestV := -1, math.Inf(-1)
						for r := 0; r < p.KH; r++ {
							for q := 0; q < p.KW; q++ {
								ih, iw := i*p.SH-p.PH+r, j*p.SW-p.PW+q
								if ih < 0 || ih >= p.H || iw < 0 || iw >= p.W {
									continue
								}
								at := (pl*p.H+ih)*p.W + iw
								if xv[at] > bestV {
									best, bestV = at, xv[at]
								}
								avgRef[at] += g / float64(p.KH*p.KW)
							}
						}
						maxRef[best] += g
					}
				}
			}
			dx := buf(t, kernels.F32, len(xv))
			be.MaxPool2dBackward(p, x, dy, dx)
			check(t, "max backward", dx, maxRef, 1e-6)
			be.AvgPool2dBackward(p, dy, dx)
			check(t, "avg backward", dx, avgRef, 1e-6)
		})
	}
}

// UpdateScale follows torch's _amp_update_scale_ over a run of steps with
// and without an overflow.
func TestUpdateScale(t *testing.T) {
	p := kernels.ScalerParams{Growth: 2, Backoff: 0.5, Interval: 3}
	scale, tracker, found, skipped := buf(t, kernels.F32, 1), buf(t, kernels.I32, 1), buf(t, kernels.F32, 1), buf(t, kernels.F32, 1)
	be.Fill(scale, 1024)
	i32s(tracker)[0] = 0
	be.Fill(skipped, 0)
	s, tr, sk := 1024.0, 0, 0.0
	for step, inf := range []bool{false, false, true, false, false, false, false, true, true, false} {
		be.Fill(found, map[bool]float32{true: 1}[inf])
		be.UpdateScale(p, scale, tracker, found, skipped)
		if inf {
			s, tr, sk = s*0.5, 0, sk+1
		} else if tr++; tr == p.Interval {
			s, tr = s*2, 0
		}
		if f32s(scale)[0] != float32(s) || int(i32s(tracker)[0]) != tr || f32s(skipped)[0] != float32(sk) {
			t.Fatalf("step %d (inf %v): scale %v tracker %d skipped %v, want %v %d %v",
				step, inf, f32s(scale)[0], i32s(tracker)[0], f32s(skipped)[0], s, tr, sk)
		}
	}
}
