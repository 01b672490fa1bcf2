package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/leangrad/leangrad/kernels"
)

// TestGemmEpilogue checks each epilogue (bias; bias and GELU, saving the
// pre-activation; GELU's derivative with the bias gradient; the bias
// gradient of A; bias and residual, into C of the operands' dtype or F32)
// on every transpose and dtype against float64 loops
// written from kernels.Epilogue's definition and the ops' references.
func TestGemmEpilogue(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	gelu := kernels.GELU.Def()
	type ep struct {
		name                             string
		bias, act, grad, biasGrad, gradA bool
		residual, f32C                   bool // f32C: C (and the residual) F32 whatever the operands' dtype
	}
	for _, e := range []ep{
		{name: "bias+residual", bias: true, residual: true},
		{name: "bias+residual-into-f32", bias: true, residual: true, f32C: true},
		{name: "residual", residual: true},
		{name: "bias", bias: true},
		{name: "bias+gelu", bias: true, act: true},
		{name: "gelu", act: true},
		{name: "dgelu+bias-grad", act: true, grad: true, biasGrad: true},
		{name: "bias-grad-of-A", gradA: true},
		{name: "bias+bias-grad-of-A", bias: true, gradA: true},
	} {
		for _, p := range []kernels.GemmParams{
			{M: 5, N: 7, K: 3, Alpha: 1, Batch: 1},
			{TransA: true, M: 150, N: 100, K: 400, Alpha: 1, Batch: 1},
			{TransB: true, M: 33, N: 70, K: 90, Alpha: 0.5, Batch: 1},
			{TransA: true, TransB: true, M: 64, N: 48, K: 20, Alpha: 1, Batch: 1},
		} {
			for _, dt := range []kernels.DType{kernels.F32, kernels.F16, kernels.BF16} {
				t.Run(fmt.Sprintf("%s/%+v/%v", e.name, p, dt), func(t *testing.T) {
					cdt := dt
					if e.f32C {
						cdt = kernels.F32
					}
					operandOf := func(dt kernels.DType, n int) (kernels.Buf, []float64) {
						f, _ := randBuf(t, rng, n)
						b := f
						if dt.Half() {
							b = buf(t, dt, n)
							be.Cast(b, f)
						}
						v := make([]float64, n)
						for i, x := range in(b) {
							v[i] = float64(x)
						}
						return b, v
					}
					operand := func(n int) (kernels.Buf, []float64) { return operandOf(dt, n) }
					a, av := operand(p.M * p.K)
					b, bv := operand(p.K * p.N)
					var k kernels.Epilogue
					var biasV, auxV []float64
					if e.bias {
						k.Bias, biasV = randBuf(t, rng, p.N)
						if cdt.Half() { // added as a bias of C's dtype
							h := buf(t, dt, p.N)
							be.Cast(h, k.Bias)
							for i, v := range in(h) {
								biasV[i] = float64(v)
							}
						}
					}
					if e.act {
						k.Act, k.Grad = kernels.GELU, e.grad
						if e.grad {
							k.Aux, auxV = operand(p.M * p.N)
						} else {
							k.Aux = buf(t, dt, p.M*p.N)
						}
					}
					if e.biasGrad {
						k.BiasGrad = buf(t, kernels.F32, p.N)
					}
					if e.gradA {
						k.BiasGradA = buf(t, kernels.F32, p.M)
					}
					var resV []float64
					if e.residual {
						k.Residual, resV = operandOf(cdt, p.M*p.N)
					}
					c := buf(t, cdt, p.M*p.N)
					be.GemmEpilogue(p, k, a, b, c)
					// B packed ahead (Prepack): the same bits.
					packed, pc := buf(t, kernels.F32, be.PrepackLen(p.K, p.N)), buf(t, cdt, p.M*p.N)
					be.Prepack(packed, b, p.K, p.N, p.TransB)
					pp := p
					pp.PackedB = true
					be.GemmEpilogue(pp, k, a, packed, pc)
					sameBits(t, "C through a prepacked B", pc, c)

					want, pre := make([]float64, p.M*p.N), make([]float64, p.M*p.N)
					colSums, sumsA := make([]float64, p.N), make([]float64, p.M)
					for i := 0; i < p.M; i++ {
						for j := 0; j < p.N; j++ {
							var s float64
							for kk := 0; kk < p.K; kk++ {
								ai, bi := i*p.K+kk, kk*p.N+j
								if p.TransA {
									ai = kk*p.M + i
								}
								if p.TransB {
									bi = j*p.K + kk
								}
								s += av[ai] * bv[bi]
							}
							s *= float64(p.Alpha)
							if e.bias {
								s += biasV[j]
							}
							if e.residual {
								s += resV[i*p.N+j]
							}
							pre[i*p.N+j] = s
							switch {
							case e.grad:
								s *= gelu.RefDeriv(auxV[i*p.N+j])
							case e.act:
								s = gelu.Ref(s)
							}
							want[i*p.N+j] = s
						}
						for kk := 0; kk < p.K; kk++ {
							ai := i*p.K + kk
							if p.TransA {
								ai = kk*p.M + i
							}
							sumsA[i] += av[ai]
						}
					}
					tol := map[kernels.DType]float64{kernels.F32: 1e-5, kernels.F16: 2e-3, kernels.BF16: 1e-2}[cdt]
					check(t, "C", c, want, tol)
					if e.act && !e.grad {
						check(t, "Aux", k.Aux, pre, tol)
					}
					if e.biasGrad { // the sums of C as stored
						for i, v := range in(c) {
							colSums[i%p.N] += float64(v)
						}
						check(t, "BiasGrad", k.BiasGrad, colSums, 1e-5)
					}
					if e.gradA {
						check(t, "BiasGradA", k.BiasGradA, sumsA, 1e-5)
					}
				})
			}
		}
	}
}

// TestGemmEpilogueChecks shows the misuses CheckGemmEpilogue refuses.
func TestGemmEpilogueChecks(t *testing.T) {
	p := kernels.GemmParams{M: 4, N: 3, K: 2, Alpha: 1, Batch: 1}
	a, b, c := buf(t, kernels.F32, 8), buf(t, kernels.F32, 6), buf(t, kernels.F32, 12)
	for _, tc := range []struct {
		name string
		p    kernels.GemmParams
		e    kernels.Epilogue
	}{
		{"beta", kernels.GemmParams{M: 4, N: 3, K: 2, Alpha: 1, Beta: 1, Batch: 1}, kernels.Epilogue{Bias: buf(t, kernels.F32, 3)}},
		{"bias length", p, kernels.Epilogue{Bias: buf(t, kernels.F32, 4)}},
		{"f16 bias", p, kernels.Epilogue{Bias: buf(t, kernels.F16, 3)}},
		{"act without aux", p, kernels.Epilogue{Act: kernels.GELU}},
		{"act reading its output", p, kernels.Epilogue{Act: kernels.Exp, Aux: buf(t, kernels.F32, 12)}},
		{"grad with bias", p, kernels.Epilogue{Act: kernels.GELU, Grad: true, Aux: buf(t, kernels.F32, 12), Bias: buf(t, kernels.F32, 3)}},
		{"grad without act", p, kernels.Epilogue{Grad: true}},
		{"bias grad of A length", p, kernels.Epilogue{BiasGradA: buf(t, kernels.F32, 3)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("GemmEpilogue accepted %+v", tc.e)
				}
			}()
			be.GemmEpilogue(tc.p, tc.e, a, b, c)
		})
	}
}

// TestGemmStoppable: with its stop open, GemmStoppable is Gemm (batched
// too) or GemmEpilogue to the bit and reports that it ran whole; with its
// stop closed it reports that it did not, and has not written all of C.
func TestGemmStoppable(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	gelu := kernels.Epilogue{Act: kernels.GELU}
	for _, c := range []struct {
		name string
		p    kernels.GemmParams
		e    kernels.Epilogue
		dt   kernels.DType
	}{
		{"plain", kernels.GemmParams{M: 300, N: 70, K: 50, Alpha: 1, Batch: 1}, kernels.Epilogue{}, kernels.F32},
		{"transposed-bf16", kernels.GemmParams{TransA: true, TransB: true, M: 150, N: 40, K: 64, Alpha: 1, Batch: 1}, kernels.Epilogue{}, kernels.BF16},
		{"batched", kernels.GemmParams{M: 30, N: 20, K: 10, Alpha: 1, Batch: 4, StrideA: 300, StrideB: 200, StrideC: 600}, kernels.Epilogue{}, kernels.F32},
		{"gelu-f16", kernels.GemmParams{M: 200, N: 48, K: 16, Alpha: 1, Batch: 1}, gelu, kernels.F16},
	} {
		t.Run(c.name, func(t *testing.T) {
			batch := max(c.p.Batch, 1)
			operand := func(n int) kernels.Buf {
				f, _ := randBuf(t, rng, n)
				if !c.dt.Half() {
					return f
				}
				h := buf(t, c.dt, n)
				be.Cast(h, f)
				return h
			}
			a, b := operand(batch*c.p.M*c.p.K), operand(batch*c.p.K*c.p.N)
			run := func(stop <-chan struct{}) (kernels.Buf, bool) {
				out := buf(t, c.dt, batch*c.p.M*c.p.N)
				e := c.e
				if e.Act != 0 {
					e.Aux = buf(t, c.dt, c.p.M*c.p.N)
				}
				switch {
				case stop != nil:
					return out, be.GemmStoppable(c.p, e, a, b, out, stop)
				case e == (kernels.Epilogue{}):
					be.Gemm(c.p, a, b, out)
				default:
					be.GemmEpilogue(c.p, e, a, b, out)
				}
				return out, true
			}
			want, _ := run(nil)
			got, whole := run(make(chan struct{}))
			if !whole {
				t.Fatal("GemmStoppable with its stop open says it stopped")
			}
			w, g := in(want), in(got)
			for i := range w {
				if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
					t.Fatalf("element %d: %v, Gemm's %v", i, g[i], w[i])
				}
			}
			shut := make(chan struct{})
			close(shut)
			got, whole = run(shut)
			unwritten := 0
			for _, v := range in(got) {
				if v != v {
					unwritten++
				}
			}
			if whole || unwritten == 0 {
				t.Errorf("GemmStoppable with its stop closed: ran whole %v, %d elements unwritten", whole, unwritten)
			}
		})
	}
}

// sameBits fails unless got holds want's values to the bit.
func sameBits(t *testing.T, what string, got, want kernels.Buf) {
	t.Helper()
	g, w := in(got), in(want)
	if len(g) != len(w) {
		t.Fatalf("%s: %d values, want %d", what, len(g), len(w))
	}
	for i := range w {
		if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
			t.Fatalf("%s: element %d is %v, want %v", what, i, g[i], w[i])
		}
	}
}

// TestPrepack: products through a B packed ahead (Prepack) give the bits
// of the products that pack it themselves, on every microkernel, for B
// stored both ways and in each dtype, with β adding C, across several of
// the packings' stretches of k; a stale packing is what it packed, not
// B's new values; the misuses are refused.
func TestPrepack(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for _, kb := range kernelBackends(t) {
		for _, p := range []kernels.GemmParams{
			{M: 3, N: 50, K: 7, Alpha: 1, Batch: 1},
			{TransB: true, M: 16, N: 130, K: 800, Alpha: 0.5, Beta: 1, Batch: 1},
			{TransA: true, TransB: true, M: 9, N: 48, K: 385, Alpha: 1, Beta: 0.25, Batch: 1},
		} {
			for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
				name := fmt.Sprintf("%s/%+v/%v", kb.Kernel(), p, dt)
				operand := func(n int) kernels.Buf {
					f, _ := randBuf(t, rng, n)
					if !dt.Half() {
						return f
					}
					h := buf(t, dt, n)
					be.Cast(h, f)
					return h
				}
				a, b := operand(p.M*p.K), operand(p.K*p.N)
				c0, _ := randBuf(t, rng, p.M*p.N)
				want, got := buf(t, kernels.F32, p.M*p.N), buf(t, kernels.F32, p.M*p.N)
				be.Copy(want, c0)
				be.Copy(got, c0)
				kb.Gemm(p, a, b, want)
				packed := buf(t, kernels.F32, kb.PrepackLen(p.K, p.N))
				kb.Prepack(packed, b, p.K, p.N, p.TransB)
				pp := p
				pp.PackedB = true
				kb.Gemm(pp, a, packed, got)
				sameBits(t, name, got, want)
				be.Fill(b, 0) // the packing keeps what it packed
				be.Copy(got, c0)
				kb.Gemm(pp, a, packed, got)
				sameBits(t, name+" after B changed", got, want)
			}
		}
	}
	p := kernels.GemmParams{M: 2, N: 5, K: 3, Alpha: 1, Batch: 1, PackedB: true}
	a, c := buf(t, kernels.F32, 6), buf(t, kernels.F32, 10)
	for _, tc := range []struct {
		name string
		run  func()
	}{
		{"short packing", func() { be.Gemm(p, a, buf(t, kernels.F32, be.PrepackLen(3, 5)-1), c) }},
		{"batched", func() {
			q := p
			q.Batch, q.StrideA, q.StrideC = 2, 0, 0
			be.Gemm(q, a, buf(t, kernels.F32, be.PrepackLen(3, 5)), c)
		}},
		{"a backend that packs none", func() { kernels.CheckGemm(p, a, buf(t, kernels.F32, 15), c) }},
		{"prepack into too little", func() { be.Prepack(buf(t, kernels.F32, 15), buf(t, kernels.F32, 15), 3, 5, false) }},
	} {
		func() {
			defer func() {
				if r := recover(); r == nil {
					t.Errorf("%s: accepted", tc.name)
				}
			}()
			tc.run()
		}()
	}
}
