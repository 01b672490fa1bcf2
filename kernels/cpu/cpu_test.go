package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu/sgemm"
	"github.com/x448/float16"
)

// The CPU backend against plain float64 references written straight from the
// definitions (nested loops, no im2col, no parallelism).

var be = New()

func buf(t testing.TB, dt kernels.DType, n int) kernels.Buf {
	t.Helper()
	blk, err := be.Allocator().Alloc(int64(n*dt.Size()), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Allocator().Free(blk) })
	b := kernels.Buf{Block: blk, N: n, DType: dt}
	if dt != kernels.I32 {
		be.Fill(b, float32(math.NaN())) // poison: an unwritten output fails
	}
	return b
}

func randBuf(t *testing.T, rng *rand.Rand, n int) (kernels.Buf, []float64) {
	return domainBuf(t, rng, n, (*rand.Rand).NormFloat64)
}

// domainBuf is an F32 buffer of n values drawn by gen, and the values.
func domainBuf(t *testing.T, rng *rand.Rand, n int, gen func(*rand.Rand) float64) (kernels.Buf, []float64) {
	b := buf(t, kernels.F32, n)
	v := f32s(b)
	ref := make([]float64, n)
	for i := range v {
		v[i] = float32(gen(rng))
		ref[i] = float64(v[i])
	}
	return b, ref
}

func check(t *testing.T, what string, got kernels.Buf, want []float64, tol float64) {
	t.Helper()
	g := in(got)
	if len(g) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(g), len(want))
	}
	var num, den float64
	for i := range g {
		if math.IsNaN(float64(g[i])) != math.IsNaN(want[i]) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, g[i], want[i])
		}
		d := float64(g[i]) - want[i]
		num += d * d
		den += want[i] * want[i]
		if math.Abs(d) > tol*(1+math.Abs(want[i]))*10 {
			t.Fatalf("%s[%d] = %v, want %v", what, i, g[i], want[i])
		}
	}
	if den > 0 && math.Sqrt(num/den) > tol {
		t.Fatalf("%s: relative error %.3g > %.3g", what, math.Sqrt(num/den), tol)
	}
}

// TestGemm checks every transpose, batches with strides, and products
// large enough to cross the packing blocks and split over the goroutines,
// with F32 or F16 operands (F16 ones are converted as they are packed) and
// an F32 result, or, with F16 operands, an F16 one (rounded a tile at a
// time), against float64 loops on the operands' values.
func TestGemm(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for _, tc := range []kernels.GemmParams{
		{M: 3, N: 4, K: 5, Alpha: 1, Batch: 1},
		{TransA: true, M: 7, N: 1, K: 3, Alpha: 0.5, Batch: 1},
		{TransB: true, M: 2, N: 6, K: 9, Alpha: 1, Beta: 0.5, Batch: 1},
		{TransA: true, TransB: true, M: 4, N: 3, K: 2, Alpha: 1, Batch: 3, StrideA: 8, StrideB: 6, StrideC: 12},
		{M: 5, N: 2, K: 4, Alpha: 1, Batch: 2, StrideA: 0, StrideB: 8, StrideC: 10},
		{M: 150, N: 100, K: 400, Alpha: 1, Batch: 1},
		{TransA: true, M: 150, N: 100, K: 400, Alpha: 1, Beta: 1, Batch: 1},
		{TransB: true, M: 150, N: 100, K: 400, Alpha: 0.5, Batch: 1},
		{TransA: true, TransB: true, M: 33, N: 70, K: 390, Alpha: 1, Batch: 1},
	} {
		for _, dt := range []kernels.DType{kernels.F32, kernels.F16, kernels.BF16} {
			t.Run(fmt.Sprintf("%+v/%v", tc, dt), func(t *testing.T) {
				operand := func(n int, dt kernels.DType) (kernels.Buf, []float64) {
					b, _ := randBuf(t, rng, n)
					if dt.Half() {
						h := buf(t, dt, n)
						be.Cast(h, b)
						b = h
					}
					v := make([]float64, n)
					for i, x := range in(b) {
						v[i] = float64(x)
					}
					return b, v
				}
				a, av := operand(max(tc.StrideA*(tc.Batch-1), 0)+tc.M*tc.K, dt)
				b, bv := operand(tc.StrideB*(tc.Batch-1)+tc.K*tc.N, dt)
				c, cv := randBuf(t, rng, tc.StrideC*(tc.Batch-1)+tc.M*tc.N)
				want := append([]float64(nil), cv...)
				for bt := 0; bt < tc.Batch; bt++ {
					for i := 0; i < tc.M; i++ {
						for j := 0; j < tc.N; j++ {
							var s float64
							for k := 0; k < tc.K; k++ {
								ai := i*tc.K + k
								if tc.TransA {
									ai = k*tc.M + i
								}
								bi := k*tc.N + j
								if tc.TransB {
									bi = j*tc.K + k
								}
								s += av[bt*tc.StrideA+ai] * bv[bt*tc.StrideB+bi]
							}
							ci := bt*tc.StrideC + i*tc.N + j
							want[ci] = float64(tc.Alpha)*s + float64(tc.Beta)*cv[ci]
						}
					}
				}
				c0 := append([]float32(nil), f32s(c)...)
				ch := buf(t, dt, c.N)
				for _, kb := range kernelBackends(t) {
					copy(f32s(c), c0)
					kb.Gemm(tc, a, b, c)
					check(t, kb.Kernel()+" C", c, want, 1e-5)
					if dt.Half() { // AMP's products: a 16-bit C too, rounded a column of tiles at a time
						kb.Cast(ch, c0buf(t, c0))
						kb.Gemm(tc, a, b, ch)
						check(t, kb.Kernel()+" "+dt.String()+" C", ch, want, map[kernels.DType]float64{kernels.F16: 2e-3, kernels.BF16: 1e-2}[dt])
					}
				}
			})
		}
	}
}

// c0buf is an F32 buffer holding v.
func c0buf(t *testing.T, v []float32) kernels.Buf {
	b := buf(t, kernels.F32, len(v))
	copy(f32s(b), v)
	return b
}

// kernelBackends is the backend once per sgemm microkernel this CPU runs:
// the assembly ones and the Go fallback every other CPU uses.
func kernelBackends(t *testing.T) []*Backend {
	var out []*Backend
	for _, name := range sgemm.Kernels() {
		kb, err := be.WithKernel(name)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, kb)
	}
	return out
}

func convRef(p kernels.ConvParams, x, w []float64) []float64 {
	oh, ow := p.OutH(), p.OutW()
	y := make([]float64, p.N*p.K*oh*ow)
	for n := 0; n < p.N; n++ {
		for k := 0; k < p.K; k++ {
			for i := 0; i < oh; i++ {
				for j := 0; j < ow; j++ {
					var s float64
					for c := 0; c < p.C; c++ {
						for r := 0; r < p.R; r++ {
							for q := 0; q < p.S; q++ {
								ih, iw := i*p.StrideH-p.PadH+r, j*p.StrideW-p.PadW+q
								if ih >= 0 && ih < p.H && iw >= 0 && iw < p.W {
									s += x[((n*p.C+c)*p.H+ih)*p.W+iw] * w[((k*p.C+c)*p.R+r)*p.S+q]
								}
							}
						}
					}
					y[((n*p.K+k)*oh+i)*ow+j] = s
				}
			}
		}
	}
	return y
}

// convGradsRef computes dx and dw by the chain rule on the reference loops.
func convGradsRef(p kernels.ConvParams, x, w, dy []float64) (dx, dw []float64) {
	oh, ow := p.OutH(), p.OutW()
	dx, dw = make([]float64, len(x)), make([]float64, len(w))
	for n := 0; n < p.N; n++ {
		for k := 0; k < p.K; k++ {
			for i := 0; i < oh; i++ {
				for j := 0; j < ow; j++ {
					g := dy[((n*p.K+k)*oh+i)*ow+j]
					for c := 0; c < p.C; c++ {
						for r := 0; r < p.R; r++ {
							for q := 0; q < p.S; q++ {
								ih, iw := i*p.StrideH-p.PadH+r, j*p.StrideW-p.PadW+q
								if ih >= 0 && ih < p.H && iw >= 0 && iw < p.W {
									xi, wi := ((n*p.C+c)*p.H+ih)*p.W+iw, ((k*p.C+c)*p.R+r)*p.S+q
									dx[xi] += g * w[wi]
									dw[wi] += g * x[xi]
								}
							}
						}
					}
				}
			}
		}
	}
	return dx, dw
}

func TestConv(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 1))
	for _, p := range []kernels.ConvParams{
		{N: 2, C: 3, H: 7, W: 6, K: 4, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 1, C: 2, H: 9, W: 9, K: 3, R: 3, S: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1},
		{N: 3, C: 4, H: 5, W: 5, K: 2, R: 1, S: 1, StrideH: 1, StrideW: 1},
		{N: 2, C: 3, H: 8, W: 7, K: 5, R: 1, S: 1, StrideH: 2, StrideW: 2},
		{N: 5, C: 1, H: 6, W: 11, K: 2, R: 3, S: 5, StrideH: 2, StrideW: 1, PadH: 0, PadW: 2},
		// ResNet-20's shapes: one image per product (L = 784 ≥ chunkColumns/2 images' worth),
		// a chunk of images per product, more taps than a k-block, K past one m-block.
		{N: 3, C: 16, H: 28, W: 28, K: 16, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 90, C: 5, H: 7, W: 7, K: 9, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 4, C: 45, H: 9, W: 8, K: 150, R: 3, S: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1},
		{N: 7, C: 9, H: 13, W: 10, K: 7, R: 1, S: 1, StrideH: 2, StrideW: 2},
		// Stride 1, computed by shifted products: uneven padding, and more
		// images than one product's grid holds.
		{N: 4, C: 3, H: 6, W: 9, K: 5, R: 2, S: 3, StrideH: 1, StrideW: 1, PadH: 0, PadW: 2},
		{N: 300, C: 2, H: 7, W: 7, K: 3, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		// Stride 2 over rows longer than one step of the phases' assembly (32).
		{N: 2, C: 3, H: 7, W: 37, K: 4, R: 3, S: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1},
	} {
		t.Run(fmt.Sprintf("%+v", p), func(t *testing.T) {
			x, xv := randBuf(t, rng, p.N*p.C*p.H*p.W)
			w, wv := randBuf(t, rng, p.K*p.C*p.R*p.S)
			dy, dyv := randBuf(t, rng, p.N*p.K*p.OutH()*p.OutW())
			yRef := convRef(p, xv, wv)
			dxRef, dwRef := convGradsRef(p, xv, wv, dyv)
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
			// Every kernel; the fastest also on one goroutine and on three,
			// which split the images into other stretches (shiftConv).
			type run struct {
				kb    *Backend
				procs int
			}
			var runs []run
			for _, kb := range kernelBackends(t) {
				runs = append(runs, run{kb, runtime.GOMAXPROCS(0)})
			}
			runs = append(runs, run{runs[0].kb, 1}, run{runs[0].kb, 3})
			for _, r := range runs {
				kb := r.kb
				name := fmt.Sprintf("%s on %d goroutines", kb.Kernel(), r.procs)
				runtime.GOMAXPROCS(r.procs)
				y := buf(t, kernels.F32, dy.N)
				kb.Conv2d(p, x, w, y)
				check(t, name+" y", y, yRef, 1e-5)
				dx, dw := buf(t, kernels.F32, x.N), buf(t, kernels.F32, w.N)
				kb.Conv2dBackwardData(p, dy, w, dx)
				kb.Conv2dBackwardFilter(p, x, dy, dw)
				check(t, name+" dx", dx, dxRef, 1e-5)
				check(t, name+" dw", dw, dwRef, 1e-5)
			}
		})
	}
}

// TestConvF16 runs F16 convolutions (AMP) forward and backward, stride 1
// (converted on the way into and out of the grid) and stride 2 (the forward
// dealt into the phases' grid, the gradients converted whole), against the
// float64 references of the F32 inputs.
func TestConvF16(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 1))
	for _, p := range []kernels.ConvParams{
		{N: 2, C: 3, H: 6, W: 6, K: 4, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 3, C: 5, H: 9, W: 7, K: 6, R: 3, S: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1},
	} {
		x, xv := randBuf(t, rng, p.N*p.C*p.H*p.W)
		w, wv := randBuf(t, rng, p.K*p.C*p.R*p.S)
		dy, dyv := randBuf(t, rng, p.N*p.K*p.OutH()*p.OutW())
		half := func(b kernels.Buf) kernels.Buf {
			h := buf(t, kernels.F16, b.N)
			be.Cast(h, b)
			return h
		}
		xh, wh, dyh := half(x), half(w), half(dy)
		yh := buf(t, kernels.F16, dy.N)
		be.Conv2d(p, xh, wh, yh)
		check(t, "y (f16)", yh, convRef(p, xv, wv), 1e-2)
		dxRef, dwRef := convGradsRef(p, xv, wv, dyv)
		dxh, dwh := buf(t, kernels.F16, x.N), buf(t, kernels.F16, w.N)
		be.Conv2dBackwardData(p, dyh, wh, dxh)
		be.Conv2dBackwardFilter(p, xh, dyh, dwh)
		check(t, "dx (f16)", dxh, dxRef, 1e-2)
		check(t, "dw (f16)", dwh, dwRef, 1e-2)
	}
}

// TestBatchNorm runs planes shorter than a vector (the Go loops only), with
// a tail after the vectors, and of whole vectors.
func TestBatchNorm(t *testing.T) {
	for _, hw := range []int{10, 37, 64} {
		t.Run(fmt.Sprint("HW=", hw), func(t *testing.T) { testBatchNorm(t, hw) })
	}
}

func testBatchNorm(t *testing.T, hw int) {
	rng := rand.New(rand.NewPCG(4, uint64(hw)))
	p := kernels.BNParams{N: 3, C: 4, HW: hw, Eps: 1e-5, Momentum: 0.1}
	x, xv := randBuf(t, rng, p.N*p.C*p.HW)
	g, gv := randBuf(t, rng, p.C)
	b, bv := randBuf(t, rng, p.C)
	rm, rmv := randBuf(t, rng, p.C)
	rv := buf(t, kernels.F32, p.C)
	be.Fill(rv, 2)
	y, sm, si := buf(t, kernels.F32, x.N), buf(t, kernels.F32, p.C), buf(t, kernels.F32, p.C)
	be.BatchNormTrain(p, x, kernels.Buf{}, g, b, y, rm, rv, sm, si)
	m := float64(p.N * p.HW)
	yRef, rmRef, rvRef := make([]float64, x.N), make([]float64, p.C), make([]float64, p.C)
	meanRef, invRef := make([]float64, p.C), make([]float64, p.C)
	for c := 0; c < p.C; c++ {
		var s, sq float64
		for n := 0; n < p.N; n++ {
			for i := 0; i < p.HW; i++ {
				s += xv[(n*p.C+c)*p.HW+i]
			}
		}
		mean := s / m
		for n := 0; n < p.N; n++ {
			for i := 0; i < p.HW; i++ {
				d := xv[(n*p.C+c)*p.HW+i] - mean
				sq += d * d
			}
		}
		inv := 1 / math.Sqrt(sq/m+1e-5)
		for n := 0; n < p.N; n++ {
			for i := 0; i < p.HW; i++ {
				k := (n*p.C+c)*p.HW + i
				yRef[k] = (xv[k]-mean)*inv*gv[c] + bv[c]
			}
		}
		meanRef[c], invRef[c] = mean, inv
		rmRef[c] = 0.9*rmv[c] + 0.1*mean
		rvRef[c] = 0.9*2 + 0.1*sq/(m-1)
	}
	check(t, "y", y, yRef, 1e-5)
	check(t, "save mean", sm, meanRef, 1e-5)
	check(t, "save invstd", si, invRef, 1e-5)
	check(t, "running mean", rm, rmRef, 1e-5)
	check(t, "running var", rv, rvRef, 1e-5)

	ye := buf(t, kernels.F32, x.N)
	be.BatchNormEval(p, x, kernels.Buf{}, g, b, rm, rv, ye)
	eRef := make([]float64, x.N)
	for k := range eRef {
		c := k / p.HW % p.C
		eRef[k] = (xv[k]-rmRef[c])/math.Sqrt(rvRef[c]+1e-5)*gv[c] + bv[c]
	}
	check(t, "eval y", ye, eRef, 1e-5)

	// Fused with a residual and a ReLU: y = max(0, bn(x) + r); the backward
	// masks dy by y > 0 and passes the masked gradient to the residual.
	r, rv2 := randBuf(t, rng, x.N)
	pr := p
	pr.ReLU = true
	yr := buf(t, kernels.F32, x.N)
	be.BatchNormTrain(pr, x, r, g, b, yr, rm, rv, sm, si)
	yrRef := make([]float64, x.N)
	for k := range yrRef {
		yrRef[k] = max(0, yRef[k]+rv2[k])
	}
	check(t, "fused y", yr, yrRef, 1e-5)
	dy, dyv := randBuf(t, rng, x.N)
	dx, dres := buf(t, kernels.F32, x.N), buf(t, kernels.F32, x.N)
	dg, db := buf(t, kernels.F32, p.C), buf(t, kernels.F32, p.C)
	be.BatchNormBackward(pr, x, yr, kernels.Buf{}, dy, g, kernels.Buf{}, sm, si, dx, dres, dg, db)
	gRef, dxRef := make([]float64, x.N), make([]float64, x.N)
	dbRef, dgRef := make([]float64, p.C), make([]float64, p.C)
	for k := range gRef {
		if yrRef[k] > 0 {
			gRef[k] = dyv[k]
		}
		c := k / p.HW % p.C
		dbRef[c] += gRef[k]
		dgRef[c] += gRef[k] * (xv[k] - meanRef[c]) * invRef[c]
	}
	for k := range dxRef {
		c := k / p.HW % p.C
		xhat := (xv[k] - meanRef[c]) * invRef[c]
		dxRef[k] = gv[c] * invRef[c] / m * (m*gRef[k] - dbRef[c] - xhat*dgRef[c])
	}
	check(t, "fused dresidual", dres, gRef, 1e-6)
	check(t, "fused dbeta", db, dbRef, 1e-5)
	check(t, "fused dgamma", dg, dgRef, 1e-5)
	check(t, "fused dx", dx, dxRef, 1e-4)
	// Without y: the mask from x, beta and the residual.
	dx2, dres2 := buf(t, kernels.F32, x.N), buf(t, kernels.F32, x.N)
	be.BatchNormBackward(pr, x, kernels.Buf{}, r, dy, g, b, sm, si, dx2, dres2, dg, db)
	check(t, "fused dresidual, masked without y", dres2, gRef, 1e-6)
	check(t, "fused dbeta, masked without y", db, dbRef, 1e-5)
	check(t, "fused dgamma, masked without y", dg, dgRef, 1e-5)
	check(t, "fused dx, masked without y", dx2, dxRef, 1e-4)

	// The same in F16 (AMP): planes converted on the way in and out.
	half := func(b kernels.Buf) kernels.Buf {
		h := buf(t, kernels.F16, b.N)
		be.Cast(h, b)
		return h
	}
	xh, rh, dyh := half(x), half(r), half(dy)
	yh, dxh, dresh := buf(t, kernels.F16, x.N), buf(t, kernels.F16, x.N), buf(t, kernels.F16, x.N)
	smh, sih := buf(t, kernels.F32, p.C), buf(t, kernels.F32, p.C) // this run's statistics, of the rounded x
	be.BatchNormTrain(pr, xh, rh, g, b, yh, rm, rv, smh, sih)
	check(t, "f16 fused y", yh, yrRef, 1e-2)
	be.BatchNormBackward(pr, xh, yh, kernels.Buf{}, dyh, g, kernels.Buf{}, smh, sih, dxh, dresh, dg, db)
	check(t, "f16 fused dresidual", dresh, gRef, 1e-2)
	check(t, "f16 fused dx", dxh, dxRef, 1e-2)
	check(t, "f16 fused dgamma", dg, dgRef, 1e-2)
	yeh := buf(t, kernels.F16, x.N)
	be.BatchNormEval(p, xh, kernels.Buf{}, g, b, rm, rv, yeh)
	yeRef := make([]float64, x.N)
	rmNow, rvNow := in(rm), in(rv)
	for k := range yeRef {
		c := k / p.HW % p.C
		yeRef[k] = (xv[k]-float64(rmNow[c]))/math.Sqrt(float64(rvNow[c])+1e-5)*gv[c] + bv[c]
	}
	check(t, "f16 eval y", yeh, yeRef, 1e-2)

	// The half passes (F16 planes loaded and stored in place) do the
	// arithmetic of the path that converts the planes first, bit for bit:
	// train, backward (with and without the ReLU's mask and the residual)
	// and eval.
	if halfPasses {
		type result struct {
			y, dx, dres, ye, dxPlain []uint16
			stats                    []float32
		}
		run := func() result {
			rm2, rv2 := buf(t, kernels.F32, p.C), buf(t, kernels.F32, p.C)
			be.Copy(rm2, rm)
			be.Copy(rv2, rv)
			y2, dx2, dres2, ye2, dxp := buf(t, kernels.F16, x.N), buf(t, kernels.F16, x.N), buf(t, kernels.F16, x.N), buf(t, kernels.F16, x.N), buf(t, kernels.F16, x.N)
			sm2, si2, dg2, db2 := buf(t, kernels.F32, p.C), buf(t, kernels.F32, p.C), buf(t, kernels.F32, p.C), buf(t, kernels.F32, p.C)
			be.BatchNormTrain(pr, xh, rh, g, b, y2, rm2, rv2, sm2, si2)
			be.BatchNormBackward(pr, xh, y2, kernels.Buf{}, dyh, g, kernels.Buf{}, sm2, si2, dx2, dres2, dg2, db2)
			stats := slices.Concat(f32s(rm2), f32s(rv2), f32s(sm2), f32s(si2), f32s(dg2), f32s(db2))
			be.BatchNormBackward(p, xh, kernels.Buf{}, kernels.Buf{}, dyh, g, kernels.Buf{}, sm2, si2, dxp, kernels.Buf{}, dg2, db2)
			be.BatchNormEval(pr, xh, rh, g, b, rm2, rv2, ye2)
			stats = slices.Concat(stats, f32s(dg2), f32s(db2))
			cp := func(b kernels.Buf) []uint16 { return slices.Clone(u16s(b)) }
			return result{cp(y2), cp(dx2), cp(dres2), cp(ye2), cp(dxp), stats}
		}
		fast := run()
		halfPasses = false
		slow := run()
		halfPasses = true
		for _, c := range []struct {
			name       string
			fast, slow []uint16
		}{{"y", fast.y, slow.y}, {"dx", fast.dx, slow.dx}, {"dresidual", fast.dres, slow.dres}, {"eval y", fast.ye, slow.ye}, {"unfused dx", fast.dxPlain, slow.dxPlain}} {
			if !slices.Equal(c.fast, c.slow) {
				t.Errorf("f16 %s: the half passes differ from converting the planes first", c.name)
			}
		}
		if !slices.Equal(fast.stats, slow.stats) {
			t.Errorf("f16 statistics and parameter gradients: the half passes give %v, converting first %v", fast.stats, slow.stats)
		}
	}

	// Unfused: g = dy, no residual gradient.
	be.BatchNormBackward(p, x, kernels.Buf{}, kernels.Buf{}, dy, g, kernels.Buf{}, sm, si, dx, kernels.Buf{}, dg, db)
	clear(dbRef)
	clear(dgRef)
	for k := range dxRef {
		c := k / p.HW % p.C
		dbRef[c] += dyv[k]
		dgRef[c] += dyv[k] * (xv[k] - meanRef[c]) * invRef[c]
	}
	for k := range dxRef {
		c := k / p.HW % p.C
		xhat := (xv[k] - meanRef[c]) * invRef[c]
		dxRef[k] = gv[c] * invRef[c] / m * (m*dyv[k] - dbRef[c] - xhat*dgRef[c])
	}
	check(t, "dbeta", db, dbRef, 1e-5)
	check(t, "dgamma", dg, dgRef, 1e-5)
	check(t, "dx", dx, dxRef, 1e-4)
}

func TestPooling(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 1))
	for _, p := range []kernels.PoolParams{
		{N: 2, C: 3, H: 6, W: 6, KH: 2, KW: 2, SH: 2, SW: 2},
		{N: 1, C: 2, H: 7, W: 5, KH: 3, KW: 3, SH: 2, SW: 2, PH: 1, PW: 1},
		{N: 2, C: 2, H: 4, W: 5, KH: 4, KW: 5, SH: 1, SW: 1},
	} {
		t.Run(fmt.Sprintf("%+v", p), func(t *testing.T) {
			x, xv := randBuf(t, rng, p.N*p.C*p.H*p.W)
			oh, ow := p.OutH(), p.OutW()
			maxRef, avgRef := make([]float64, p.N*p.C*oh*ow), make([]float64, p.N*p.C*oh*ow)
			for pl := 0; pl < p.N*p.C; pl++ {
				for i := 0; i < oh; i++ {
					for j := 0; j < ow; j++ {
						m, s := math.Inf(-1), 0.0
						for r := 0; r < p.KH; r++ {
							for q := 0; q < p.KW; q++ {
								ih, iw := i*p.SH-p.PH+r, j*p.SW-p.PW+q
								if ih >= 0 && ih < p.H && iw >= 0 && iw < p.W {
									v := xv[(pl*p.H+ih)*p.W+iw]
									m, s = math.Max(m, v), s+v
								}
							}
						}
						maxRef[(pl*oh+i)*ow+j], avgRef[(pl*oh+i)*ow+j] = m, s/float64(p.KH*p.KW)
					}
				}
			}
			y := buf(t, kernels.F32, len(maxRef))
			be.MaxPool2d(p, x, y)
			check(t, "max", y, maxRef, 1e-6)
			be.AvgPool2d(p, x, y)
			check(t, "avg", y, avgRef, 1e-6)
		})
	}
}

func TestCrossEntropy(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 1))
	n, k := 5, 7
	x, xv := randBuf(t, rng, n*k)
	lb := buf(t, kernels.I32, n)
	ls := i32s(lb)
	for i := range ls {
		ls[i] = int32(rng.IntN(k))
	}
	lse, loss := buf(t, kernels.F32, n), buf(t, kernels.F32, 1)
	be.CrossEntropy(x, lb, lse, loss, n, k)
	var total float64
	lseRef := make([]float64, n)
	gradRef := make([]float64, n*k)
	for i := 0; i < n; i++ {
		var s float64
		for j := 0; j < k; j++ {
			s += math.Exp(xv[i*k+j])
		}
		lseRef[i] = math.Log(s)
		total += lseRef[i] - xv[i*k+int(ls[i])]
		for j := 0; j < k; j++ {
			gradRef[i*k+j] = math.Exp(xv[i*k+j]) / s * 3 / float64(n)
			if j == int(ls[i]) {
				gradRef[i*k+j] -= 3 / float64(n)
			}
		}
	}
	check(t, "lse", lse, lseRef, 1e-6)
	check(t, "loss", loss, []float64{total / float64(n)}, 1e-6)
	dl := buf(t, kernels.F32, 1)
	be.Fill(dl, 3)
	dx := buf(t, kernels.F32, n*k)
	be.CrossEntropyBackward(x, lb, lse, dl, dx, n, k)
	check(t, "dlogits", dx, gradRef, 1e-5)
}

func TestElementwiseAndReduce(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 1))
	x, xv := randBuf(t, rng, 60)
	y := buf(t, kernels.F32, 60)
	// Every unary op and its backward against its float64 reference, on
	// inputs from its domain.
	for _, op := range kernels.UnaryOps() {
		d := op.Def()
		in, iv := x, xv
		switch d.Domain {
		case kernels.Positive:
			in, iv = domainBuf(t, rng, 60, func(r *rand.Rand) float64 { return 0.25 + 2*r.Float64() })
		case kernels.AwayFromZero:
			in, iv = domainBuf(t, rng, 60, func(r *rand.Rand) float64 { return (0.1 + r.Float64()) * float64(1-2*r.IntN(2)) })
		}
		want := make([]float64, len(iv))
		for i, v := range iv {
			want[i] = d.Ref(v)
		}
		be.Unary(op, y, in)
		check(t, op.String(), y, want, 1e-6)
		dy, dyv := randBuf(t, rng, 60)
		dx := buf(t, kernels.F32, 60)
		for i, v := range iv {
			want[i] = dyv[i] * d.RefDeriv(v)
		}
		be.UnaryBackward(op, dx, dy, in, y)
		check(t, op.String()+" backward", dx, want, 1e-5)
	}
	// ReLU passes NaN through (as PyTorch does), on the vector path and the tail.
	nan := buf(t, kernels.F32, 40)
	be.Fill(nan, -1)
	f32s(nan)[3], f32s(nan)[37] = float32(math.NaN()), float32(math.NaN())
	relu := buf(t, kernels.F32, 40)
	be.Unary(kernels.ReLU, relu, nan)
	if r := f32s(relu); !math.IsNaN(float64(r[3])) || !math.IsNaN(float64(r[37])) || r[0] != 0 {
		t.Errorf("relu of NaN and -1: %v %v %v", r[3], r[37], r[0])
	}
	// (3, 4, 5) reduced along each axis.
	for axis, r := range []kernels.Reduction{{Outer: 1, Len: 3, Inner: 20}, {Outer: 3, Len: 4, Inner: 5}, {Outer: 12, Len: 5, Inner: 1}} {
		for _, op := range []kernels.ReduceOp{kernels.Sum, kernels.Mean, kernels.Max} {
			want := make([]float64, r.Outer*r.Inner)
			for o := 0; o < r.Outer; o++ {
				for in := 0; in < r.Inner; in++ {
					acc := math.Inf(-1)
					if op != kernels.Max {
						acc = 0
					}
					for j := 0; j < r.Len; j++ {
						v := xv[(o*r.Len+j)*r.Inner+in]
						if op == kernels.Max {
							acc = math.Max(acc, v)
						} else {
							acc += v
						}
					}
					if op == kernels.Mean {
						acc /= float64(r.Len)
					}
					want[o*r.Inner+in] = acc
				}
			}
			d := buf(t, kernels.F32, len(want))
			be.Reduce(op, d, x, r)
			check(t, fmt.Sprintf("%v axis %d", op, axis), d, want, 1e-6)
		}
	}
	// Broadcast: (3, 4, 5) * (4, 1).
	b, bv := randBuf(t, rng, 4)
	bc := kernels.NewBroadcast([]int{3, 4, 5}, []int{3, 4, 5}, []int{4, 1})
	be.Binary(kernels.Mul, y, x, b, bc)
	want := make([]float64, 60)
	for i := range want {
		want[i] = xv[i] * bv[i/5%4]
	}
	check(t, "broadcast mul", y, want, 1e-6)
	// (3, 4, 5) + (5): a bias on every row; (3, 4, 5) − (3, 4, 1).
	bias, biasv := randBuf(t, rng, 5)
	be.Binary(kernels.Add, y, x, bias, kernels.NewBroadcast([]int{3, 4, 5}, []int{3, 4, 5}, []int{5}))
	for i := range want {
		want[i] = xv[i] + biasv[i%5]
	}
	check(t, "broadcast add", y, want, 1e-6)
	col, colv := randBuf(t, rng, 12)
	be.Binary(kernels.Sub, y, x, col, kernels.NewBroadcast([]int{3, 4, 5}, []int{3, 4, 5}, []int{3, 4, 1}))
	for i := range want {
		want[i] = xv[i] - colv[i/5]
	}
	check(t, "broadcast sub", y, want, 1e-6)

	// Same shapes, every op.
	z, zv := randBuf(t, rng, 60)
	for _, op := range kernels.BinaryOps() {
		for i := range want {
			want[i] = op.Def().Ref(xv[i], zv[i])
		}
		be.Binary(op, y, x, z, kernels.NewBroadcast([]int{60}, []int{60}, []int{60}))
		check(t, op.String(), y, want, 1e-6)
	}
}

func TestRandomMatchesPhilox(t *testing.T) {
	g := kernels.Philox{Seed: 99, Offset: 3}
	u := buf(t, kernels.F32, 10)
	be.Uniform(u, 2, 4, g)
	nb := buf(t, kernels.F32, 10)
	be.Normal(nb, 1, 3, g)
	uw, nw := make([]float64, 10), make([]float64, 10)
	for i := range uw {
		uw[i] = 2 + 2*float64(kernels.ToUniform(g.Word(i)))
		nw[i] = 1 + 3*float64(g.NormalAt(i))
	}
	check(t, "uniform", u, uw, 1e-7)
	check(t, "normal", nb, nw, 1e-6)
	x := buf(t, kernels.F32, 1000)
	be.Fill(x, 1)
	d := buf(t, kernels.F32, 1000)
	be.Dropout(d, x, 0.25, g)
	kept := 0
	for i, v := range f32s(d) {
		keep := kernels.ToUniform(g.Word(i)) >= 0.25
		if keep && v != 1/0.75 || !keep && v != 0 {
			t.Fatalf("dropout element %d = %v (keep=%v)", i, v, keep)
		}
		if keep {
			kept++
		}
	}
	if kept < 700 || kept > 800 {
		t.Errorf("dropout kept %d of 1000 at p=0.25", kept)
	}
}

// TestSGDCases runs each branch of SGD's update (no momentum; momentum at
// the first and a later step, plain and Nesterov, with dampening) against
// torch.optim.SGD's rule in float64.
func TestSGDCases(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 2))
	for _, hp := range []kernels.SGDParams{
		{WeightDecay: 0.01},
		{Momentum: 0.9, WeightDecay: 0.01, FirstStep: true},
		{Momentum: 0.9, Dampening: 0.1, WeightDecay: 0.01},
		{Momentum: 0.8, WeightDecay: 0.02, Nesterov: true},
		{Momentum: 0.8, Nesterov: true, FirstStep: true},
	} {
		t.Run(fmt.Sprintf("%+v", hp), func(t *testing.T) {
			const n = 40
			p, pv := randBuf(t, rng, n)
			g, gv := randBuf(t, rng, n)
			m, mv := randBuf(t, rng, n)
			hp.LR = buf(t, kernels.F32, 1)
			be.Fill(hp.LR, 0.1)
			want, wantM := make([]float64, n), append([]float64(nil), mv...)
			for i := range want {
				d := gv[i] + float64(hp.WeightDecay)*pv[i]
				if hp.Momentum != 0 {
					mom := float64(hp.Momentum)
					if hp.FirstStep {
						wantM[i] = d
					} else {
						wantM[i] = mom*mv[i] + (1-float64(hp.Dampening))*d
					}
					if hp.Nesterov {
						d += mom * wantM[i]
					} else {
						d = wantM[i]
					}
				}
				want[i] = pv[i] - 0.1*d
			}
			moms := []kernels.Buf{m}
			if hp.Momentum == 0 {
				moms = nil
			}
			be.SGD(hp, []kernels.Buf{p}, []kernels.Buf{g}, moms)
			check(t, "sgd param", p, want, 1e-6)
			check(t, "sgd momentum", m, wantM, 1e-6)
		})
	}
}

func TestOptimizers(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 1))
	p, pv := randBuf(t, rng, 9)
	g, gv := randBuf(t, rng, 9)
	m := buf(t, kernels.F32, 9)
	scalar := func(v float32) kernels.Buf {
		b := buf(t, kernels.F32, 1)
		be.Fill(b, v)
		return b
	}
	be.SGD(kernels.SGDParams{LR: scalar(0.1), Momentum: 0.9, WeightDecay: 0.01, Nesterov: true, FirstStep: true},
		[]kernels.Buf{p}, []kernels.Buf{g}, []kernels.Buf{m})
	want, wantM := make([]float64, 9), make([]float64, 9)
	for i := range want {
		d := gv[i] + 0.01*pv[i]
		wantM[i] = d
		want[i] = pv[i] - 0.1*(d+0.9*d)
	}
	check(t, "sgd param", p, want, 1e-6)
	check(t, "sgd momentum", m, wantM, 1e-6)

	q, qv := randBuf(t, rng, 9)
	mv, vv := buf(t, kernels.F32, 9), buf(t, kernels.F32, 9)
	be.Fill(mv, 0)
	be.Fill(vv, 0)
	step := buf(t, kernels.I32, kernels.CounterLen)
	be.Fill(step, 0)
	be.Increment(step, 1, kernels.Buf{})
	be.AdamW(kernels.AdamWParams{LR: scalar(1e-2), Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1, Step: step},
		[]kernels.Buf{q}, []kernels.Buf{g}, []kernels.Buf{mv}, []kernels.Buf{vv})
	for i := range want {
		pp := qv[i] * (1 - 1e-3)
		m1, v1 := 0.1*gv[i], 0.001*gv[i]*gv[i]
		want[i] = pp - 1e-2*(m1/0.1)/(math.Sqrt(v1/0.001)+1e-8)
	}
	check(t, "adamw param", q, want, 1e-5)

	found := buf(t, kernels.F32, 1)
	be.Fill(found, 0)
	be.UnscaleCheck([]kernels.Buf{g}, scalar(2), found)
	if f32s(found)[0] != 0 {
		t.Error("finite gradients flagged")
	}
	f32s(g)[4] = float32(math.Inf(1))
	be.UnscaleCheck([]kernels.Buf{p, g}, scalar(2), found)
	if f32s(found)[0] != 1 {
		t.Error("infinite gradient not flagged")
	}
	// Every position, in gradients that the AVX-512 pass takes none of (9),
	// all of (32) and part of (37), whose Go loop keeps four sums.
	for _, n := range []int{9, 32, 37} {
		g := buf(t, kernels.F32, n)
		for at := range n {
			for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(-1))} {
				be.Fill(found, 0)
				be.Fill(g, 1)
				f32s(g)[at] = bad
				be.UnscaleCheck([]kernels.Buf{g}, scalar(2), found)
				if other := (at + 1) % n; f32s(found)[0] != 1 || f32s(g)[other] != 0.5 {
					t.Errorf("%d gradients, %v at %d: found %v, g[%d] = %v (want 1, 0.5)", n, bad, at, f32s(found)[0], other, f32s(g)[other])
				}
			}
		}
		be.Fill(found, 0)
		be.Fill(g, 3)
		be.UnscaleCheck([]kernels.Buf{g}, scalar(2), found)
		if f32s(found)[0] != 0 || f32s(g)[n-1] != 1.5 || f32s(g)[0] != 1.5 {
			t.Errorf("%d finite gradients: found %v, g[0] %v, g[%d] %v (want 0, 1.5, 1.5)", n, f32s(found)[0], f32s(g)[0], n-1, f32s(g)[n-1])
		}
	}
	// A gradient split over the cores: a bad value in the last part.
	big := buf(t, kernels.F32, 3*elemGrain+5)
	be.Fill(big, 1)
	f32s(big)[big.N-2] = float32(math.NaN())
	be.Fill(found, 0)
	be.UnscaleCheck([]kernels.Buf{big}, scalar(4), found)
	if f32s(found)[0] != 1 || f32s(big)[0] != 0.25 || f32s(big)[big.N-1] != 0.25 {
		t.Errorf("NaN in the last part of %d gradients: found %v, g[0] %v, g[last] %v (want 1, 0.25, 0.25)", big.N, f32s(found)[0], f32s(big)[0], f32s(big)[big.N-1])
	}
}

func TestAccumulateMetrics(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 9))
	const n, k = 23, 6
	logits, lv := randBuf(t, rng, n*k)
	labels := buf(t, kernels.I32, n)
	right := 0
	for i, l := range i32s(labels) {
		_ = l
		y := int32(rng.IntN(k))
		if i%3 == 0 { // make some rows right
			best := 0
			for j := 1; j < k; j++ {
				if lv[i*k+j] > lv[i*k+best] {
					best = j
				}
			}
			y = int32(best)
		}
		i32s(labels)[i] = y
		best := 0
		for j := 1; j < k; j++ {
			if lv[i*k+j] > lv[i*k+best] {
				best = j
			}
		}
		if int32(best) == y {
			right++
		}
	}
	loss := buf(t, kernels.F32, 1)
	f32s(loss)[0] = 1.25
	got := buf(t, kernels.F32, 1)
	be.Fill(got, -1)
	be.CountCorrect(got, logits, labels, n, k)
	check(t, "count correct", got, []float64{float64(right)}, 0)
	sums := buf(t, kernels.F32, 3)
	be.Fill(sums, 0)
	be.AccumulateMetrics(sums, loss, got, n)
	be.AccumulateMetrics(sums, loss, got, n)
	check(t, "metrics", sums, []float64{2 * 1.25 * n, 2 * float64(right), 2 * n}, 0)
}

// TestReLUGradF16EveryPattern: ReLU's gradient on F16 values (on their bits,
// nothing converted) passes dy exactly where the F32 operation does, for y
// of every bit pattern: zeros of both signs, subnormals, infinities, NaNs.
func TestReLUGradF16EveryPattern(t *testing.T) {
	n := 1<<16 + 7 // a tail past the vectors
	y, dy := buf(t, kernels.F16, n), buf(t, kernels.F16, n)
	rng := rand.New(rand.NewPCG(3, 9))
	for i := range u16s(y) {
		u16s(y)[i] = uint16(i)
		u16s(dy)[i] = uint16(rng.Uint32()) &^ 0x4000 // finite, mostly
	}
	yf, dyf, dxf := buf(t, kernels.F32, n), buf(t, kernels.F32, n), buf(t, kernels.F32, n)
	be.Cast(yf, y)
	be.Cast(dyf, dy)
	be.UnaryBackward(kernels.ReLU, dxf, dyf, kernels.Buf{}, yf)
	want, dx := buf(t, kernels.F16, n), buf(t, kernels.F16, n)
	be.Cast(want, dxf)
	be.UnaryBackward(kernels.ReLU, dx, dy, kernels.Buf{}, y)
	for i, h := range u16s(dx) {
		if w := u16s(want)[i]; h != w && !(float16.Frombits(h).IsNaN() && float16.Frombits(w).IsNaN()) {
			t.Fatalf("y %#04x, dy %#04x: dx %#04x, want %#04x", u16s(y)[i], u16s(dy)[i], h, w)
		}
	}
}

// TestAffineReLUPassesNaN: the fused normalisation output keeps a NaN
// through its ReLU, in the assembly pass (its whole vectors and its masked
// tail) and in the Go loop, as PyTorch does, so a diverging step stays
// visible.
func TestAffineReLUPassesNaN(t *testing.T) {
	on := maskedPasses
	defer func() { maskedPasses = on }()
	for _, asm := range []bool{true, false} {
		if asm && !on {
			continue
		}
		maskedPasses = asm
		x := make([]float32, 37)
		for i := range x {
			x[i] = -1
		}
		x[2], x[35] = float32(math.NaN()), float32(math.NaN())
		y := make([]float32, len(x))
		one := func(v []float32) channel { return channel{f: v, planes: 1, ld: len(v), hw: len(v)} }
		affineChannel(one(y), one(x), channel{}, 2, 0.5, true)
		if y[2] == y[2] || y[35] == y[35] || y[0] != 0 { // NaN is the value unequal to itself
			t.Errorf("assembly %v: y[2], y[35], y[0] = %v, %v, %v; want NaN, NaN, 0", asm, y[2], y[35], y[0])
		}
	}
}

// BenchmarkConvResNet20 reports GFLOP/s of ResNet-20's convolutions at
// batch 32 (stride 1 at each stage's width, the first layer's one input
// channel, the strided 3×3 and 1×1 ones), forward, data and filter
// gradient, in F32.
func BenchmarkConvResNet20(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	t := &testing.T{}
	for _, p := range []kernels.ConvParams{
		{N: 32, C: 16, H: 28, W: 28, K: 16, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 32, C: 32, H: 14, W: 14, K: 32, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 32, C: 64, H: 7, W: 7, K: 64, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 32, C: 1, H: 28, W: 28, K: 16, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 32, C: 16, H: 28, W: 28, K: 32, R: 3, S: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1},
		{N: 32, C: 32, H: 14, W: 14, K: 64, R: 3, S: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1},
		{N: 32, C: 16, H: 28, W: 28, K: 32, R: 1, S: 1, StrideH: 2, StrideW: 2},
	} {
		x, _ := randBuf(t, rng, p.N*p.C*p.H*p.W)
		w, _ := randBuf(t, rng, p.K*p.C*p.R*p.S)
		dy, _ := randBuf(t, rng, p.N*p.K*p.OutH()*p.OutW())
		y, dx, dw := buf(t, kernels.F32, dy.N), buf(t, kernels.F32, x.N), buf(t, kernels.F32, w.N)
		flops := float64(2 * p.N * p.K * p.C * p.R * p.S * p.OutH() * p.OutW())
		for _, c := range []struct {
			name string
			run  func()
		}{
			{"forward", func() { be.Conv2d(p, x, w, y) }},
			{"data", func() { be.Conv2dBackwardData(p, dy, w, dx) }},
			{"filter", func() { be.Conv2dBackwardFilter(p, x, dy, dw) }},
		} {
			if p.C == 1 && c.name == "data" {
				continue // the first layer's input needs no gradient
			}
			b.Run(fmt.Sprintf("%dx%dx%d-%d/k=%d/stride=%d/%s", p.C, p.H, p.W, p.R, p.K, p.StrideH, c.name), func(b *testing.B) {
				for b.Loop() {
					c.run()
				}
				b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkBatchNormF16 times a fused batch norm's forward and backward
// (residual, ReLU) on F16 activations of ResNet-20's first and last stages
// at batch 32, with the half passes and with the planes converted first,
// and on F32 ones.
func BenchmarkBatchNormF16(b *testing.B) {
	if !halfPasses {
		b.Skip("no half passes on this CPU")
	}
	for _, p := range []kernels.BNParams{
		{N: 32, C: 16, HW: 28 * 28, Eps: 1e-5, Momentum: 0.1, ReLU: true},
		{N: 32, C: 64, HW: 7 * 7, Eps: 1e-5, Momentum: 0.1, ReLU: true},
	} {
		t := &testing.T{}
		rng := rand.New(rand.NewPCG(1, 2))
		half := func(n int) kernels.Buf {
			f, _ := randBuf(t, rng, n)
			h := buf(t, kernels.F16, n)
			be.Cast(h, f)
			return h
		}
		n := p.N * p.C * p.HW
		x, r, dy := half(n), half(n), half(n)
		y, dx, dr := buf(t, kernels.F16, n), buf(t, kernels.F16, n), buf(t, kernels.F16, n)
		g, _ := randBuf(t, rng, p.C)
		bb, _ := randBuf(t, rng, p.C)
		rm, rv, sm, si, dg, db := buf(t, kernels.F32, p.C), buf(t, kernels.F32, p.C), buf(t, kernels.F32, p.C), buf(t, kernels.F32, p.C), buf(t, kernels.F32, p.C), buf(t, kernels.F32, p.C)
		be.Fill(rm, 0)
		be.Fill(rv, 1)
		for _, on := range []bool{true, false} {
			b.Run(fmt.Sprintf("C=%d/HW=%d/half=%v", p.C, p.HW, on), func(b *testing.B) {
				halfPasses = on
				defer func() { halfPasses = true }()
				for b.Loop() {
					be.BatchNormTrain(p, x, r, g, bb, y, rm, rv, sm, si)
					be.BatchNormBackward(p, x, y, kernels.Buf{}, dy, g, kernels.Buf{}, sm, si, dx, dr, dg, db)
				}
			})
		}
		// The same in F32, for scale.
		f32 := func(h kernels.Buf) kernels.Buf {
			f := buf(t, kernels.F32, h.N)
			be.Cast(f, h)
			return f
		}
		xf, rf, dyf := f32(x), f32(r), f32(dy)
		yf, dxf, drf := buf(t, kernels.F32, n), buf(t, kernels.F32, n), buf(t, kernels.F32, n)
		b.Run(fmt.Sprintf("C=%d/HW=%d/f32", p.C, p.HW), func(b *testing.B) {
			for b.Loop() {
				be.BatchNormTrain(p, xf, rf, g, bb, yf, rm, rv, sm, si)
				be.BatchNormBackward(p, xf, yf, kernels.Buf{}, dyf, g, kernels.Buf{}, sm, si, dxf, drf, dg, db)
			}
		})
	}
}

// TestElementwiseF16MatchesF32: every elementwise operation and reduction on
// F16 operands (converted a chunk at a time) gives, bit for bit, the F32
// operation on the same values, rounded; in place too. Lengths cross the
// chunk (2,048) and the grain of a goroutine (65,536); broadcast rows are
// shorter and longer than a chunk, and strided.
func TestElementwiseHalfMatchesF32(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 2))
	type op struct {
		name    string
		in      [][]int // input shapes
		out     []int
		run     func(y kernels.Buf, in ...kernels.Buf)
		inPlace bool // may write over its first input
	}
	var ops []op
	for _, n := range []int{5, 2049, 140001} {
		for _, u := range kernels.UnaryOps() {
			ops = append(ops,
				op{fmt.Sprintf("%v/%d", u, n), [][]int{{n}}, []int{n}, func(y kernels.Buf, in ...kernels.Buf) { be.Unary(u, y, in[0]) }, true},
				op{fmt.Sprintf("%v backward/%d", u, n), [][]int{{n}, {n}}, []int{n}, func(y kernels.Buf, in ...kernels.Buf) {
					// x and y of the forward both given: in[1] plays both.
					be.UnaryBackward(u, y, in[0], in[1], in[1])
				}, true})
		}
		ops = append(ops, op{fmt.Sprintf("relu backward, y only/%d", n), [][]int{{n}, {n}}, []int{n},
			func(y kernels.Buf, in ...kernels.Buf) { be.UnaryBackward(kernels.ReLU, y, in[0], kernels.Buf{}, in[1]) }, true})
		ops = append(ops, op{fmt.Sprintf("affine/%d", n), [][]int{{n}}, []int{n},
			func(y kernels.Buf, in ...kernels.Buf) { be.Affine(y, in[0], -1.5, 0.25) }, true})
	}
	for _, shapes := range [][3][]int{
		{{140001}, {140001}, {140001}},
		{{3, 2049}, {3, 2049}, {3, 2049}},
		{{128, 256}, {256}, {128, 256}},            // a bias
		{{4, 5000}, {5000}, {4, 5000}},             // rows longer than a chunk
		{{6, 3, 9, 9}, {1, 3, 1, 1}, {6, 3, 9, 9}}, // a channel's scale: stride 0
		{{2, 3, 2500}, {1, 3, 1}, {2, 3, 2500}},    // stride 0 past a chunk
		{{7, 1}, {1, 300}, {7, 300}},               // an outer sum: both strided
	} {
		for _, b := range kernels.BinaryOps() {
			bc := kernels.NewBroadcast(shapes[2], shapes[0], shapes[1])
			ops = append(ops, op{fmt.Sprintf("%v/%v,%v", b, shapes[0], shapes[1]), [][]int{shapes[0], shapes[1]}, shapes[2],
				func(y kernels.Buf, in ...kernels.Buf) { be.Binary(b, y, in[0], in[1], bc) }, slices.Equal(shapes[0], shapes[2])})
		}
	}
	for _, r := range []kernels.Reduction{{Outer: 3, Len: 50, Inner: 1}, {Outer: 1, Len: 128, Inner: 256},
		{Outer: 2, Len: 7, Inner: 5000}, {Outer: 1, Len: 9000, Inner: 1}} {
		for _, red := range []kernels.ReduceOp{kernels.Sum, kernels.Mean, kernels.Max} {
			ops = append(ops, op{fmt.Sprintf("%v/%+v", red, r), [][]int{{r.Outer * r.Len * r.Inner}}, []int{r.Outer * r.Inner},
				func(y kernels.Buf, in ...kernels.Buf) { be.Reduce(red, y, in[0], r) }, false})
		}
	}
	size := func(shape []int) int {
		n := 1
		for _, d := range shape {
			n *= d
		}
		return n
	}
	for _, hdt := range []kernels.DType{kernels.F16, kernels.BF16} {
		for _, o := range ops {
			var hs, fs []kernels.Buf
			for _, shape := range o.in {
				n := size(shape)
				f, _ := randBuf(t, rng, n)
				h := buf(t, hdt, n)
				be.Cast(h, f)
				be.Cast(f, h) // the F32 operand holds the rounded values
				hs, fs = append(hs, h), append(fs, f)
			}
			n := size(o.out)
			yf, want, yh := buf(t, kernels.F32, n), buf(t, hdt, n), buf(t, hdt, n)
			o.run(yf, fs...)
			be.Cast(want, yf)
			o.run(yh, hs...)
			if !slices.Equal(u16s(yh), u16s(want)) {
				t.Errorf("%s: %v differs from the F32 operation rounded", o.name, hdt)
			}
			if o.inPlace {
				o.run(hs[0], hs...)
				if !slices.Equal(u16s(hs[0]), u16s(want)) {
					t.Errorf("%s: %v in place differs from the F32 operation rounded", o.name, hdt)
				}
			}
		}
	}
}

// TestAdamWPassMatchesLoop: AdamW's vector pass (AVX-512, where the CPU has
// it) gives the bits of the Go loop, at every length around its sixteen
// values and with a gradient scale, so that an update is the same wherever
// a stretch ends (a sharded or offloaded optimizer's stretches).
func TestAdamWPassMatchesLoop(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{1, 15, 16, 17, 33, 1000, 4099} {
		for _, a := range []adamw{
			{decay: 1 - 1e-4*0.1, b1: 0.9, b2: 0.95, c1: 0.1, c2: 0.05, eps: 1e-8, stepSize: 1e-4 / 0.19, bc2Sqrt: 0.31, gs: 1},
			{decay: 1, b1: 0.8, b2: 0.999, c1: 0.2, c2: 0.001, eps: 1e-6, stepSize: 3e-3, bc2Sqrt: 0.9, gs: 1.0 / 1024},
		} {
			p, g, m, v := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
			for i := range p {
				p[i], g[i], m[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64()*0.01), float32(rng.NormFloat64()*0.001)
				v[i] = m[i] * m[i] * float32(rng.Float64())
			}
			p2, m2, v2 := slices.Clone(p), slices.Clone(m), slices.Clone(v)
			a.update(p, g, m, v)
			a.loop(p2, g, m2, v2)
			for i := range p {
				if math.Float32bits(p[i]) != math.Float32bits(p2[i]) || math.Float32bits(m[i]) != math.Float32bits(m2[i]) ||
					math.Float32bits(v[i]) != math.Float32bits(v2[i]) {
					t.Fatalf("n %d, %+v, value %d: pass p %v m %v v %v, loop p %v m %v v %v", n, a, i, p[i], m[i], v[i], p2[i], m2[i], v2[i])
				}
			}
		}
	}
}

// TestSumPart: a part widened into a sum (SumPart) gives, on fresh
// random values, the float64 reference's sum rounded once to F32, and the
// squares of the values written within a millionth, for F32, BF16
// and F16 parts, first parts and later ones, lengths around its blocks,
// in place on the sum or on an F32 part; and a 16-bit part that overlaps
// its destination panics.
func TestSumPart(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
		for _, n := range []int{1, chunkLen + 3, 2*elemGrain + 17} {
			for _, c := range []struct {
				first bool
				into  string // dst: "own" (poisoned), "sum", "part" (F32 only)
			}{{true, "own"}, {false, "own"}, {false, "sum"}, {false, "part"}, {true, "part"}} {
				if c.into == "part" && dt != kernels.F32 || c.first && c.into == "sum" {
					continue
				}
				name := fmt.Sprintf("%v n %d %+v", dt, n, c)
				wide := buf(t, kernels.F32, n)
				for i := range f32s(wide) {
					f32s(wide)[i] = float32(rng.NormFloat64())
				}
				part := wide
				if dt != kernels.F32 {
					part = buf(t, dt, n)
					be.Cast(part, wide)
				}
				var sum kernels.Buf
				want := make([]float64, n)
				for i, v := range in(part) {
					want[i] = float64(v)
				}
				if !c.first {
					sum = buf(t, kernels.F32, n)
					for i := range f32s(sum) {
						f32s(sum)[i] = float32(rng.NormFloat64() * 3)
						want[i] += float64(f32s(sum)[i])
					}
				}
				dst := map[string]kernels.Buf{"own": buf(t, kernels.F32, n), "sum": sum, "part": part}[c.into] // buf poisons
				got := be.SumPart(dst, sum, part)
				var squares float64
				for i, w := range want {
					if v := f32s(dst)[i]; v != float32(w) {
						t.Fatalf("%s: value %d is %v, want %v", name, i, v, float32(w))
					}
					squares += float64(float32(w)) * float64(float32(w))
				}
				if math.Abs(got-squares) > 1e-6*squares { // float32 lanes within a stretch (sumSquares)
					t.Errorf("%s: the squares sum to %v, want %v", name, got, squares)
				}
			}
		}
	}
	whole := buf(t, kernels.BF16, 128)
	part := kernels.Buf{Block: whole.Block, Off: whole.Off, N: 64, DType: kernels.BF16} // the first half of dst's bytes
	dst := kernels.Buf{Block: whole.Block, Off: whole.Off, N: 64, DType: kernels.F32}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "overlaps") {
			t.Errorf("a BF16 part under its destination: recovered %v, want a panic naming the overlap", r)
		}
	}()
	be.SumPart(dst, kernels.Buf{}, part)
}

// TestAdamWMaster: AdamW over F32 masters from 16-bit gradients
// (AdamWMaster) gives the bits of widening the gradients (Cast), AdamW
// and rounding the masters (Cast), in BF16 and F16, at lengths around its
// stretches and over many goroutines, with and without decay and a
// gradient scale, its working weights in a buffer of their own or the
// gradients'; from F32 gradients, those of AdamW and rounding; and a set
// skip flag leaves everything as it was.
func TestAdamWMaster(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	random := func(n int, scale float64) kernels.Buf {
		b := buf(t, kernels.F32, n)
		for i := range f32s(b) {
			f32s(b)[i] = float32(rng.NormFloat64() * scale)
		}
		return b
	}
	bits := func(b kernels.Buf) []byte { return slices.Clone(raw(b)[:b.Bytes()]) }
	lr, scale := buf(t, kernels.F32, 1), buf(t, kernels.F32, 1)
	f32s(lr)[0], f32s(scale)[0] = 3e-3, 0.25
	step := buf(t, kernels.I32, kernels.CounterLen)
	*counter(step) = 3
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F16} {
		for _, n := range []int{1, 17, masterChunk + 5, 3*elemGrain + 1001} {
			for _, c := range []struct {
				decay   float32
				scaled  bool
				inPlace bool
				wide    bool // an F32 gradient (a micro-batched step's sum)
			}{{0, false, false, false}, {0.1, true, false, false}, {0.1, false, true, false}, {0.1, true, false, true}} {
				name := fmt.Sprintf("%v n %d %+v", dt, n, c)
				p, m, v := random(n, 1), random(n, 1e-3), random(n, 1e-3)
				for i, x := range f32s(v) {
					f32s(v)[i] = x * x
				}
				g := buf(t, dt, n)
				be.Cast(g, random(n, 0.01))
				if c.wide {
					g = random(n, 0.01)
				}
				hp := kernels.AdamWParams{LR: lr, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: c.decay, Step: step}
				if c.scaled {
					hp.GradScale = scale
				}
				// The reference: widened, updated, rounded, each a pass.
				rp, rm, rv, rg := buf(t, kernels.F32, n), buf(t, kernels.F32, n), buf(t, kernels.F32, n), buf(t, kernels.F32, n)
				be.Copy(rp, p)
				be.Copy(rm, m)
				be.Copy(rv, v)
				be.Cast(rg, g)
				be.AdamW(hp, []kernels.Buf{rp}, []kernels.Buf{rg}, []kernels.Buf{rm}, []kernels.Buf{rv})
				rw := buf(t, dt, n)
				be.Cast(rw, rp)
				w := g
				if !c.inPlace {
					w = buf(t, dt, n) // poisoned
				}
				be.AdamWMaster(hp, []kernels.Buf{p}, []kernels.Buf{g}, []kernels.Buf{m}, []kernels.Buf{v}, []kernels.Buf{w})
				for _, s := range []struct {
					what      string
					got, want kernels.Buf
				}{{"master", p, rp}, {"first moment", m, rm}, {"second moment", v, rv}, {"working weights", w, rw}} {
					if got, want := bits(s.got), bits(s.want); !slices.Equal(got, want) {
						i := 0
						for got[i] == want[i] {
							i++
						}
						t.Fatalf("%s: %s differ from the passes' at byte %d of %d", name, s.what, i, len(got))
					}
				}
			}
		}
	}
	// A skipped step writes nothing.
	skip := buf(t, kernels.F32, 1)
	f32s(skip)[0] = 1
	p, m, v, g, w := random(40, 1), random(40, 1), random(40, 1), buf(t, kernels.BF16, 40), buf(t, kernels.BF16, 40)
	be.Cast(g, random(40, 1))
	before := [][]byte{bits(p), bits(m), bits(v), bits(w)}
	be.AdamWMaster(kernels.AdamWParams{LR: lr, Beta1: 0.9, Beta2: 0.95, Step: step, Skip: skip},
		[]kernels.Buf{p}, []kernels.Buf{g}, []kernels.Buf{m}, []kernels.Buf{v}, []kernels.Buf{w})
	for i, b := range []kernels.Buf{p, m, v, w} {
		if !slices.Equal(bits(b), before[i]) {
			t.Errorf("a skipped step changed buffer %d", i)
		}
	}
}
