package autograd_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

// castCounter counts the backend's single casts of n elements (a
// parameter's) and panics in the filter gradient numbered failAt (from 1;
// 0: never).
type castCounter struct {
	kernels.Backend
	n, casts        int
	filters, failAt int
	biasSums        int // products that sum their bias's gradient
}

func (c *castCounter) GemmEpilogue(p kernels.GemmParams, e kernels.Epilogue, a, b, out kernels.Buf) {
	if e.BiasGrad.Valid() || e.BiasGradA.Valid() {
		c.biasSums++
	}
	c.Backend.GemmEpilogue(p, e, a, b, out)
}

func (c *castCounter) Cast(dst, src kernels.Buf) {
	if src.N == c.n {
		c.casts++
	}
	c.Backend.Cast(dst, src)
}

func (c *castCounter) Conv2dBackwardFilter(p kernels.ConvParams, x, dy, dw kernels.Buf) {
	if c.filters++; c.filters == c.failAt {
		panic("castCounter: the filter gradient fails")
	}
	c.Backend.Conv2dBackwardFilter(p, x, dy, dw)
}

// TestCastParameters: a chain of convolutions under F16 autocast, with its
// parameters cast at once (Note [parameters cast at once]), has the
// gradients of the per-operation casts bit for bit: in one pass, in two
// passes accumulating (a micro-batched step), and with an OnGradReady hook,
// which finds each gradient final when it is called. No parameter is cast
// on its own then (the step without casts two a use), the pool holds
// afterwards only the parameters and their gradients, and a pass that
// fails midway leaves nothing gathered behind.
func TestCastParameters(t *testing.T) {
	const layers, c = 40, 4 // more parameters than one gathering holds; the last convolution reads the first's weight again
	for _, tc := range []struct {
		name   string
		passes int
		hook   bool
		failAt int // the filter gradient that fails the first pass
	}{
		{"one pass", 1, false, 0},
		{"two passes accumulating", 2, false, 0},
		{"a ready hook", 1, true, 0},
		{"a pass that fails", 1, false, layers},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := func(atOnce bool) (grads [][]float32, casts int) {
				cb := &castCounter{Backend: cpu.New(), n: c * c * 9, failAt: tc.failAt}
				dev := tensor.NewDevice(cb)
				rng := newSrc(dev, 5, 6)
				ws := make([]*tensor.Tensor, layers)
				for i := range ws {
					ws[i] = param(rng, func(r *rand.Rand) float32 { return float32(r.NormFloat64() / 6) }, c, c, 3, 3)
				}
				defer releaseAll(ws...)
				x := param(rng, normal, 2, c, 6, 6).SetRequiresGrad(false)
				defer x.Release()
				ready := map[*tensor.Tensor][]float32{}
				var opts []ag.Option
				if tc.hook {
					opts = append(opts, ag.OnGradReady(func(leaf *tensor.Tensor) {
						if leaf.Grad() == nil {
							t.Fatalf("OnGradReady of a %v parameter without a gradient", leaf.Shape())
						}
						ready[leaf] = leaf.Grad().Float32s()
					}))
				}
				pass := func() {
					var loss *tensor.Tensor
					ag.Autocast(dev, tensor.F16, func() {
						if atOnce {
							defer ag.CastParameters(dev, ws)()
						}
						h := x.Retain()
						for _, w := range append(ws, ws[0]) {
							next := ag.Conv2d(h, w, nil, 1, 1)
							h.Release()
							h = next
						}
						loss = ag.SumAll(h)
						h.Release()
					})
					defer loss.Release()
					ag.Backward(loss, opts...)
				}
				for i := range tc.passes {
					if i == 0 && tc.failAt > 0 {
						func() {
							defer func() {
								if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "fails") {
									t.Fatalf("the failing pass: recovered %v", r)
								}
							}()
							pass()
						}()
						if n := len(dev.Modes().PassEnd); n != 0 {
							t.Errorf("after a failed pass, %d ends are left to run", n)
						}
						for _, w := range ws {
							w.ZeroGrad()
						}
						cb.failAt, cb.casts = 0, 0
					}
					pass()
				}
				if dev.Modes().Copies != nil || len(dev.Modes().PassEnd) != 0 {
					t.Errorf("after the passes: copies %v, %d ends left", dev.Modes().Copies, len(dev.Modes().PassEnd))
				}
				if got, want := allocated(dev), int64(2*layers)*memory.RoundSize(c*c*9*4)+memory.RoundSize(2*c*6*6*4); got != want {
					t.Errorf("%d bytes allocated after the passes, want %d: the parameters, their gradients and the input", got, want)
				}
				for _, w := range ws {
					if w.Grad() == nil {
						t.Fatalf("a parameter without a gradient")
					}
					g := w.Grad().Float32s()
					if tc.hook && !slices.Equal(ready[w], g) {
						t.Errorf("the gradient OnGradReady saw differs from the final one")
					}
					grads = append(grads, g)
				}
				return grads, cb.casts
			}
			want, perOp := run(false)
			got, atOnce := run(true)
			for i := range want {
				if i == 0 { // read twice: its one copy's two gradients are summed in F16, the two casts' in F32
					if e := relErr(got[0], want[0]); e > 1e-3 {
						t.Errorf("parameter 0, read twice: gradient cast at once off the per-operation casts' by %.2g (relative), want F16's rounding", e)
					}
					continue
				}
				if !slices.Equal(got[i], want[i]) {
					t.Fatalf("parameter %d: gradient cast at once differs from the per-operation casts'", i)
				}
			}
			if uses := (layers + 1) * tc.passes; perOp != 2*uses || atOnce != 0 {
				t.Errorf("single casts of a parameter: %d per operation (want %d), %d at once (want 0)", perOp, 2*uses, atOnce)
			}
		})
	}
}

// CastParameters inside another's region on the same handle is a
// programmer's error.
func TestCastParametersNested(t *testing.T) {
	dev := tensor.CPU()
	w := param(newSrc(dev, 1, 2), normal, 3)
	defer w.Release()
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "inside another") {
			t.Errorf("nested CastParameters: recovered %v", r)
		}
	}()
	ag.Autocast(dev, tensor.F16, func() {
		defer ag.CastParameters(dev, []*tensor.Tensor{w})()
		defer ag.CastParameters(dev, []*tensor.Tensor{w})()
	})
}
