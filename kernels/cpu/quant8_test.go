package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/leangrad/leangrad/kernels"
)

// TestAdamW8MatchesFloat64: one AdamW8 step from random codes and scales,
// against AdamW computed in float64 from the same dequantised moments and
// its moments quantised to the nearest codes in float64: the parameters
// agree to float32's rounding, the scales too (a few units in the last
// place of the terms each sums), and each code is the reference's or, where
// the value lies within that rounding of the midpoint between two codes,
// its neighbour.
func TestAdamW8MatchesFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	maps := kernels.Quant8Maps
	for _, n := range []int{1, 255, 256, 257, 3*256 + 17} {
		p, g := buf(t, kernels.F32, n), buf(t, kernels.F32, n)
		codes, absmax := buf(t, kernels.U8, 2*n), buf(t, kernels.F32, 2*kernels.Quant8Blocks(n))
		for i := range n {
			f32s(p)[i], f32s(g)[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64()*1e-2)
			raw(codes)[2*i], raw(codes)[2*i+1] = uint8(rng.IntN(256)), uint8(rng.IntN(256))
		}
		for i := range f32s(absmax) {
			f32s(absmax)[i] = float32(1e-3 * (1 + rng.Float64()))
		}
		p0, c0, a0 := append([]float32(nil), f32s(p)...), append([]byte(nil), raw(codes)...), append([]float32(nil), f32s(absmax)...)
		qmap := buf(t, kernels.F32, len(maps))
		copy(f32s(qmap), maps)
		lr, step := buf(t, kernels.F32, 1), buf(t, kernels.I32, kernels.CounterLen)
		f32s(lr)[0], *counter(step) = 1e-3, 5
		const b1, b2, eps, wd = 0.9, 0.95, 1e-8, 0.1
		be.AdamW8(kernels.AdamWParams{LR: lr, Beta1: b1, Beta2: b2, Eps: eps, WeightDecay: wd, Step: step},
			qmap, []kernels.Buf{p}, []kernels.Buf{g}, []kernels.Buf{codes}, []kernels.Buf{absmax})

		// The reference, block by block in float64.
		bc1, bc2 := 1-math.Pow(b1, 5), 1-math.Pow(b2, 5)
		for blk := range kernels.Quant8Blocks(n) {
			lo, hi := blk*kernels.Quant8Block, min((blk+1)*kernels.Quant8Block, n)
			// Each moment with a bound on float32's rounding of it: a few
			// units in the last place of the terms summed.
			m, s := make([]float64, hi-lo), make([]float64, hi-lo)
			var mMax, sMax, mErr, sErr float64
			const ulps = 4 * 0x1p-24
			for i := lo; i < hi; i++ {
				mi := float64(maps[c0[2*i]]) * float64(a0[2*blk])
				si := float64(maps[256+int(c0[2*i+1])]) * float64(a0[2*blk+1])
				gi := float64(f32s(g)[i])
				mErr = max(mErr, ulps*(math.Abs(b1*mi)+math.Abs((1-b1)*gi)))
				mi = b1*mi + (1-b1)*gi
				si = math.Sqrt(b2*si*si + (1-b2)*gi*gi)
				sErr = max(sErr, ulps*si)
				want := float64(p0[i])*(1-1e-3*wd) - 1e-3/bc1*mi/(si/math.Sqrt(bc2)+eps)
				if got := float64(f32s(p)[i]); math.Abs(got-want) > 1e-6*math.Abs(want)+1e-9 {
					t.Fatalf("n=%d: parameter %d is %v, float64's %v", n, i, got, want)
				}
				m[i-lo], s[i-lo] = mi, si
				mMax, sMax = max(mMax, math.Abs(mi)), max(sMax, si)
			}
			for k, want := range []float64{mMax, sMax} {
				if got := float64(f32s(absmax)[2*blk+k]); math.Abs(got-want) > []float64{mErr, sErr}[k] {
					t.Fatalf("n=%d: block %d's scale %d is %v, float64's %v", n, blk, k, got, want)
				}
			}
			for i := lo; i < hi; i++ {
				for k, x := range []float64{m[i-lo] / mMax, s[i-lo] / sMax} {
					tol := 2 * []float64{mErr / mMax, sErr / sMax}[k]
					book := maps[256*k : 256*k+256]
					got, want := int(raw(codes)[2*i+k]), nearest64(book, x)
					if got == want {
						continue
					}
					mid := (float64(book[min(got, want)]) + float64(book[max(got, want)])) / 2
					if d := got - want; d*d != 1 || math.Abs(x-mid) > tol {
						t.Fatalf("n=%d: value %d's code %d is %d (%v), float64's %d (%v), for %v", n, i, k, got, book[got], want, book[want], x)
					}
				}
			}
		}
	}
}

// nearest64 is the index of the value of book nearest x, in float64.
func nearest64(book []float32, x float64) int {
	best := 0
	for i, v := range book {
		if math.Abs(float64(v)-x) < math.Abs(float64(book[best])-x) {
			best = i
		}
	}
	return best
}

// TestQuant8TableMatchesSearch: the CPU's table finds kernels.Quant8Code's
// code for every value of each code book, the midpoints between them and
// just beside each, zeros of both signs, the ends and past them, NaN, and
// random values of every scale.
func TestQuant8TableMatchesSearch(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 8))
	for k, q := range []*quant8Book{quant8Signed, quant8Unsigned} {
		book := kernels.Quant8Maps[256*k : 256*k+256]
		xs := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 2, -2, 1.5, -1.5, 1e-30, -1e-30, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
		for i, v := range book {
			xs = append(xs, v, math.Nextafter32(v, 2), math.Nextafter32(v, -2))
			if i < 255 {
				mid := (v + book[i+1]) / 2
				xs = append(xs, mid, math.Nextafter32(mid, 2), math.Nextafter32(mid, -2))
			}
		}
		for range 200000 {
			x := float32(math.Pow(10, -12*rng.Float64()))
			if rng.IntN(2) == 0 {
				x = -x
			}
			xs = append(xs, x)
		}
		for _, x := range xs {
			if got, want := q.code(x), kernels.Quant8Code(book, x); got != want {
				t.Fatalf("book %d: the table's code of %v is %d, the search's %d", k, x, got, want)
			}
		}
	}
}
