package sgemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leangrad/leangrad/kernels/cpu/internal/half"
)

// reference is C = alpha·op(A)·op(B) + beta·C in float64, the plain triple loop.
//
//go:norace
func reference(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) []float64 {
	out := make([]float64, len(c))
	for i, v := range c {
		out[i] = float64(v)
	}
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for p := 0; p < k; p++ {
				ai, bi := i*lda+p, p*ldb+j
				if transA {
					ai = p*lda + i
				}
				if transB {
					bi = j*ldb + p
				}
				av, bv := a[ai], b[bi]
				s += float64(av) * float64(bv)
			}
			prev := float64(beta) * float64(c[i*ldc+j])
			if beta == 0 {
				prev = 0
			}
			out[i*ldc+j] = float64(alpha)*s + prev
		}
	}
	return out
}

//go:norace
func random(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

// multipliers are every kernel on one goroutine and on three.
func multipliers(t testing.TB) []*Multiplier {
	var out []*Multiplier
	for _, name := range Kernels() {
		for _, threads := range []int{1, 3} {
			mu, err := New(name, threads)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, mu)
		}
	}
	return out
}

func TestGemmAgainstFloat64(t *testing.T) {
	shapes := []struct{ m, n, k int }{
		{1, 1, 1}, {3, 5, 7}, {8, 48, 16}, {6, 16, 1}, {17, 49, 33}, {9, 97, 300},
		{145, 50, 257}, {64, 784, 144}, {300, 7, 520}, {7, 4100, 3}, {0, 5, 3}, {4, 5, 0},
	}
	params := []struct{ alpha, beta float32 }{{1, 0}, {0.5, 1}, {-2, 0.25}, {0, 3}}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, mu := range multipliers(t) {
		for _, s := range shapes {
			for _, ta := range []bool{false, true} {
				for _, tb := range []bool{false, true} {
					for pi, ab := range params {
						name := fmt.Sprintf("%s/t%d/%dx%dx%d/ta=%v/tb=%v/ab%d", mu.Kernel(), mu.threads, s.m, s.n, s.k, ta, tb, pi)
						// Strides wider than the rows, so a kernel that assumes dense rows fails.
						ar, ac := s.m, s.k
						if ta {
							ar, ac = s.k, s.m
						}
						br, bc := s.k, s.n
						if tb {
							br, bc = s.n, s.k
						}
						lda, ldb, ldc := ac+3, bc+1, s.n+2
						a := random(rng, max(ar*lda, 1))
						b := random(rng, max(br*ldb, 1))
						c := random(rng, max(s.m*ldc, 1))
						if ab.beta == 0 {
							for i := range c {
								c[i] = float32(math.NaN()) // beta 0 must not read C
							}
						}
						want := reference(ta, tb, s.m, s.n, s.k, ab.alpha, a, lda, b, ldb, ab.beta, c, ldc)
						mu.Gemm(ta, tb, s.m, s.n, s.k, ab.alpha, a, lda, b, ldb, ab.beta, c, ldc)
						checkClose(t, name, c, want, s.m, s.n, ldc, s.k)
					}
				}
			}
		}
	}
}

// checkClose compares C's m×n block with the reference, to float32
// accumulation error over k terms; the padding between rows must be untouched.
//
//go:norace
func checkClose(t *testing.T, name string, got []float32, want []float64, m, n, ldc, k int) {
	t.Helper()
	var num, den float64
	for i := 0; i < m; i++ {
		for j := 0; j < ldc; j++ {
			g, w := float64(got[i*ldc+j]), want[i*ldc+j]
			if j >= n {
				if math.Float64bits(g) != math.Float64bits(w) && !(math.IsNaN(g) && math.IsNaN(w)) {
					t.Fatalf("%s: wrote outside C at (%d, %d)", name, i, j)
				}
				continue
			}
			if math.IsNaN(g) {
				t.Fatalf("%s: NaN at (%d, %d)", name, i, j)
			}
			num += (g - w) * (g - w)
			den += w * w
		}
	}
	tol := 1e-6 * math.Sqrt(float64(k)+1)
	if den > 0 && math.Sqrt(num/den) > tol {
		t.Fatalf("%s: relative error %.3g > %.3g", name, math.Sqrt(num/den), tol)
	}
}

func TestNewRefusesUnknownKernel(t *testing.T) {
	if _, err := New("avx9000", 1); err == nil {
		t.Fatal("New accepted an unknown kernel")
	}
	if _, err := New("go", -1); err == nil {
		t.Fatal("New accepted -1 threads")
	}
}

func TestGemmPanicsOnShortSlices(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || fmt.Sprint(r) != "sgemm: A is 4×5 with stride 5 but has 19 elements" {
			t.Fatalf("panic %v", r)
		}
	}()
	Default().Gemm(false, false, 4, 2, 5, 1, make([]float32, 19), 5, make([]float32, 10), 2, 0, make([]float32, 8), 2)
}

// BenchmarkGemm reports GFLOP/s of square products on one goroutine and on
// all of them, for each kernel.
func BenchmarkGemm(b *testing.B) {
	for _, name := range Kernels() {
		for _, threads := range []int{1, 0} {
			mu, _ := New(name, threads)
			for _, n := range []int{256, 512, 1024} {
				b.Run(fmt.Sprintf("%s/threads=%d/%d", name, threads, n), func(b *testing.B) {
					rng := rand.New(rand.NewPCG(1, 2))
					x, y, z := random(rng, n*n), random(rng, n*n), make([]float32, n*n)
					for b.Loop() {
						mu.Gemm(false, false, n, n, n, 1, x, n, y, n, 0, z, n)
					}
					b.ReportMetric(2*float64(n*n*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}

func BenchmarkPeak(b *testing.B) {
	for _, name := range Kernels() {
		mu, _ := New(name, 1)
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				b.ReportMetric(mu.PeakGFLOPS(100*time.Millisecond), "GFLOP/s")
			}
		})
	}
}

func TestGemmShiftedAgainstFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, mu := range multipliers(t) {
		for _, s := range []struct{ m, n, k int }{{1, 1, 1}, {8, 48, 9}, {17, 101, 27}, {150, 900, 400}, {5, 3, 2}} {
			data := random(rng, 3*s.n+mu.WindowLen(s.n)+50)
			offs := make([]int, s.k)
			b := make([]float32, s.k*s.n)
			for p := range offs {
				offs[p] = rng.IntN(len(data) - mu.WindowLen(s.n) + 1)
				copy(b[p*s.n:], data[offs[p]:][:s.n])
			}
			a := random(rng, s.m*s.k)
			for _, beta := range []float32{0, 1} {
				c := random(rng, s.m*s.n)
				want := reference(false, false, s.m, s.n, s.k, 1.5, a, s.k, b, s.n, beta, c, s.n)
				mu.GemmShifted(s.m, s.n, s.k, 1.5, MatrixA(a, s.k, false), Shifted{Data: data, Offsets: offs}, beta, c, s.n)
				checkClose(t, fmt.Sprintf("%s/t%d/%v/beta=%v", mu.Kernel(), mu.threads, s, beta), c, want, s.m, s.n, s.n, s.k)
			}
		}
	}
}

func TestGemmRowsAgainstFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, mu := range multipliers(t) {
		// Dot tiles (k ≥ 32·m): two vectors, a tail past the vectors, more
		// than one chunk, m and n off the 4×6 tile. Packed: k below one
		// vector, k short beside m.
		for _, s := range []struct{ m, n, k int }{{1, 6, 32}, {3, 2, 5*16 + 37}, {5, 13, 160}, {17, 150, 2048*2 + 21},
			{3, 2, 5}, {4, 6, 16}, {64, 7, 300}, {64, 50, 1024}} {
			data := random(rng, 4*s.k+100)
			rowsAt := func(n int) []int {
				offs := make([]int, n)
				for i := range offs {
					offs[i] = rng.IntN(len(data) - s.k + 1)
				}
				return offs
			}
			a, b := Rows{Data: data, Offsets: rowsAt(s.m)}, Rows{Data: data, Offsets: rowsAt(s.n)}
			am, bm := make([]float32, s.m*s.k), make([]float32, s.n*s.k)
			for i, o := range a.Offsets {
				copy(am[i*s.k:], data[o:][:s.k])
			}
			for j, o := range b.Offsets {
				copy(bm[j*s.k:], data[o:][:s.k])
			}
			for _, beta := range []float32{0, 1} {
				ldc := s.n + 1
				c := random(rng, s.m*ldc)
				want := reference(false, true, s.m, s.n, s.k, 1, am, s.k, bm, s.k, beta, c, ldc)
				mu.GemmRows(s.m, s.n, s.k, a, b, beta, c, ldc)
				checkClose(t, fmt.Sprintf("%s/t%d/%v/beta=%v", mu.Kernel(), mu.threads, s, beta), c, want, s.m, s.n, ldc, s.k)
			}
		}
	}
}

func TestGemmShiftedChecksWindows(t *testing.T) {
	defer func() {
		if r := recover(); r == nil {
			t.Fatal("a window past the data was accepted")
		}
	}()
	Default().GemmShifted(1, 4, 1, 1, MatrixA([]float32{1}, 1, false), Shifted{Data: make([]float32, 8), Offsets: []int{7}}, 0, make([]float32, 4), 4)
}

// BenchmarkKernel reports each microkernel's GFLOP/s on panels that stay in
// L1: the ceiling the blocking around it works towards.
func BenchmarkKernel(b *testing.B) {
	for _, k := range kernels {
		b.Run(k.name, func(b *testing.B) {
			const kc = 128
			a := make([]float32, kc*k.mr)
			bb := make([]float32, kc*k.nr)
			c := make([]float32, k.mr*k.nr)
			for b.Loop() {
				for i := 0; i < 1000; i++ {
					k.run(kc, &a[0], &bb[0], &c[0], k.nr, true)
				}
			}
			b.ReportMetric(2*float64(kc*k.mr*k.nr)*1000*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkGemmMLP reports GFLOP/s of the products of one training step of
// the benchmark harness's MLP (784-256-10, batch 128): the forward
// x·W₁ᵀ and the weight gradient dYᵀ·x of the first layer, on F32 operands
// and on F16 ones (AMP's, converted as they are packed), on one goroutine
// and on all of them.
func BenchmarkGemmMLP(b *testing.B) {
	const batch, in, out = 128, 784, 256
	for _, threads := range []int{1, 0} {
		mu := Default().WithThreads(threads)
		rng := rand.New(rand.NewPCG(1, 2))
		x, w, dy := random(rng, batch*in), random(rng, out*in), random(rng, batch*out)
		xh, wh, dyh := halves(x), halves(w), halves(dy)
		y, dw := make([]float32, batch*out), make([]float32, out*in)
		// The operands as Gemm lays them out (see MatrixA and MatrixB).
		fwdA, fwdB := Half{Data: xh, Free: in, Shared: 1}, Half{Data: wh, Free: in, Shared: 1}
		gradA, gradB := Half{Data: dyh, Free: 1, Shared: out}, Half{Data: xh, Free: 1, Shared: in}
		for _, c := range []struct {
			name    string
			product func()
		}{
			{"forward", func() { mu.Gemm(false, true, batch, out, in, 1, x, in, w, in, 0, y, out) }},
			{"weight-grad", func() { mu.Gemm(true, false, out, in, batch, 1, dy, out, x, in, 0, dw, in) }},
			{"forward-f16", func() { mu.GemmOp(batch, out, in, 1, fwdA, fwdB, 0, y, out) }},
			{"weight-grad-f16", func() { mu.GemmOp(out, in, batch, 1, gradA, gradB, 0, dw, in) }},
		} {
			b.Run(fmt.Sprintf("%s/threads=%d", c.name, threads), func(b *testing.B) {
				for b.Loop() {
					c.product()
				}
				b.ReportMetric(2*float64(batch*in*out)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// halves is x rounded to IEEE halves (their bits).
func halves(x []float32) []uint16 {
	h := make([]uint16, len(x))
	half.FromFloat32(h, x)
	return h
}

// TestHalfPacksAsStrided: packing F16 values gives, bit for bit, the panels
// of packing them converted to float32 first, for every layout (free
// dimension contiguous, shared dimension contiguous, neither), blocks that
// start anywhere, partial panels and lengths of k off the transposes' eight.
func TestHalfPacksAsStrided(t *testing.T) {
	const rows, cols = 37, 45
	rng := rand.New(rand.NewPCG(7, 8))
	h := halves(random(rng, rows*cols))
	h[5], h[77] = 0x7c00, 0xfe00 // an infinity and a NaN pass through
	f := make([]float32, len(h))
	half.ToFloat32(f, h)
	layouts := []struct{ free, shared, nf, k int }{
		{cols, 1, rows, cols},    // rows contiguous along k: the transposes
		{1, cols, cols, rows},    // the free dimension contiguous: row copies
		{3, cols * 4 / 3, 12, 9}, // neither: a gather
	}
	blocks := []struct{ f0, nf, p0, kc int }{
		{0, 8, 0, 8}, {0, 37, 0, 45}, {3, 17, 5, 19}, {1, 30, 2, 40}, {0, 1, 0, 1}, {9, 12, 7, 16},
	}
	for _, l := range layouts {
		for _, bl := range blocks {
			if bl.f0+bl.nf > l.nf || bl.p0+bl.kc > l.k {
				continue
			}
			for _, w := range []int{4, 8, 16, 48} {
				n := ceil(bl.nf, w) * w * bl.kc
				got, want := random(rng, n), random(rng, n) // stale panels: padding must be written
				Half{Data: h, Free: l.free, Shared: l.shared}.Pack(got, bl.f0, bl.nf, bl.p0, bl.kc, w)
				Strided{Data: f, Free: l.free, Shared: l.shared}.Pack(want, bl.f0, bl.nf, bl.p0, bl.kc, w)
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("free %d shared %d block %+v width %d: panel value %d is %v, want %v",
							l.free, l.shared, bl, w, i, got[i], want[i])
					}
				}
			}
		}
	}
}

// TestGemmOpTiles: done sees every element of C once, and each block it is
// given already holds the product's final values (k past one block of k
// included, and the k = 0 and alpha = 0 shortcuts).
func TestGemmOpTiles(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, mu := range multipliers(t) {
		for _, s := range []struct {
			m, n, k int
			alpha   float32
		}{{1, 1, 1, 1}, {17, 53, 9, 1}, {9, 100, 800, 0.5}, {70, 30, 0, 1}, {12, 12, 12, 0}} {
			name := fmt.Sprintf("%s/t%d/%dx%dx%d/alpha=%v", mu.Kernel(), mu.threads, s.m, s.n, s.k, s.alpha)
			a, b := random(rng, max(s.m*s.k, 1)), random(rng, max(s.k*s.n, 1))
			c := random(rng, s.m*s.n)
			want := reference(false, false, s.m, s.n, s.k, s.alpha, a, s.k, b, s.n, 0.5, c, s.n)
			seen := make([]int, len(c))
			var early atomic.Bool
			mu.GemmOpTiles(s.m, s.n, s.k, s.alpha, MatrixA(a, s.k, false), MatrixB(b, s.n, false), 0.5, c, s.n, func(i0, i1, j0, j1 int) {
				for i := i0; i < i1; i++ {
					for j := j0; j < j1; j++ {
						seen[i*s.n+j]++
						if d := math.Abs(float64(c[i*s.n+j]) - want[i*s.n+j]); d > 1e-3*(1+math.Abs(want[i*s.n+j])) {
							early.Store(true)
						}
					}
				}
			})
			for i, n := range seen {
				if n != 1 {
					t.Fatalf("%s: element %d given to done %d times", name, i, n)
				}
			}
			if early.Load() {
				t.Errorf("%s: done saw a block before its product was final", name)
			}
		}
	}
}

// BenchmarkGemmConv reports GFLOP/s of the products behind ResNet-20's
// stride-1 convolutions (batch 32, 3×3, padding 1), as the CPU backend
// runs them over a padded grid of a chunk of images: the forward with B
// read in place (GemmShifted) and the same product with B packed (GemmOp),
// and the filter gradient as tiles of dot products (GemmRows), with A's rows
// where they fall and on 64-byte boundaries. Flops count
// every grid column computed, so this isolates the products from the
// grid's fill and from the pixels it computes and drops.
func BenchmarkGemmConv(b *testing.B) {
	mu := Default()
	for _, s := range []struct{ c, hw, images int }{{16, 28, 18}, {32, 14, 32}, {64, 7, 32}} {
		wp := s.hw + 1 // a row and its one column of padding
		plane := wp + 1 + s.images*wp*wp
		cols := (s.images-1)*wp*wp + (s.hw-1)*wp + s.hw
		offs := make([]int, s.c*9)
		for t := range offs {
			ch, r, q := t/9, t%9/3, t%3
			offs[t] = ch*plane + r*wp + q
		}
		rng := rand.New(rand.NewPCG(1, 2))
		grid := random(rng, s.c*plane+mu.WindowLen(cols)+2*wp+2)
		w := random(rng, s.c*len(offs))
		pitch := ceil(cols, 16) * 16 // rows of A on 64-byte boundaries (for rows-aligned)
		out := make([]float32, s.c*pitch)
		rows, aligned := make([]int, s.c), make([]int, s.c)
		for k := range rows {
			rows[k], aligned[k] = k*cols, k*pitch
		}
		dw := make([]float32, s.c*len(offs))
		k := len(offs)
		for _, p := range []struct {
			name string
			run  func()
		}{
			{"shifted", func() {
				mu.GemmShifted(s.c, cols, k, 1, MatrixA(w, k, false), Shifted{Data: grid, Offsets: offs}, 0, out, cols)
			}},
			{"packed", func() {
				mu.GemmOp(s.c, cols, k, 1, MatrixA(w, k, false), Shifted{Data: grid, Offsets: offs}, 0, out, cols)
			}},
			{"rows", func() {
				mu.GemmRows(s.c, k, cols, Rows{Data: out, Offsets: rows}, Rows{Data: grid, Offsets: offs}, 0, dw, k)
			}},
			{"rows-aligned", func() {
				mu.GemmRows(s.c, k, cols, Rows{Data: out, Offsets: aligned}, Rows{Data: grid, Offsets: offs}, 0, dw, k)
			}},
		} {
			b.Run(fmt.Sprintf("%dx%dx%d/%s", s.c, s.hw, s.hw, p.name), func(b *testing.B) {
				for b.Loop() {
					p.run()
				}
				b.ReportMetric(2*float64(s.c*k*cols)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// TestWithStop: a product whose stop is closed before it starts leaves C
// as it was; one whose stop closes after its first block of A (closed from
// done) stops there, leaving later blocks unwritten, and says so; with
// the stop open, or nil, it is the same product to the bit.
func TestWithStop(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	const m, n, k = 3*blockM + 5, 40, 33
	a, b := random(rng, m*k), random(rng, k*n)
	plain := make([]float32, m*n)
	Default().WithThreads(1).GemmOp(m, n, k, 1, MatrixA(a, k, false), MatrixB(b, n, false), 0, plain, n)
	poison := func() []float32 {
		c := make([]float32, m*n)
		for i := range c {
			c[i] = float32(math.NaN())
		}
		return c
	}
	untouched := func(c []float32) (n int) {
		for _, v := range c {
			if v != v {
				n++
			}
		}
		return n
	}
	for _, mu := range multipliers(t) {
		name := fmt.Sprintf("%s/t%d", mu.Kernel(), mu.threads)
		open := make(chan struct{})
		for _, s := range []*Multiplier{mu.WithStop(nil), mu.WithStop(open), mu.WithStop(open).WithThreads(mu.threads)} {
			c := poison()
			s.GemmOp(m, n, k, 1, MatrixA(a, k, false), MatrixB(b, n, false), 0, c, n)
			if s.Stopped() || untouched(c) != 0 {
				t.Fatalf("%s: with the stop open: Stopped %v, %d elements unwritten", name, s.Stopped(), untouched(c))
			}
			for i := range c {
				if c[i] != plain[i] && mu.Kernel() == Default().Kernel() {
					t.Fatalf("%s: element %d is %v with the stop open, %v without", name, i, c[i], plain[i])
				}
			}
		}
		shut := make(chan struct{})
		close(shut)
		c := poison()
		s := mu.WithStop(shut)
		s.GemmOp(m, n, k, 1, MatrixA(a, k, false), MatrixB(b, n, false), 0, c, n)
		if !s.Stopped() || untouched(c) != len(c) {
			t.Errorf("%s: stop closed before: Stopped %v, %d of %d elements unwritten", name, s.Stopped(), untouched(c), len(c))
		}
		if mu.threads != 1 {
			continue // blocks on other goroutines may start before the first is done
		}
		stop := make(chan struct{})
		s = mu.WithStop(stop)
		c = poison()
		blocks := map[int]bool{}
		s.GemmOpTiles(m, n, k, 1, MatrixA(a, k, false), MatrixB(b, n, false), 0, c, n, func(i0, i1, j0, j1 int) {
			if blocks[i0] = true; len(blocks) == 1 && j1 == n {
				close(stop)
			}
		})
		if !s.Stopped() || len(blocks) != 1 || untouched(c) != (m-blockM)*n {
			t.Errorf("%s: stop closed in the first block: Stopped %v, %d blocks done, %d elements unwritten (want %d)", name, s.Stopped(), len(blocks), untouched(c), (m-blockM)*n)
		}
	}
}
