package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
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

// TestSample holds the sampler to its definition, in float64: greedy rows
// take the first maximum; every row reports the log-softmax of its token
// and its top tokens in order; a draw depends on its seed and step alone;
// and over many steps the draws of a row follow the softmax at its
// temperature, restricted to the top k and then the top p, within
// sampling noise.
func TestSample(t *testing.T) {
	logits := []float64{1.0, 2.5, -1.0, 2.5, 0.5, 1.8, -3.0}
	V := len(logits)
	lse := func(v []float64) float64 {
		m := slices.Max(v)
		var s float64
		for _, x := range v {
			s += math.Exp(x - m)
		}
		return m + math.Log(s)
	}
	c := New()
	// expected is the distribution a row of settings draws from.
	expected := func(temp float64, k int, topP float64) []float64 {
		idx := make([]int, V)
		for i := range idx {
			idx[i] = i
		}
		slices.SortStableFunc(idx, func(a, b int) int { return cmpDesc(logits[a], logits[b]) })
		if k > 0 && k < V {
			for k < V && logits[idx[k]] == logits[idx[k-1]] { // ties at the k-th are kept
				k++
			}
			idx = idx[:k]
		}
		w := make([]float64, V)
		var z float64
		for _, i := range idx {
			w[i] = math.Exp((logits[i] - logits[idx[0]]) / temp)
			z += w[i]
		}
		if topP < 1 { // the most likely whose mass reaches topP of what is left
			var acc float64
			keep := 0
			for keep < len(idx) && acc < topP*z {
				acc += w[idx[keep]]
				keep++
			}
			for _, i := range idx[keep:] {
				w[i] = 0
			}
			z = acc
		}
		for i := range w {
			w[i] /= z
		}
		return w
	}
	const draws = 20000
	for _, st := range []struct {
		temp float32
		k    int
		topP float32
	}{{0, 0, 1}, {1, 0, 1}, {1, 3, 1}, {0.7, 0, 0.8}, {1.5, 4, 0.9}, {1, 2, 1}} {
		in := bufOf(t, repeat(logits, draws))
		rows := make([]int32, draws)
		for i := range rows {
			rows[i] = int32(i) // the step: a new draw each row
		}
		tok, lp := buf(t, kernels.I32, draws), buf(t, kernels.F32, draws)
		tt, tl := buf(t, kernels.I32, draws*3), buf(t, kernels.F32, draws*3)
		seeds := make([]int32, 2*draws)
		for i := range draws {
			seeds[2*i] = 99
		}
		c.Sample(kernels.SampleParams{Rows: draws, V: V, TopN: 3}, in, bufOf(t, repeat([]float64{float64(st.temp)}, draws)),
			idsOf(t, slices.Repeat([]int32{int32(st.k)}, draws)), bufOf(t, repeat([]float64{float64(st.topP)}, draws)),
			idsOf(t, seeds), idsOf(t, rows), tok, lp, tt, tl)
		want := expected(float64(st.temp), st.k, float64(st.topP))
		if st.temp == 0 {
			want = make([]float64, V)
			want[1] = 1 // the first of the two maxima
		}
		got := make([]float64, V)
		for r, k := range i32s(tok) {
			got[k]++
			if d := float64(f32s(lp)[r]) - (logits[k] - lse(logits)); math.Abs(d) > 1e-5 {
				t.Fatalf("%+v: token %d's log-probability off by %g", st, k, d)
			}
		}
		for i := range got {
			got[i] /= draws
			sd := math.Sqrt(want[i]*(1-want[i])/draws) + 1e-9
			if want[i] == 0 && got[i] != 0 || math.Abs(got[i]-want[i]) > 5*sd {
				t.Errorf("%+v: token %d drawn %.4f of the time, want %.4f", st, i, got[i], want[i])
			}
		}
		if top := i32s(tt)[:3]; !slices.Equal(top, []int32{1, 3, 5}) || math.Abs(float64(f32s(tl)[2])-(logits[5]-lse(logits))) > 1e-5 {
			t.Errorf("%+v: top tokens %v (%v), want 1, 3, 5", st, top, f32s(tl)[:3])
		}
	}
	// The same seed and step draw the same token; another step, another.
	one := func(step int32) int32 {
		tok := buf(t, kernels.I32, 1)
		c.Sample(kernels.SampleParams{Rows: 1, V: V}, bufOf(t, logits), bufOf(t, []float64{1}), idsOf(t, []int32{0}), bufOf(t, []float64{1}),
			idsOf(t, []int32{5, 0}), idsOf(t, []int32{step}), tok, buf(t, kernels.F32, 1), kernels.Buf{}, kernels.Buf{})
		return i32s(tok)[0]
	}
	differs := false
	for step := range int32(20) {
		if one(step) != one(step) {
			t.Fatalf("step %d drew two tokens", step)
		}
		differs = differs || one(step) != one(0)
	}
	if !differs {
		t.Error("twenty steps drew one token")
	}
}

func cmpDesc(a, b float64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

func repeat(v []float64, n int) []float64 {
	out := make([]float64, 0, len(v)*n)
	for range n {
		out = append(out, v...)
	}
	return out
}
