package kerneltest

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
)

// The gemm family's cases (kernels.GemmOps).
var gemmCases = []testCase{
	{"gemm", func(s *suite) {
		for _, p := range []kernels.GemmParams{
			{M: 37, N: 19, K: 53, Alpha: 1, Batch: 1},
			{TransA: true, M: 64, N: 1, K: 129, Alpha: 0.5, Batch: 1},
			{TransB: true, M: 1, N: 70, K: 9, Alpha: 1, Beta: 0.75, Batch: 1},
			{TransA: true, TransB: true, M: 33, N: 31, K: 17, Alpha: 1, Batch: 4, StrideA: 17 * 33, StrideB: 31 * 17, StrideC: 33 * 31},
			{M: 16, N: 784, K: 144, Alpha: 1, Batch: 3, StrideA: 0, StrideB: 144 * 784, StrideC: 16 * 784},
		} {
			for _, dt := range dtypes {
				for _, cdt := range dtypes {
					if cdt != kernels.F32 && cdt != dt {
						continue // C is F32 or the operands' 16-bit type
					}
					batch := max(p.Batch, 1)
					a := s.randIn(dt, (batch-1)*p.StrideA+p.M*p.K)
					b := s.randIn(dt, (batch-1)*p.StrideB+p.K*p.N)
					c := s.randIn(cdt, (batch-1)*p.StrideC+p.M*p.N)
					s.got.Gemm(p, a.got, b.got, c.got)
					s.ref.Gemm(p, a.ref, b.ref, c.ref)
					tol := TolAccumulate
					if dt == kernels.F32 && cdt == kernels.F32 {
						tol = s.opt.GemmTol
					}
					s.check(fmt.Sprintf("gemm %v->%v %+v", dt, cdt, p), c, tol)
				}
			}
		}
	}},
	{"gemm-epilogue", func(s *suite) {
		type ep struct {
			name                             string
			bias, act, grad, biasGrad, gradA bool
			residual                         bool
			biasC                            bool // the bias in C's 16-bit dtype (the reference's in F32, rounded as it adds it)
		}
		for _, p := range []kernels.GemmParams{
			{TransB: true, M: 96, N: 64, K: 40, Alpha: 1, Batch: 1},   // a linear layer's forward: x·wᵀ
			{M: 96, N: 40, K: 64, Alpha: 1, Batch: 1},                 // its input gradient: dy·w
			{TransA: true, M: 64, N: 40, K: 96, Alpha: 1, Batch: 1},   // its weight gradient: dyᵀ·x
			{TransB: true, M: 37, N: 19, K: 53, Alpha: 0.5, Batch: 1}, // odd sizes
			{TransA: true, TransB: true, M: 33, N: 31, K: 17, Alpha: 1, Batch: 1},
		} {
			for _, e := range []ep{
				{name: "bias", bias: true},
				{name: "bias+gelu", bias: true, act: true},
				{name: "16-bit bias", bias: true, biasC: true},
				{name: "16-bit bias+gelu", bias: true, act: true, biasC: true},
				{name: "gelu", act: true},
				{name: "gelu′", act: true, grad: true},
				{name: "gelu′+bias grad", act: true, grad: true, biasGrad: true},
				{name: "bias grad of A", gradA: true},
				{name: "bias+bias grad of A", bias: true, gradA: true},
				{name: "bias+residual", bias: true, residual: true},
				{name: "residual", residual: true},
			} {
				for _, dt := range dtypes {
					for _, cdt := range dtypes {
						if (cdt != kernels.F32 && cdt != dt) || (e.biasC && !cdt.Half()) {
							continue
						}
						a, b := s.randIn(dt, p.M*p.K), s.randIn(dt, p.K*p.N)
						c := s.out(cdt, p.M*p.N)
						var eg, er kernels.Epilogue
						var aux, biasGrad, gradA pair
						switch {
						case e.biasC:
							vals := s.normal(p.N)
							eg.Bias, er.Bias = s.in(cdt, vals).got, s.in(kernels.F32, vals).ref
						case e.bias:
							bias := s.randIn(kernels.F32, p.N)
							eg.Bias, er.Bias = bias.got, bias.ref
						}
						if e.act {
							if e.grad {
								aux = s.randIn(cdt, p.M*p.N)
							} else {
								aux = s.out(cdt, p.M*p.N)
							}
							eg.Act, eg.Grad, eg.Aux = kernels.GELU, e.grad, aux.got
							er.Act, er.Grad, er.Aux = kernels.GELU, e.grad, aux.ref
						}
						if e.biasGrad {
							biasGrad = s.out(kernels.F32, p.N)
							eg.BiasGrad, er.BiasGrad = biasGrad.got, biasGrad.ref
						}
						if e.gradA {
							gradA = s.out(kernels.F32, p.M)
							eg.BiasGradA, er.BiasGradA = gradA.got, gradA.ref
						}
						if e.residual {
							r := s.randIn(cdt, p.M*p.N)
							eg.Residual, er.Residual = r.got, r.ref
						}
						s.got.GemmEpilogue(p, eg, a.got, b.got, c.got)
						s.ref.GemmEpilogue(p, er, a.ref, b.ref, c.ref)
						what := fmt.Sprintf("gemm %v->%v %s %+v", dt, cdt, e.name, p)
						tol := TolAccumulate
						if dt == kernels.F32 && cdt == kernels.F32 {
							tol = s.opt.GemmTol
						}
						if cdt.Half() {
							tol = max(tol, map[kernels.DType]float64{kernels.F16: TolF16, kernels.BF16: TolBF16}[cdt])
						}
						s.check(what, c, tol)
						if e.act && !e.grad {
							s.check(what+" aux", aux, tol)
						}
						if e.biasGrad {
							s.check(what+" bias grad", biasGrad, tol)
						}
						if e.gradA { // as precise as A's dtype (kernels.Epilogue)
							s.check(what+" bias grad of A", gradA, map[kernels.DType]float64{kernels.F32: TolAccumulate, kernels.F16: TolF16, kernels.BF16: TolBF16}[dt])
						}
					}
				}
			}
		}
	}},
}
