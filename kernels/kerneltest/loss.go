package kerneltest

import (
	"fmt"
	"math"

	"github.com/leangrad/leangrad/kernels"
)

// The loss family's cases (kernels.LossOps).
var lossCases = []testCase{
	{"cross-entropy", func(s *suite) {
		for _, sz := range [][2]int{{1, 10}, {256, 10}, {37, 1000}, {1000, 3}} {
			n, k := sz[0], sz[1]
			for _, dt := range dtypes {
				x := s.randIn(dt, n*k)
				lv := make([]float32, n)
				for i := range lv {
					lv[i] = float32(s.rng.IntN(k))
				}
				labels := s.in(kernels.I32, lv)
				lse, loss := s.out(kernels.F32, n), s.out(kernels.F32, 1)
				s.got.CrossEntropy(x.got, labels.got, lse.got, loss.got, n, k)
				s.ref.CrossEntropy(x.ref, labels.ref, lse.ref, loss.ref, n, k)
				what := fmt.Sprintf("%v n=%d k=%d", dt, n, k)
				s.check("ce lse "+what, lse, TolAccumulate)
				s.check("ce loss "+what, loss, TolAccumulate)
				dl := s.in(kernels.F32, []float32{1.7})
				dx := s.out(dt, n*k)
				s.got.CrossEntropyBackward(x.got, labels.got, lse.got, dl.got, dx.got, n, k)
				s.ref.CrossEntropyBackward(x.ref, labels.ref, lse.ref, dl.ref, dx.ref, n, k)
				s.check("ce backward "+what, dx, TolAccumulate)
			}
		}
	}},
	{"metrics", func(s *suite) {
		for _, dt := range dtypes {
			for _, shape := range [][2]int{{1, 10}, {37, 10}, {300, 7}} {
				n, k := shape[0], shape[1]
				x := s.randIn(dt, n*k)
				lv := make([]float32, n)
				for i := range lv {
					lv[i] = float32(s.rng.IntN(k))
				}
				labels := s.in(kernels.I32, lv)
				loss := s.in(kernels.F32, []float32{0.75})
				sums := s.in(kernels.F32, []float32{10, 3, 100})
				right := s.out(kernels.F32, 1)
				s.got.CountCorrect(right.got, x.got, labels.got, n, k)
				s.ref.CountCorrect(right.ref, x.ref, labels.ref, n, k)
				s.check(fmt.Sprintf("count correct %v n=%d k=%d", dt, n, k), right, 0)
				for rep := 0; rep < 2; rep++ { // accumulates
					s.got.AccumulateMetrics(sums.got, loss.got, right.got, n)
					s.ref.AccumulateMetrics(sums.ref, loss.ref, right.ref, n)
				}
				s.check(fmt.Sprintf("metrics %v n=%d k=%d", dt, n, k), sums, TolElementwise)
			}
		}
	}},
	{"classifier", func(s *suite) {
		for _, dt := range dtypes {
			// 70,000 values: longer rows than a backend may keep on chip
			// (the CUDA backend's shared memory holds GPT-2's 50,304).
			for _, c := range []struct{ N, C, V int }{{1, 8, 10}, {37, 16, 501}, {700, 64, 1000}, {700, 16, 40}, {3, 8, 70000}} {
				h, w := s.randIn(dt, c.N*c.C), s.randIn(dt, c.V*c.C)
				lv := make([]float32, c.N)
				for i := range lv {
					lv[i] = float32(s.rng.IntN(c.V))
				}
				labels := s.in(kernels.I32, lv)
				// Without gradients, with them, and with them for the loss
				// times a GradScaler's scale: scale times the unscaled ones.
				var plain [2][]float64
				for _, scale := range []float32{-1, 0, 1024} {
					grad := scale >= 0
					p := kernels.ClassifierParams{N: c.N, C: c.C, V: c.V, Grad: grad}
					pr := p
					if scale > 0 {
						gs := s.in(kernels.F32, []float32{scale})
						p.GradScale, pr.GradScale = gs.got, gs.ref
					}
					loss, right := s.out(kernels.F32, 1), s.out(kernels.F32, 1)
					var dh, dw pair
					if grad {
						dh, dw = s.out(kernels.F32, c.N*c.C), s.out(kernels.F32, c.V*c.C)
					}
					s.got.ClassifierLoss(p, h.got, w.got, labels.got, loss.got, right.got, dh.got, dw.got)
					s.ref.ClassifierLoss(pr, h.ref, w.ref, labels.ref, loss.ref, right.ref, dh.ref, dw.ref)
					what := fmt.Sprintf("%v %+v grad %v scale %v", dt, c, grad, scale)
					s.check("classifier loss "+what, loss, TolAccumulate)
					s.check("classifier right "+what, right, 0)
					if grad {
						// The gradients pass through the logits' gradient,
						// which a backend may keep in the operands' dtype.
						tol := TolAccumulate
						switch dt {
						case kernels.F16:
							tol = TolF16
						case kernels.BF16:
							tol = TolBF16
						}
						s.check("classifier dh "+what, dh, tol)
						s.check("classifier dw "+what, dw, tol)
						for i, d := range []pair{dh, dw} {
							got := s.read(d.got, s.got)
							if scale == 0 {
								plain[i] = got
								continue
							}
							var num, den float64
							for j, v := range got {
								e := v/float64(scale) - plain[i][j]
								num, den = num+e*e, den+plain[i][j]*plain[i][j]
							}
							if math.Sqrt(num) > tol*math.Sqrt(den)+1e-30 {
								s.t.Errorf("%s: classifier gradient %d %s is not %v times the unscaled one (relative error %.3g)", s.got.Name(), i, what, scale, math.Sqrt(num/den))
							}
						}
					}
				}
			}
		}
	}},
}
