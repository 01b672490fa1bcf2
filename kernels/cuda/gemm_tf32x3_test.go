package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/kerneltest"
)

// TestX3Splits: GPT-2 small's products at batch 16 (16,384 tokens) on
// the H200's 132 multiprocessors, and the limits on splitting.
func TestX3Splits(t *testing.T) {
	for _, c := range []struct {
		name           string
		m, n, k, batch int
		splits, chunk  int
	}{
		{"c_fc forward: many tiles", 16384, 3072, 768, 1, 1, 768},
		// 36 tiles: eleven splits fill three waves.
		{"attn.c_proj weight gradient", 768, 768, 16384, 1, 11, 1504},
		// 108 tiles: six splits fill 98% of five waves.
		{"c_attn weight gradient", 768, 2304, 16384, 1, 6, 2752},
		// 144 tiles, a wave and 12 blocks: ten splits fill 99% of eleven waves.
		{"c_fc weight gradient", 3072, 768, 16384, 1, 10, 1664},
		{"chunks of at least x3MinChunk", 768, 768, 600, 1, 2, 320},
		{"batched", 128, 128, 4096, 40, 13, 320},
		{"no inner size", 64, 64, 0, 1, 1, 0},
	} {
		if s, k := x3Splits(c.m, c.n, c.k, c.batch, 132); s != c.splits || k != c.chunk {
			t.Errorf("%s: %d splits of %d, want %d of %d", c.name, s, k, c.splits, c.chunk)
		}
	}
}

// x3Case is a product and its epilogue for the TF32x3 tests.
type x3Case struct {
	name string
	p    kernels.GemmParams
	epi  string // "", "bias+gelu", "gelu′", "bias+residual"
}

// x3Cases: every transpose, sizes off the tiles' multiples, operands that
// cannot move 16 bytes at a time, batches, K split among blocks, α and β,
// and each kind of epilogue.
var x3Cases = []x3Case{
	{"nt, bias+gelu", kernels.GemmParams{TransB: true, M: 200, N: 136, K: 328, Alpha: 1}, "bias+gelu"},
	{"nn, bias+residual", kernels.GemmParams{M: 300, N: 264, K: 96, Alpha: 1}, "bias+residual"},
	{"nn, gelu′", kernels.GemmParams{M: 136, N: 200, K: 100, Alpha: 1}, "gelu′"},
	{"tn, gelu′ in a pass", kernels.GemmParams{TransA: true, M: 136, N: 200, K: 100, Alpha: 1}, "gelu′"},
	{"tt, α", kernels.GemmParams{TransA: true, TransB: true, M: 136, N: 260, K: 77, Alpha: 0.5}, ""},
	{"odd sizes, 4-byte copies, β", kernels.GemmParams{M: 131, N: 67, K: 45, Alpha: 1, Beta: 0.5}, ""},
	{"odd sizes, bias+gelu", kernels.GemmParams{TransB: true, M: 131, N: 67, K: 45, Alpha: 1}, "bias+gelu"},
	{"odd, transposed", kernels.GemmParams{TransA: true, TransB: true, M: 67, N: 131, K: 9, Alpha: 2}, ""},
	{"K shorter than a stage", kernels.GemmParams{TransB: true, M: 64, N: 64, K: 5, Alpha: 1}, ""},
	{"batch, shared A", kernels.GemmParams{M: 64, N: 96, K: 136, Alpha: 1, Batch: 5, StrideA: 0, StrideB: 136 * 96, StrideC: 64 * 96}, ""},
	{"batch, K split, shared B, β", kernels.GemmParams{M: 64, N: 96, K: 1100, Alpha: 1, Beta: 1, Batch: 3, StrideA: 64 * 1100, StrideB: 0, StrideC: 64 * 96}, ""},
	{"K split, bias+residual", kernels.GemmParams{TransB: true, M: 200, N: 136, K: 2500, Alpha: 1}, "bias+residual"},
	{"K split, transposed, gelu′", kernels.GemmParams{TransA: true, M: 136, N: 200, K: 2100, Alpha: 1}, "gelu′"},
	{"K split, nn, gelu′", kernels.GemmParams{M: 136, N: 200, K: 2100, Alpha: 1}, "gelu′"},
	{"K split, bias+gelu", kernels.GemmParams{TransB: true, M: 200, N: 136, K: 2500, Alpha: 1}, "bias+gelu"},
	{"K split, odd sizes, β", kernels.GemmParams{M: 131, N: 67, K: 1500, Alpha: 1, Beta: 0.5}, ""},
	{"K split sixteen ways, α, β", kernels.GemmParams{TransA: true, M: 256, N: 256, K: 8192, Alpha: 0.5, Beta: 1}, ""},
}

// TestCUDATF32x3: every case of the TF32x3 products against a float64
// reference, to 1e-5; then the conformance cases of the products (and
// what runs them: the classifier, im2col convolutions) under F32TF32x3,
// under the default budget and a 64 KiB one (which splits the
// classifier into more chunks), held to 1e-5; and a product whose K is
// split (its splits added into C in turn) repeats bit for bit.
func TestCUDATF32x3(t *testing.T) {
	testBackend(t)
	b, err := open(0, Options{MatmulF32: kernels.F32TF32x3})
	if err != nil {
		t.Fatal(err)
	}
	if !b.x3 {
		t.Skipf("%s has no TF32 tensor cores", b.arch)
	}
	rng := rand.New(rand.NewPCG(3, 32))
	for _, c := range x3Cases {
		got, want := x3Run(t, b, rng, c, false)
		if e := relErr(got, want); e > 1e-5 || math.IsNaN(e) {
			t.Errorf("%s: relative error %.2g against float64", c.name, e)
		}
	}
	// A NaN in A is NaN in its row of C (the split's integer rounding
	// would carry the canonical NaN into −0), and nowhere else.
	for _, c := range x3Cases {
		got, want := x3Run(t, b, rng, c, true)
		nans := 0
		for i, w := range want {
			if math.IsNaN(w) != math.IsNaN(float64(got[i])) {
				t.Errorf("%s, a NaN in A: element %d is %v, want %v", c.name, i, got[i], w)
				break
			}
			if math.IsNaN(w) {
				got[i], want[i] = 0, 0
				nans++
			}
		}
		if e := relErr(got, want); nans == 0 || e > 1e-5 || math.IsNaN(e) {
			t.Errorf("%s, a NaN in A: %d NaNs, relative error %.2g elsewhere", c.name, nans, e)
		}
	}
	// GPT-2 small's attn.c_proj weight gradient: eleven splits, in three
	// waves, each added into C after the one before it.
	p := kernels.GemmParams{TransA: true, M: 768, N: 768, K: 16384, Alpha: 1, Beta: 1}
	if s, _ := x3Splits(p.M, p.N, p.K, 1, b.sms); s < 2 {
		t.Fatalf("%+v: %d splits on %d multiprocessors, want K split", p, s, b.sms)
	}
	a, bb, c0 := upload(t, b, randn(rng, p.K*p.M)), upload(t, b, randn(rng, p.K*p.N)), randn(rng, p.M*p.N)
	var first []float32
	for run := range 3 {
		c := upload(t, b, c0)
		b.Gemm(p, a, bb, c)
		got := read32(b, c)
		if run == 0 {
			first = got
			continue
		}
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(first[i]) {
				t.Fatalf("a split product, run %d: element %d is %v, the first run's %v", run, i, got[i], first[i])
			}
		}
	}
	const tol = 1e-5
	for _, budget := range []int{defaultChunkBudget, 64 << 10} {
		b.chunkBudget = budget
		kerneltest.RunWith(t, b, kerneltest.Options{GemmTol: tol}, "gemm", "gemm-epilogue", "classifier")
	}
	noDNN, err := open(0, Options{MatmulF32: kernels.F32TF32x3, NoCuDNN: true})
	if err != nil {
		t.Fatal(err)
	}
	kerneltest.RunWith(t, noDNN, kerneltest.Options{GemmTol: tol, ConvTol: tol}, "conv")
}

// x3Run runs c on b from fresh random operands (A's first element NaN
// where nanA), returning C (or Aux, for the forward GELU, after C: both
// compared) and its float64 reference.
func x3Run(t *testing.T, b *Backend, rng *rand.Rand, c x3Case, nanA bool) ([]float32, []float64) {
	p := c.p
	batch := max(p.Batch, 1)
	na, nb, nc := (batch-1)*p.StrideA+p.M*p.K, (batch-1)*p.StrideB+p.K*p.N, (batch-1)*p.StrideC+p.M*p.N
	av, bv, cv := randn(rng, na), randn(rng, nb), randn(rng, nc) // C poisoned, or added to with β
	if nanA {
		av[0] = float32(math.NaN())
	}
	a, bb, cb := upload(t, b, av), upload(t, b, bv), upload(t, b, cv)
	want := make([]float64, nc)
	for i := range want {
		want[i] = float64(p.Beta) * float64(cv[i])
	}
	for m := range batch {
		matmulF64(p, av[m*p.StrideA:], bv[m*p.StrideB:], want[m*p.StrideC:])
	}
	if c.epi == "" {
		b.Gemm(p, a, bb, cb)
		return read32(b, cb), want
	}
	var e kernels.Epilogue
	var auxv []float32
	switch c.epi {
	case "bias+gelu", "bias+residual":
		bias := randn(rng, p.N)
		e.Bias = upload(t, b, bias)
		for i := range want {
			want[i] += float64(bias[i%p.N])
		}
		if c.epi == "bias+residual" {
			r := randn(rng, nc)
			e.Residual = upload(t, b, r)
			for i := range want {
				want[i] += float64(r[i])
			}
		} else {
			e.Act, e.Aux = kernels.GELU, upload(t, b, randn(rng, nc))
		}
	case "gelu′":
		auxv = randn(rng, nc)
		e.Act, e.Grad, e.Aux = kernels.GELU, true, upload(t, b, auxv)
		for i := range want {
			want[i] *= geluGradF64(float64(auxv[i]))
		}
	default:
		panic(fmt.Sprintf("x3Run: epilogue %q", c.epi))
	}
	b.GemmEpilogue(p, e, a, bb, cb)
	got := read32(b, cb)
	if e.Act != 0 && !e.Grad { // C = gelu(Aux), Aux the product and bias
		pre := make([]float64, nc)
		copy(pre, want)
		for i := range want {
			want[i] = geluF64(pre[i])
		}
		return append(got, read32(b, e.Aux)...), append(want, pre...)
	}
	return got, want
}

// matmulF64 adds p.Alpha·op(A)·op(B) of one matrix of the batch into c.
func matmulF64(p kernels.GemmParams, a, b []float32, c []float64) {
	for i := range p.M {
		for j := range p.N {
			var s float64
			for l := range p.K {
				ai, bi := i*p.K+l, l*p.N+j
				if p.TransA {
					ai = l*p.M + i
				}
				if p.TransB {
					bi = j*p.K + l
				}
				s += float64(a[ai]) * float64(b[bi])
			}
			c[i*p.N+j] += float64(p.Alpha) * s
		}
	}
}

// geluF64 and geluGradF64 are GELU in its tanh form and its derivative.
func geluF64(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

func geluGradF64(x float64) float64 {
	u := math.Sqrt(2/math.Pi) * (x + 0.044715*x*x*x)
	th := math.Tanh(u)
	return 0.5*(1+th) + 0.5*x*(1-th*th)*math.Sqrt(2/math.Pi)*(1+3*0.044715*x*x)
}

// TestCUDAMatmulF32Accuracy measures each F32 mode's products against
// float64 at GPT-2 small's inner sizes: TF32x3 within strict F32's error
// (its stretches of K summed from zero), one TF32 product two orders of
// magnitude above.
func TestCUDAMatmulF32Accuracy(t *testing.T) {
	testBackend(t)
	rng := rand.New(rand.NewPCG(32, 3))
	backends := map[kernels.F32Matmul]*Backend{}
	for _, m := range []kernels.F32Matmul{kernels.F32Strict, kernels.F32TF32x3, kernels.F32TF32} {
		b, err := open(0, Options{MatmulF32: m})
		if err != nil {
			t.Fatal(err)
		}
		backends[m] = b
	}
	if !backends[kernels.F32TF32x3].x3 {
		t.Skip("no TF32 tensor cores")
	}
	for _, k := range []int{768, 3072} {
		c := x3Case{name: fmt.Sprint(k), p: kernels.GemmParams{TransB: true, M: 256, N: 384, K: k, Alpha: 1}}
		errs := map[kernels.F32Matmul]float64{}
		seed := rng.Uint64() // the same operands for each mode
		for m, b := range backends {
			got, want := x3Run(t, b, rand.New(rand.NewPCG(seed, 0)), c, false)
			errs[m] = relErr(got, want)
		}
		s, x3, tf := errs[kernels.F32Strict], errs[kernels.F32TF32x3], errs[kernels.F32TF32]
		t.Logf("K %d: relative errors against float64: strict %.2g, tf32x3 %.2g, tf32 %.2g", k, s, x3, tf)
		if !(x3 <= s && 100*x3 <= tf) {
			t.Errorf("K %d: tf32x3's error %.2g is not within strict F32's %.2g and 1/100 of TF32's %.2g", k, x3, s, tf)
		}
	}
}
