// Package kerneltest holds the conformance suite every kernels.Backend must
// pass: each operation runs on the backend under test and on the CPU
// reference backend with the same fresh random inputs (several shapes, odd
// sizes, batch 1, stride 2), and the results must agree within the tolerance
// of the operation's class. Outputs on the backend under test are poisoned
// with NaN before each run, so an element an operation forgets to write fails.
package kerneltest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/x448/float16"
)

// Tolerances, as relative errors ‖got − ref‖/‖ref‖.
const (
	TolElementwise = 1e-5 // F32 operations without accumulation
	TolAccumulate  = 1e-4 // F32 reductions, GEMM, convolution, normalisation
	TolF16         = 1e-2 // anything stored in F16
	TolBF16        = 3e-2 // anything stored in BF16 (8-bit mantissas)
	TolTF32        = 1e-3 // F32 convolutions a backend may run on TF32 tensor cores (10-bit mantissas)
)

// Options tune a conformance run.
type Options struct {
	// ConvTol is the tolerance of F32 convolutions (default TolAccumulate;
	// TolTF32 for a backend that lets them use TF32).
	ConvTol float64
	// GemmTol is the tolerance of F32 products into F32, with or without
	// an epilogue (default TolAccumulate), to hold a backend that promises
	// F32's accuracy to a tighter one.
	GemmTol float64
}

// suite runs operations on a backend and the reference side by side.
type suite struct {
	t        *testing.T
	got, ref kernels.Backend
	rng      *rand.Rand
	opt      Options
}

// pair is one logical buffer on both backends.
type pair struct {
	got, ref kernels.Buf
	dt       kernels.DType
}

func (s *suite) alloc(be kernels.Backend, dt kernels.DType, n int) kernels.Buf {
	blk, err := be.Allocator().Alloc(int64(n*dt.Size()), be.Stream())
	if err != nil {
		s.t.Fatalf("%s: %v", be.Name(), err)
	}
	s.t.Cleanup(func() { be.Allocator().Free(blk) })
	return kernels.Buf{Block: blk, N: n, DType: dt}
}

// slice is p from element off on (a view into the same buffers).
func (p pair) slice(off int) pair {
	return pair{got: p.got.Slice(off, p.got.N-off), ref: p.ref.Slice(off, p.ref.N-off), dt: p.dt}
}

// manySizes is the sizes of a multi-tensor operation's tensors: first, then
// random ones of up to most elements, 40 in all, more tensors than one
// multi-tensor launch takes.
func (s *suite) manySizes(most int, first ...int) []int {
	sizes := first
	for len(sizes) < 40 {
		sizes = append(sizes, 1+s.rng.IntN(most))
	}
	return sizes
}

// toF32 converts float64 values to float32.
func toF32(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

// out is an output buffer: poisoned on the backend under test.
func (s *suite) out(dt kernels.DType, n int) pair {
	p := pair{got: s.alloc(s.got, dt, n), ref: s.alloc(s.ref, dt, n), dt: dt}
	if dt == kernels.I32 {
		s.got.Fill(p.got, -7)
	} else {
		s.got.Fill(p.got, float32(math.NaN()))
	}
	s.ref.Fill(p.ref, 0)
	return p
}

// in is an input buffer holding the same values on both backends.
func (s *suite) in(dt kernels.DType, vals []float32) pair {
	p := pair{got: s.alloc(s.got, dt, len(vals)), ref: s.alloc(s.ref, dt, len(vals)), dt: dt}
	raw := encode(dt, vals)
	s.got.Write(p.got, raw)
	s.ref.Write(p.ref, raw)
	return p
}

func encode(dt kernels.DType, vals []float32) []byte {
	raw := make([]byte, len(vals)*dt.Size())
	for i, v := range vals {
		switch dt {
		case kernels.F32:
			*(*float32)(unsafe.Pointer(&raw[4*i])) = v
		case kernels.I32:
			*(*int32)(unsafe.Pointer(&raw[4*i])) = int32(v)
		case kernels.F16:
			*(*uint16)(unsafe.Pointer(&raw[2*i])) = float16.Fromfloat32(v).Bits()
		case kernels.BF16:
			*(*uint16)(unsafe.Pointer(&raw[2*i])) = bf16Bits(v)
		}
	}
	return raw
}

func decode(dt kernels.DType, raw []byte) []float64 {
	out := make([]float64, len(raw)/dt.Size())
	for i := range out {
		switch dt {
		case kernels.F32:
			out[i] = float64(*(*float32)(unsafe.Pointer(&raw[4*i])))
		case kernels.I32:
			out[i] = float64(*(*int32)(unsafe.Pointer(&raw[4*i])))
		case kernels.F16:
			out[i] = float64(float16.Frombits(*(*uint16)(unsafe.Pointer(&raw[2*i]))).Float32())
		case kernels.BF16:
			out[i] = float64(math.Float32frombits(uint32(*(*uint16)(unsafe.Pointer(&raw[2*i]))) << 16))
		}
	}
	return out
}

func (s *suite) read(be kernels.Buf, on kernels.Backend) []float64 {
	raw := make([]byte, be.Bytes())
	on.Read(raw, be)
	return decode(be.DType, raw)
}

func (s *suite) normal(n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(s.rng.NormFloat64())
	}
	return v
}

func (s *suite) positive(n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = 0.25 + 2*s.rng.Float32()
	}
	return v
}

func (s *suite) randIn(dt kernels.DType, n int) pair { return s.in(dt, s.normal(n)) }

// check compares p on both backends. The tolerance is raised to TolF16 for F16 data.
func (s *suite) check(what string, p pair, tol float64) {
	s.t.Helper()
	switch p.dt {
	case kernels.F16:
		tol = max(tol, TolF16)
	case kernels.BF16:
		tol = max(tol, TolBF16)
	}
	g, r := s.read(p.got, s.got), s.read(p.ref, s.ref)
	var num, den float64
	for i := range g {
		if math.IsNaN(g[i]) != math.IsNaN(r[i]) || math.IsInf(g[i], 0) != math.IsInf(r[i], 0) {
			s.t.Errorf("%s: element %d of %d is %v, reference %v (unwritten, or wrong)", what, i, len(g), g[i], r[i])
			return
		}
		if math.IsNaN(r[i]) || math.IsInf(r[i], 0) {
			continue
		}
		d := g[i] - r[i]
		num += d * d
		den += r[i] * r[i]
	}
	rel := math.Sqrt(num / max(den, 1e-30))
	if den == 0 {
		rel = math.Sqrt(num)
	}
	if rel > tol || math.IsNaN(rel) {
		worst, wi := 0.0, 0
		for i := range g {
			if d := math.Abs(g[i] - r[i]); d > worst {
				worst, wi = d, i
			}
		}
		s.t.Errorf("%s: relative error %.3g > %.0g (worst element %d: %v, reference %v)", what, rel, tol, wi, g[wi], r[wi])
	}
}

// Run runs the whole suite on be against a fresh CPU backend, or only the
// named groups of cases ("conv", "batchnorm", ...) when names are given.
func Run(t *testing.T, be kernels.Backend, names ...string) { RunWith(t, be, Options{}, names...) }

// RunWith is Run with options.
func RunWith(t *testing.T, be kernels.Backend, opt Options, names ...string) {
	if opt.ConvTol == 0 {
		opt.ConvTol = TolAccumulate
	}
	if opt.GemmTol == 0 {
		opt.GemmTol = TolAccumulate
	}
	for _, c := range cases {
		if len(names) > 0 && !slices.Contains(names, c.name) {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			s := &suite{t: t, got: be, ref: cpu.New(), rng: rand.New(rand.NewPCG(uint64(len(c.name)), 0xC0FFEE)), opt: opt}
			defer func() {
				// A panicking operation fails its case, not the whole suite.
				if r := recover(); r != nil {
					t.Errorf("%s panicked: %v", be.Name(), r)
				}
			}()
			c.run(s)
			if err := be.Synchronize(); err != nil {
				t.Fatalf("%s: queued work failed: %v", be.Name(), err)
			}
		})
	}
}

type testCase struct {
	name string
	run  func(s *suite)
}

var dtypes = []kernels.DType{kernels.F32, kernels.F16, kernels.BF16}

// bf16Bits rounds v to bfloat16 (nearest, ties to even): the inputs both
// backends are given.
func bf16Bits(v float32) uint16 {
	u := math.Float32bits(v)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

var cases = []testCase{
	{"fill-copy-cast", func(s *suite) {
		for _, dt := range []kernels.DType{kernels.F32, kernels.F16, kernels.BF16, kernels.I32} {
			o := s.out(dt, 1001)
			s.got.Fill(o.got, 3)
			s.ref.Fill(o.ref, 3)
			s.check("fill "+dt.String(), o, 0)
		}
		x := s.randIn(kernels.F32, 777)
		c := s.out(kernels.F32, 777)
		s.got.Copy(c.got, x.got)
		s.ref.Copy(c.ref, x.ref)
		s.check("copy", c, 0)
		for _, t := range []kernels.Transposition{{Outer: 3, Rows: 5, Cols: 7}, {Outer: 2, Rows: 33, Cols: 65}, {Outer: 128, Rows: 16, Cols: 9}, {Outer: 5, Rows: 784, Cols: 16}, {Outer: 4, Rows: 3, Cols: 1024}} {
			for _, dt := range dtypes {
				x := s.randIn(dt, t.Len())
				y := s.out(dt, t.Len())
				s.got.Transpose(y.got, x.got, t)
				s.ref.Transpose(y.ref, x.ref, t)
				s.check(fmt.Sprintf("transpose %v %+v", dt, t), y, 0)
			}
		}
		for _, tc := range [][2]kernels.DType{{kernels.F32, kernels.F16}, {kernels.F16, kernels.F32}, {kernels.I32, kernels.F32}, {kernels.F32, kernels.I32},
			{kernels.F32, kernels.BF16}, {kernels.BF16, kernels.F32}} {
			vals := s.normal(513)
			for i := range vals {
				vals[i] *= 100
			}
			src := s.in(tc[0], vals)
			dst := s.out(tc[1], 513)
			s.got.Cast(dst.got, src.got)
			s.ref.Cast(dst.ref, src.ref)
			s.check(fmt.Sprintf("cast %v->%v", tc[0], tc[1]), dst, 0)
		}
	}},
	{"unary", func(s *suite) {
		for _, dt := range dtypes {
			for _, op := range kernels.UnaryOps() {
				n := 1 + s.rng.IntN(3000)
				vals := s.normal(n)
				if op.Def().Domain == kernels.Positive {
					vals = s.positive(n)
				}
				x := s.in(dt, vals)
				y := s.out(dt, n)
				s.got.Unary(op, y.got, x.got)
				s.ref.Unary(op, y.ref, x.ref)
				s.check(fmt.Sprintf("%v %v[%d]", op, dt, n), y, TolElementwise)
				dy := s.randIn(dt, n)
				dx := s.out(dt, n)
				xg, xr, yg, yr := x.got, x.ref, y.got, y.ref
				if op.Def().Uses != kernels.UsesOutput {
					yg, yr = kernels.Buf{}, kernels.Buf{}
				}
				if op.Def().Uses != kernels.UsesInput {
					xg, xr = kernels.Buf{}, kernels.Buf{}
				}
				s.got.UnaryBackward(op, dx.got, dy.got, xg, yg)
				s.ref.UnaryBackward(op, dx.ref, dy.ref, xr, yr)
				s.check(fmt.Sprintf("%v backward %v[%d]", op, dt, n), dx, TolElementwise)
			}
			x := s.randIn(dt, 999)
			y := s.out(dt, 999)
			s.got.Affine(y.got, x.got, -1.5, 0.25)
			s.ref.Affine(y.ref, x.ref, -1.5, 0.25)
			s.check("affine "+dt.String(), y, TolElementwise)
		}
	}},
	{"binary", func(s *suite) {
		shapes := [][3][]int{
			{{37, 5}, {37, 5}, {37, 5}},
			{{3, 4, 5}, {4, 1}, {3, 4, 5}},
			{{2, 16, 7, 7}, {1, 16, 1, 1}, {2, 16, 7, 7}},
			{{1}, {9, 3}, {9, 3}},
			{{3, 1}, {1, 4}, {3, 4}},
			{{5, 1, 3, 1, 2}, {4, 1, 7, 1}, {5, 4, 3, 7, 2}},
			{{300, 70}, {70}, {300, 70}},     // a linear layer's bias
			{{300, 70}, {300, 1}, {300, 70}}, // a scale a row
			{{64, 96}, {96}, {64, 96}},       // a bias four columns at a time
			{{48, 32}, {48, 32}, {48, 32}},   // the same shape four at a time
			// A position embedding over a batch: few rows longer than a
			// block's tile, four at a time and (odd columns) one at a time.
			{{3, 2, 2100}, {2, 2100}, {3, 2, 2100}},
			{{3, 1, 1501}, {1501}, {3, 1, 1501}},
		}
		for _, dt := range dtypes {
			for _, op := range kernels.BinaryOps() {
				for _, sh := range shapes {
					bc := kernels.NewBroadcast(sh[2], sh[0], sh[1])
					a := s.randIn(dt, prod(sh[0]))
					bv := s.normal(prod(sh[1]))
					if op.Def().PositiveB {
						bv = s.positive(len(bv))
					}
					b := s.in(dt, bv)
					y := s.out(dt, prod(sh[2]))
					s.got.Binary(op, y.got, a.got, b.got, bc)
					s.ref.Binary(op, y.ref, a.ref, b.ref, bc)
					s.check(fmt.Sprintf("%v %v %v %v", op, dt, sh[0], sh[1]), y, TolElementwise)
					if dt == kernels.F32 {
						continue
					}
					// An F32 result of one F32 and one 16-bit operand, either way round.
					a32 := s.randIn(kernels.F32, prod(sh[0]))
					b32 := s.in(kernels.F32, bv)
					for _, ab := range [][2]pair{{a32, b}, {a, b32}} {
						y := s.out(kernels.F32, prod(sh[2]))
						s.got.Binary(op, y.got, ab[0].got, ab[1].got, bc)
						s.ref.Binary(op, y.ref, ab[0].ref, ab[1].ref, bc)
						s.check(fmt.Sprintf("%v %v,%v->f32 %v %v", op, ab[0].dt, ab[1].dt, sh[0], sh[1]), y, TolElementwise)
					}
				}
			}
		}
	}},
	{"reduce", func(s *suite) {
		for _, dt := range dtypes {
			for _, r := range []kernels.Reduction{
				{Outer: 1, Len: 1, Inner: 1}, {Outer: 7, Len: 1000, Inner: 1}, {Outer: 1, Len: 100000, Inner: 1},
				{Outer: 3, Len: 33, Inner: 17}, {Outer: 1, Len: 256, Inner: 10}, {Outer: 64, Len: 49, Inner: 1},
				// few outputs over a long axis (a bias's gradient): split into stretches on CUDA,
				// four columns a lane where Inner is a multiple of 4
				{Outer: 1, Len: 5000, Inner: 40}, {Outer: 2, Len: 3001, Inner: 70}, {Outer: 2, Len: 2000, Inner: 132},
				{Outer: 1, Len: 4096, Inner: 768},
			} {
				x := s.randIn(dt, r.Outer*r.Len*r.Inner)
				for _, op := range []kernels.ReduceOp{kernels.Sum, kernels.Mean, kernels.Max} {
					y := s.out(dt, r.Outer*r.Inner)
					s.got.Reduce(op, y.got, x.got, r)
					s.ref.Reduce(op, y.ref, x.ref, r)
					s.check(fmt.Sprintf("%v %v %+v", op, dt, r), y, TolAccumulate)
					if op == kernels.Max {
						dy := s.randIn(dt, y.got.N)
						dx := s.out(dt, x.got.N)
						s.got.ReduceMaxBackward(dx.got, dy.got, x.got, y.got, r)
						s.ref.ReduceMaxBackward(dx.ref, dy.ref, x.ref, y.ref, r)
						s.check(fmt.Sprintf("max backward %v %+v", dt, r), dx, TolElementwise)
					}
				}
				am := s.out(kernels.I32, r.Outer*r.Inner)
				s.got.ArgMax(am.got, x.got, r)
				s.ref.ArgMax(am.ref, x.ref, r)
				s.check(fmt.Sprintf("argmax %v %+v", dt, r), am, 0)
			}
		}
	}},
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
	{"conv", func(s *suite) {
		var shapes []kernels.ConvParams
		for _, p := range ConvShapes { // each channels first and channels last
			last := p
			last.ChannelsLast = true
			shapes = append(shapes, p, last)
		}
		for _, p := range shapes {
			for _, dt := range dtypes {
				x := s.randIn(dt, p.N*p.C*p.H*p.W)
				w := s.randIn(dt, p.K*p.C*p.R*p.S)
				ny := p.N * p.K * p.OutH() * p.OutW()
				y := s.out(dt, ny)
				s.got.Conv2d(p, x.got, w.got, y.got)
				s.ref.Conv2d(p, x.ref, w.ref, y.ref)
				s.check(fmt.Sprintf("conv %v %+v", dt, p), y, s.opt.ConvTol)
				dy := s.randIn(dt, ny)
				dx := s.out(dt, x.got.N)
				s.got.Conv2dBackwardData(p, dy.got, w.got, dx.got)
				s.ref.Conv2dBackwardData(p, dy.ref, w.ref, dx.ref)
				s.check(fmt.Sprintf("conv backward data %v %+v", dt, p), dx, s.opt.ConvTol)
				dw := s.out(dt, w.got.N)
				s.got.Conv2dBackwardFilter(p, x.got, dy.got, dw.got)
				s.ref.Conv2dBackwardFilter(p, x.ref, dy.ref, dw.ref)
				s.check(fmt.Sprintf("conv backward filter %v %+v", dt, p), dw, s.opt.ConvTol)
			}
		}
	}},
	{"batchnorm", func(s *suite) {
		for _, p := range []kernels.BNParams{
			{N: 1, C: 3, HW: 49, Eps: 1e-5, Momentum: 0.1},
			{N: 8, C: 16, HW: 784, Eps: 1e-5, Momentum: 0.1},
			{N: 33, C: 5, HW: 7, Eps: 1e-3, Momentum: 0.3},
			{N: 256, C: 64, HW: 49, Eps: 1e-5, Momentum: 0.1},
			// Channels last (Note [channels last]): a channel per column of
			// N·H·W rows, C dividing a block of threads or not.
			{N: 8 * 196, C: 16, HW: 1, Eps: 1e-5, Momentum: 0.1},
			{N: 2 * 49, C: 64, HW: 1, Eps: 1e-5, Momentum: 0.1},
			{N: 1000, C: 24, HW: 1, Eps: 1e-3, Momentum: 0.3},
		} {
			for _, dt := range dtypes {
				for _, fused := range []struct {
					relu, residual bool
				}{{false, false}, {true, false}, {true, true}} {
					p := p
					p.ReLU = fused.relu
					n := p.N * p.C * p.HW
					xv := s.normal(n)
					for i := range xv {
						xv[i] = 3 + 2*xv[i] // a mean far from zero tests the shifted sums
					}
					x := s.in(dt, xv)
					var res pair
					if fused.residual {
						res = s.randIn(dt, n)
					}
					g, b := s.in(kernels.F32, s.positive(p.C)), s.randIn(kernels.F32, p.C)
					rm, rv := s.randIn(kernels.F32, p.C), s.in(kernels.F32, s.positive(p.C))
					y := s.out(dt, n)
					sm, si := s.out(kernels.F32, p.C), s.out(kernels.F32, p.C)
					s.got.BatchNormTrain(p, x.got, res.got, g.got, b.got, y.got, rm.got, rv.got, sm.got, si.got)
					s.ref.BatchNormTrain(p, x.ref, res.ref, g.ref, b.ref, y.ref, rm.ref, rv.ref, sm.ref, si.ref)
					what := fmt.Sprintf("%v %+v residual %v", dt, p, fused.residual)
					s.check("bn y "+what, y, TolAccumulate)
					s.check("bn mean "+what, sm, TolAccumulate)
					s.check("bn invstd "+what, si, TolAccumulate)
					s.check("bn running mean "+what, rm, TolAccumulate)
					s.check("bn running var "+what, rv, TolAccumulate)
					// Applied again from the saved statistics: the training
					// output, bit for bit, on each backend.
					ya := s.out(dt, n)
					s.got.BatchNormApply(p, x.got, res.got, g.got, b.got, sm.got, si.got, ya.got)
					s.ref.BatchNormApply(p, x.ref, res.ref, g.ref, b.ref, sm.ref, si.ref, ya.ref)
					for _, be := range []struct {
						name          string
						k             kernels.Backend
						train, replay kernels.Buf
					}{{"tested", s.got, y.got, ya.got}, {"reference", s.ref, y.ref, ya.ref}} {
						if tv, av := s.read(be.train, be.k), s.read(be.replay, be.k); !slices.Equal(tv, av) {
							s.t.Errorf("bn apply %s: the %s backend's output from the saved statistics differs from its training output", what, be.name)
						}
					}
					ye := s.out(dt, n)
					s.got.BatchNormEval(p, x.got, res.got, g.got, b.got, rm.got, rv.got, ye.got)
					s.ref.BatchNormEval(p, x.ref, res.ref, g.ref, b.ref, rm.ref, rv.ref, ye.ref)
					s.check("bn eval "+what, ye, TolAccumulate)
					dy := s.randIn(dt, n)
					dx, dg, db := s.out(dt, n), s.out(kernels.F32, p.C), s.out(kernels.F32, p.C)
					var dres pair
					if fused.residual {
						dres = s.out(dt, n)
					}
					// Both backends mask with the reference's output: an element
					// within rounding of zero may pass the ReLU on one and not the other.
					yv := s.read(y.ref, s.ref)
					y32 := make([]float32, len(yv))
					for i, v := range yv {
						y32[i] = float32(v)
					}
					yb := s.in(dt, y32)
					s.got.BatchNormBackward(p, x.got, yb.got, kernels.Buf{}, dy.got, g.got, kernels.Buf{}, sm.got, si.got, dx.got, dres.got, dg.got, db.got)
					s.ref.BatchNormBackward(p, x.ref, yb.ref, kernels.Buf{}, dy.ref, g.ref, kernels.Buf{}, sm.ref, si.ref, dx.ref, dres.ref, dg.ref, db.ref)
					s.check("bn dx "+what, dx, TolAccumulate)
					// In place: dx written over dy, the same bits.
					ip := s.in(dt, toF32(s.read(dy.ref, s.ref)))
					dg2, db2 := s.out(kernels.F32, p.C), s.out(kernels.F32, p.C)
					s.got.BatchNormBackward(p, x.got, yb.got, kernels.Buf{}, ip.got, g.got, kernels.Buf{}, sm.got, si.got, ip.got, kernels.Buf{}, dg2.got, db2.got)
					s.ref.BatchNormBackward(p, x.ref, yb.ref, kernels.Buf{}, ip.ref, g.ref, kernels.Buf{}, sm.ref, si.ref, ip.ref, kernels.Buf{}, dg2.ref, db2.ref)
					if !slices.Equal(s.read(ip.got, s.got), s.read(dx.got, s.got)) {
						s.t.Errorf("bn dx %s: written over dy, it differs from dx written apart", what)
					}
					s.check("bn dgamma "+what, dg, TolAccumulate)
					s.check("bn dbeta "+what, db, TolAccumulate)
					if p.ReLU {
						// Without y, each backend masks with the y its
						// BatchNormApply writes from x and the residual:
						// the same bits as with it.
						dxa, dga, dba := s.out(dt, n), s.out(kernels.F32, p.C), s.out(kernels.F32, p.C)
						dxb, dgb, dbb := s.out(dt, n), s.out(kernels.F32, p.C), s.out(kernels.F32, p.C)
						var dra, drb pair
						if fused.residual {
							dra, drb = s.out(dt, n), s.out(dt, n)
						}
						for _, be := range []struct {
							name string
							k    kernels.Backend
							pick func(pair) kernels.Buf
						}{{"tested", s.got, func(v pair) kernels.Buf { return v.got }}, {"reference", s.ref, func(v pair) kernels.Buf { return v.ref }}} {
							at := be.pick
							be.k.BatchNormBackward(p, at(x), kernels.Buf{}, at(res), at(dy), at(g), at(b), at(sm), at(si), at(dxa), at(dra), at(dga), at(dba))
							be.k.BatchNormBackward(p, at(x), at(ya), kernels.Buf{}, at(dy), at(g), kernels.Buf{}, at(sm), at(si), at(dxb), at(drb), at(dgb), at(dbb))
							type twin struct {
								name string
								a, b pair
							}
							outs := []twin{{"dx", dxa, dxb}, {"dgamma", dga, dgb}, {"dbeta", dba, dbb}}
							if fused.residual {
								outs = append(outs, twin{"dresidual", dra, drb})
							}
							for _, o := range outs {
								if !slices.Equal(s.read(at(o.a), be.k), s.read(at(o.b), be.k)) {
									s.t.Errorf("bn %s %s: the %s backend's, masked without y, differs from its own with y", o.name, what, be.name)
								}
							}
						}
					}
					if fused.residual {
						s.check("bn dresidual "+what, dres, TolElementwise)
						// dresidual written over dy: the same bits, dx too.
						ip := s.in(dt, toF32(s.read(dy.ref, s.ref)))
						dx3, dg3, db3 := s.out(dt, n), s.out(kernels.F32, p.C), s.out(kernels.F32, p.C)
						s.got.BatchNormBackward(p, x.got, yb.got, kernels.Buf{}, ip.got, g.got, kernels.Buf{}, sm.got, si.got, dx3.got, ip.got, dg3.got, db3.got)
						s.ref.BatchNormBackward(p, x.ref, yb.ref, kernels.Buf{}, ip.ref, g.ref, kernels.Buf{}, sm.ref, si.ref, dx3.ref, ip.ref, dg3.ref, db3.ref)
						if !slices.Equal(s.read(ip.got, s.got), s.read(dres.got, s.got)) || !slices.Equal(s.read(dx3.got, s.got), s.read(dx.got, s.got)) {
							s.t.Errorf("bn dresidual %s: written over dy, it or dx differs from the two written apart", what)
						}
					}
				}
			}
		}
	}},
	{"pool", func(s *suite) {
		for _, p := range []kernels.PoolParams{
			{N: 2, C: 3, H: 8, W: 8, KH: 2, KW: 2, SH: 2, SW: 2},
			{N: 1, C: 5, H: 7, W: 9, KH: 3, KW: 3, SH: 2, SW: 2, PH: 1, PW: 1},
			{N: 3, C: 4, H: 6, W: 5, KH: 3, KW: 2, SH: 1, SW: 1, PH: 1},
			{N: 256, C: 64, H: 7, W: 7, KH: 7, KW: 7, SH: 1, SW: 1},
		} {
			for _, dt := range dtypes {
				nx, ny := p.N*p.C*p.H*p.W, p.N*p.C*p.OutH()*p.OutW()
				x := s.randIn(dt, nx)
				dy := s.randIn(dt, ny)
				what := fmt.Sprintf("%v %+v", dt, p)
				for _, kind := range []string{"max", "avg"} {
					y, dx := s.out(dt, ny), s.out(dt, nx)
					if kind == "max" {
						s.got.MaxPool2d(p, x.got, y.got)
						s.ref.MaxPool2d(p, x.ref, y.ref)
						s.got.MaxPool2dBackward(p, x.got, dy.got, dx.got)
						s.ref.MaxPool2dBackward(p, x.ref, dy.ref, dx.ref)
					} else {
						s.got.AvgPool2d(p, x.got, y.got)
						s.ref.AvgPool2d(p, x.ref, y.ref)
						s.got.AvgPool2dBackward(p, dy.got, dx.got)
						s.ref.AvgPool2dBackward(p, dy.ref, dx.ref)
					}
					s.check(kind+" pool "+what, y, TolElementwise)
					s.check(kind+" pool backward "+what, dx, TolElementwise)
				}
			}
		}
	}},
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
	{"random", func(s *suite) {
		for _, dt := range dtypes {
			for _, n := range []int{1, 7, 4096, 100003} {
				g := kernels.Philox{Seed: uint64(n) * 31, Offset: uint64(n)}
				u := s.out(dt, n)
				s.got.Uniform(u.got, -2, 3, g)
				s.ref.Uniform(u.ref, -2, 3, g)
				s.check(fmt.Sprintf("uniform %v[%d]", dt, n), u, TolElementwise)
				z := s.out(dt, n)
				s.got.Normal(z.got, 0.5, 2, g)
				s.ref.Normal(z.ref, 0.5, 2, g)
				s.check(fmt.Sprintf("normal %v[%d]", dt, n), z, TolElementwise)
				x := s.randIn(dt, n)
				d := s.out(dt, n)
				s.got.Dropout(d.got, x.got, 0.3, g)
				s.ref.Dropout(d.ref, x.ref, 0.3, g)
				s.check(fmt.Sprintf("dropout %v[%d]", dt, n), d, TolElementwise)
				// The same draw with part of the offset in a device counter.
				base := s.in(kernels.I32, []float32{float32(n / 2), 0})
				gb := kernels.Philox{Seed: g.Seed, Offset: g.Offset - uint64(n/2)}
				gg, gr := gb, gb
				gg.Base, gr.Base = base.got, base.ref
				db := s.out(dt, n)
				s.got.Dropout(db.got, x.got, 0.3, gg)
				s.ref.Dropout(db.ref, x.ref, 0.3, gr)
				s.check(fmt.Sprintf("dropout with a device base %v[%d]", dt, n), db, TolElementwise)
				if !slices.Equal(s.read(db.got, s.got), s.read(d.got, s.got)) {
					s.t.Errorf("dropout %v[%d]: offset %d+%d on the device differs from %d", dt, n, g.Offset-uint64(n/2), n/2, g.Offset)
				}
				ub := s.out(dt, n)
				s.got.Normal(ub.got, 0.5, 2, gg)
				s.ref.Normal(ub.ref, 0.5, 2, gr)
				s.check(fmt.Sprintf("normal with a device base %v[%d]", dt, n), ub, TolElementwise)
			}
		}
	}},
	{"multi-tensor casts", func(s *suite) {
		sizes := s.manySizes(3000, 1, 17, 4096, 65537, 3)
		// want is what the host makes of vals stored in dt.
		want := func(dt kernels.DType, vals []float32) []float64 { return decode(dt, encode(dt, vals)) }
		bufs := func(ps []pair) (g []kernels.Buf) {
			for _, p := range ps {
				g = append(g, p.got)
			}
			return g
		}
		for _, h := range []kernels.DType{kernels.F16, kernels.BF16} {
			vals := make([][]float32, len(sizes))
			f32, half, widened, acc := make([]pair, len(sizes)), make([]pair, len(sizes)), make([]pair, len(sizes)), make([]pair, len(sizes))
			base := make([][]float32, len(sizes))
			for i, n := range sizes {
				vals[i], base[i] = s.normal(n), s.normal(n)
				f32[i], half[i] = s.in(kernels.F32, vals[i]), s.out(h, n)
				widened[i], acc[i] = s.out(kernels.F32, n), s.in(kernels.F32, base[i])
			}
			s.got.CastMany(bufs(half), bufs(f32))
			s.got.CastMany(bufs(widened), bufs(half))
			s.got.AccumulateMany(bufs(acc), bufs(half))
			for i, n := range sizes {
				rounded := want(h, vals[i])
				sum := make([]float64, n)
				for j := range sum {
					sum[j] = float64(base[i][j] + float32(rounded[j]))
				}
				for _, c := range []struct {
					what string
					got  kernels.Buf
					want []float64
				}{
					{"cast many f32 to " + h.String(), half[i].got, rounded},
					{"cast many " + h.String() + " to f32", widened[i].got, rounded},
					{"accumulate many " + h.String() + " into f32", acc[i].got, sum},
				} {
					if got := s.read(c.got, s.got); !slices.Equal(got, c.want) {
						s.t.Errorf("%s: tensor %d of %d (%d elements) differs from the host's rounding", c.what, i, len(sizes), n)
					}
				}
			}
		}
	}},
	{"optimizers", func(s *suite) {
		sizes := s.manySizes(2000, 1, 17, 4096, 65537, 3, 300)
		mk := func(gen func(int) []float32) []pair {
			ps := make([]pair, len(sizes))
			for i, n := range sizes {
				ps[i] = s.in(kernels.F32, gen(n))
			}
			return ps
		}
		split := func(ps []pair) (g, r []kernels.Buf) {
			for _, p := range ps {
				g, r = append(g, p.got), append(r, p.ref)
			}
			return
		}
		zeros := func(n int) []float32 { return make([]float32, n) }
		scalar := func(v float32) pair { return s.in(kernels.F32, []float32{v}) }
		// CopyMany: every tensor lands whole in its own destination.
		src, dst := mk(s.normal), mk(zeros)
		sg, sr := split(src)
		dg, dr := split(dst)
		s.got.CopyMany(dg, sg)
		s.ref.CopyMany(dr, sr)
		for i := range src {
			if got, want := s.read(dg[i], s.got), s.read(sg[i], s.got); !slices.Equal(got, want) {
				s.t.Errorf("copy many: tensor %d of %d (%d elements) differs from its source", i, len(sizes), sizes[i])
			}
		}
		for _, c := range []struct {
			hp     kernels.SGDParams
			lr     float32
			skip   bool
			remark string
		}{
			{kernels.SGDParams{Momentum: 0.9, WeightDecay: 5e-4, Nesterov: true, FirstStep: true}, 0.1, false, "nesterov, first step"},
			{kernels.SGDParams{Momentum: 0.9, Dampening: 0.1, WeightDecay: 1e-4}, 0.05, false, "dampened"},
			{kernels.SGDParams{}, 0.01, false, "plain"},
			{kernels.SGDParams{Momentum: 0.9}, 0.1, true, "skipped"},
		} {
			params, grads, moms := mk(s.normal), mk(s.normal), mk(s.normal)
			pg, pr := split(params)
			gg, gr := split(grads)
			mg, mr := split(moms)
			before := s.read(pg[0], s.got)
			lr, flag := scalar(c.lr), scalar(0)
			if c.skip {
				flag = scalar(1)
			}
			hg, hr := c.hp, c.hp
			hg.LR, hr.LR, hg.Skip, hr.Skip = lr.got, lr.ref, flag.got, flag.ref
			s.got.SGD(hg, pg, gg, mg)
			s.ref.SGD(hr, pr, gr, mr)
			for i := range params {
				s.check(fmt.Sprintf("sgd %s param %d", c.remark, i), params[i], TolElementwise)
				if c.hp.Momentum != 0 {
					s.check(fmt.Sprintf("sgd %s momentum %d", c.remark, i), moms[i], TolElementwise)
				}
			}
			if after := s.read(pg[0], s.got); c.skip != slices.Equal(before, after) {
				s.t.Errorf("sgd %s: parameter changed %v, want %v", c.remark, !slices.Equal(before, after), !c.skip)
			}
		}
		params, grads, m, v := mk(s.normal), mk(s.normal), mk(zeros), mk(zeros)
		pg, pr := split(params)
		gg, gr := split(grads)
		mg, mr := split(m)
		vg, vr := split(v)
		lr := scalar(1e-3)
		step := s.in(kernels.I32, []float32{0, 0})
		for k := 1; k <= 4; k++ {
			skip := scalar(0)
			if k == 3 { // a skipped step neither updates nor counts
				skip = scalar(1)
			}
			s.got.Increment(step.got, 1, skip.got)
			s.ref.Increment(step.ref, 1, skip.ref)
			hg := kernels.AdamWParams{LR: lr.got, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Step: step.got, Skip: skip.got}
			hr := hg
			hr.LR, hr.Step, hr.Skip = lr.ref, step.ref, skip.ref
			if k%2 == 0 { // the gradients read through a multiplier
				gs := scalar(0.37)
				hg.GradScale, hr.GradScale = gs.got, gs.ref
			}
			s.got.AdamW(hg, pg, gg, mg, vg)
			s.ref.AdamW(hr, pr, gr, mr, vr)
		}
		if st := s.read(step.got, s.got); st[0] != 3 || st[1] != 0 {
			s.t.Errorf("adamw step counter %v after 4 steps, one skipped: want [3 0]", st)
		}
		for i := range params {
			s.check(fmt.Sprintf("adamw param %d", i), params[i], TolElementwise)
			s.check(fmt.Sprintf("adamw m %d", i), m[i], TolElementwise)
			s.check(fmt.Sprintf("adamw v %d", i), v[i], TolElementwise)
		}
		// Unscale: clean, then with an inf planted in the last tensor.
		found, scale := scalar(0), scalar(1024)
		s.got.UnscaleCheck(gg, scale.got, found.got)
		s.ref.UnscaleCheck(gr, scale.ref, found.ref)
		for i := range grads {
			s.check(fmt.Sprintf("unscale grad %d", i), grads[i], TolElementwise)
		}
		s.check("unscale found (clean)", found, 0)
		last := len(sizes) - 1
		bad := s.normal(sizes[last])
		bad[len(bad)/2] = float32(math.Inf(1))
		grads[last] = s.in(kernels.F32, bad)
		gg[last], gr[last] = grads[last].got, grads[last].ref
		half := scalar(2)
		s.got.UnscaleCheck(gg, half.got, found.got)
		s.ref.UnscaleCheck(gr, half.ref, found.ref)
		s.check("unscale found (inf)", found, 0)
		if f := s.read(found.got, s.got); f[0] != 1 {
			s.t.Errorf("unscale did not flag an infinite gradient in tensor %d of %d", last, len(sizes))
		}
	}},
	{"scaler", func(s *suite) {
		// torch's _amp_update_scale_ over a sequence of clean and inf steps:
		// growth every 3 clean steps, backoff (and a skipped step) on inf.
		scale, tracker := s.in(kernels.F32, []float32{65536}), s.in(kernels.I32, []float32{0})
		skipped := s.in(kernels.F32, []float32{0})
		p := kernels.ScalerParams{Growth: 2, Backoff: 0.5, Interval: 3}
		want := float32(65536)
		clean := 0
		for i, inf := range []bool{false, true, false, false, false, true, true, false} {
			v := float32(0)
			if inf {
				v = 1
			}
			found := s.in(kernels.F32, []float32{v})
			s.got.UpdateScale(p, scale.got, tracker.got, found.got, skipped.got)
			s.ref.UpdateScale(p, scale.ref, tracker.ref, found.ref, skipped.ref)
			if inf {
				want, clean = want/2, 0
			} else if clean++; clean == 3 {
				want, clean = want*2, 0
			}
			if got := s.read(scale.got, s.got)[0]; got != float64(want) {
				s.t.Errorf("step %d: scale %v, want %v", i, got, want)
			}
		}
		s.check("scaler tracker", tracker, 0)
		if got := s.read(skipped.got, s.got)[0]; got != 3 {
			s.t.Errorf("%v skipped steps counted, want 3", got)
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
	{"embedding", func(s *suite) {
		for _, dt := range dtypes {
			for _, c := range [][3]int{{1, 5, 3}, {37, 11, 16}, {2000, 97, 24}, {600, 3, 770}} {
				n, vocab, dim := c[0], c[1], c[2]
				ids := make([]float32, n)
				for i := range ids {
					ids[i] = float32(s.rng.IntN(vocab)) // repeats
				}
				id := s.in(kernels.I32, ids)
				table := s.randIn(dt, vocab*dim)
				y := s.out(dt, n*dim)
				s.got.Embedding(y.got, table.got, id.got, n, vocab, dim)
				s.ref.Embedding(y.ref, table.ref, id.ref, n, vocab, dim)
				s.check(fmt.Sprintf("embedding %v %v", dt, c), y, 0)
				dy := s.randIn(dt, n*dim)
				dtab := s.out(kernels.F32, vocab*dim)
				s.got.EmbeddingBackward(dtab.got, dy.got, id.got, n, vocab, dim, false)
				s.ref.EmbeddingBackward(dtab.ref, dy.ref, id.ref, n, vocab, dim, false)
				s.check(fmt.Sprintf("embedding backward %v %v", dt, c), dtab, TolAccumulate)
				acc := s.randIn(kernels.F32, vocab*dim) // a gradient the table already has
				s.got.EmbeddingBackward(acc.got, dy.got, id.got, n, vocab, dim, true)
				s.ref.EmbeddingBackward(acc.ref, dy.ref, id.ref, n, vocab, dim, true)
				s.check(fmt.Sprintf("embedding backward accumulated %v %v", dt, c), acc, TolAccumulate)
			}
		}
	}},
	{"layernorm", func(s *suite) {
		// Each dtype, and an F32 x normalised into F16 and BF16 (y and dy).
		type pair struct{ x, y kernels.DType }
		var pairs []pair
		for _, dt := range dtypes {
			pairs = append(pairs, pair{dt, dt})
		}
		pairs = append(pairs, pair{kernels.F32, kernels.F16}, pair{kernels.F32, kernels.BF16})
		for _, dts := range pairs {
			dt := dts.x
			for _, p := range []kernels.LayerNormParams{{Rows: 1, Cols: 7, Eps: 1e-5}, {Rows: 37, Cols: 64, Eps: 1e-5},
				{Rows: 1000, Cols: 768, Eps: 1e-5}, {Rows: 3, Cols: 3000, Eps: 1e-3}} {
				xv := s.normal(p.Rows * p.Cols)
				for i := range xv {
					xv[i] = 1 + 2*xv[i]
				}
				x := s.in(dt, xv)
				g, b := s.in(kernels.F32, s.positive(p.Cols)), s.randIn(kernels.F32, p.Cols)
				y, mean, rstd := s.out(dts.y, p.Rows*p.Cols), s.out(kernels.F32, p.Rows), s.out(kernels.F32, p.Rows)
				s.got.LayerNorm(p, x.got, g.got, b.got, y.got, mean.got, rstd.got)
				s.ref.LayerNorm(p, x.ref, g.ref, b.ref, y.ref, mean.ref, rstd.ref)
				what := fmt.Sprintf("%v→%v %+v", dt, dts.y, p)
				s.check("layer norm y "+what, y, TolAccumulate)
				s.check("layer norm mean "+what, mean, TolAccumulate)
				s.check("layer norm rstd "+what, rstd, TolAccumulate)
				dy := s.randIn(dts.y, p.Rows*p.Cols)
				dx, dg, db := s.out(dt, p.Rows*p.Cols), s.out(kernels.F32, p.Cols), s.out(kernels.F32, p.Cols)
				s.got.LayerNormBackward(p, x.got, g.got, mean.got, rstd.got, dy.got, dx.got, dg.got, db.got)
				s.ref.LayerNormBackward(p, x.ref, g.ref, mean.ref, rstd.ref, dy.ref, dx.ref, dg.ref, db.ref)
				s.check("layer norm dx "+what, dx, TolAccumulate)
				s.check("layer norm dgamma "+what, dg, TolAccumulate)
				s.check("layer norm dbeta "+what, db, TolAccumulate)
				if dt == kernels.F32 { // added to a gradient dx already holds
					pa := p
					pa.Accumulate = true
					acc := s.randIn(kernels.F32, p.Rows*p.Cols)
					s.got.LayerNormBackward(pa, x.got, g.got, mean.got, rstd.got, dy.got, acc.got, dg.got, db.got)
					s.ref.LayerNormBackward(pa, x.ref, g.ref, mean.ref, rstd.ref, dy.ref, acc.ref, dg.ref, db.ref)
					s.check("layer norm accumulated dx "+what, acc, TolAccumulate)
					// dx's column sums beside it (with its rounding where dy is
					// 16-bit), against the reference and against the sums of dx
					// as written, in float64.
					for _, accumulate := range []bool{false, true} {
						dxs, sums := s.randIn(kernels.F32, p.Rows*p.Cols), s.out(kernels.F32, p.Cols)
						pg, pr := p, p
						pg.Accumulate, pr.Accumulate = accumulate, accumulate
						pg.Sums, pr.Sums = sums.got, sums.ref
						if dts.y != dt {
							rnd := s.out(dts.y, p.Rows*p.Cols)
							pg.Rounded, pr.Rounded = rnd.got, rnd.ref
						}
						s.got.LayerNormBackward(pg, x.got, g.got, mean.got, rstd.got, dy.got, dxs.got, dg.got, db.got)
						s.ref.LayerNormBackward(pr, x.ref, g.ref, mean.ref, rstd.ref, dy.ref, dxs.ref, dg.ref, db.ref)
						w := fmt.Sprintf("%s accumulate %v", what, accumulate)
						s.check("layer norm dx with its column sums "+w, dxs, TolAccumulate)
						s.check("layer norm column sums of dx "+w, sums, TolAccumulate)
						written, got := s.read(dxs.got, s.got), s.read(sums.got, s.got)
						for j := range p.Cols {
							var want, scale float64
							for r := range p.Rows {
								v := float64(written[r*p.Cols+j])
								want, scale = want+v, scale+math.Abs(v)
							}
							if math.Abs(float64(got[j])-want) > 1e-5*(scale+1) {
								s.t.Errorf("%s: layer norm column sum %d of dx %s = %v, the sum of dx as written %v", s.got.Name(), j, w, got[j], want)
								break
							}
						}
					}
				}
				if dts.y != dt { // dx also rounded into dy's dtype, bit for bit its cast
					for _, accumulate := range []bool{false, true} {
						dxr, rnd, cast := s.randIn(kernels.F32, p.Rows*p.Cols), s.out(dts.y, p.Rows*p.Cols), s.out(dts.y, p.Rows*p.Cols)
						pg, pr := p, p
						pg.Accumulate, pr.Accumulate = accumulate, accumulate
						pg.Rounded, pr.Rounded = rnd.got, rnd.ref
						s.got.LayerNormBackward(pg, x.got, g.got, mean.got, rstd.got, dy.got, dxr.got, dg.got, db.got)
						s.ref.LayerNormBackward(pr, x.ref, g.ref, mean.ref, rstd.ref, dy.ref, dxr.ref, dg.ref, db.ref)
						w := fmt.Sprintf("%s accumulate %v", what, accumulate)
						s.check("layer norm dx with its rounding "+w, dxr, TolAccumulate)
						s.check("layer norm rounded dx "+w, rnd, TolAccumulate)
						for _, be := range []struct {
							b           kernels.Backend
							dx, r, cast kernels.Buf
						}{{s.got, dxr.got, rnd.got, cast.got}, {s.ref, dxr.ref, rnd.ref, cast.ref}} {
							be.b.Cast(be.cast, be.dx)
							if got, want := s.read(be.r, be.b), s.read(be.cast, be.b); !slices.Equal(got, want) {
								s.t.Errorf("%s: layer norm rounded dx %s differs from the cast of its dx", be.b.Name(), w)
							}
						}
					}
				}
			}
		}
	}},
	{"attention", func(s *suite) {
		for _, dt := range dtypes {
			// D = 64 runs CUDA's flash kernels at F16 and BF16: whole
			// tiles, a ragged last tile, a decoding step over a cache.
			for _, c := range []struct{ B, H, D, Tq, Tk int }{{1, 1, 8, 1, 1}, {2, 3, 16, 37, 37}, {1, 2, 64, 300, 300}, {3, 2, 32, 1, 50},
				{2, 4, 8, 5, 64}, {2, 3, 64, 128, 128}, {1, 2, 64, 3, 70}, {1, 1, 64, 1, 1}} {
				C := c.H * c.D
				// q, k, v packed as a GPT's c_attn makes them when Tq = Tk;
				// separate (a decoding step over a cache) otherwise.
				p := kernels.AttentionParams{B: c.B, H: c.H, D: c.D, Tq: c.Tq, Tk: c.Tk, Scale: 1 / float32(math.Sqrt(float64(c.D))),
					ORow: C, OBatch: c.Tq * C}
				var q, k, v pair
				if c.Tq == c.Tk {
					qkv := s.randIn(dt, c.B*c.Tq*3*C)
					q, k, v = qkv, qkv.slice(C), qkv.slice(2*C)
					p.QRow, p.KRow, p.VRow = 3*C, 3*C, 3*C
					p.QBatch, p.KBatch, p.VBatch = c.Tq*3*C, c.Tq*3*C, c.Tq*3*C
				} else {
					q, k, v = s.randIn(dt, c.B*c.Tq*C), s.randIn(dt, c.B*c.Tk*C), s.randIn(dt, c.B*c.Tk*C)
					p.QRow, p.KRow, p.VRow = C, C, C
					p.QBatch, p.KBatch, p.VBatch = c.Tq*C, c.Tk*C, c.Tk*C
				}
				o, lse := s.out(dt, c.B*c.Tq*C), s.out(kernels.F32, c.B*c.H*c.Tq)
				s.got.Attention(p, q.got, k.got, v.got, o.got, lse.got)
				s.ref.Attention(p, q.ref, k.ref, v.ref, o.ref, lse.ref)
				what := fmt.Sprintf("%v %+v", dt, c)
				s.check("attention o "+what, o, TolAccumulate)
				s.check("attention lse "+what, lse, TolAccumulate)
				if c.Tq != c.Tk {
					continue
				}
				do := s.randIn(dt, c.B*c.Tq*C)
				dqkv := s.out(dt, c.B*c.Tq*3*C)
				dq, dk, dv := dqkv, dqkv.slice(C), dqkv.slice(2*C)
				s.got.AttentionBackward(p, q.got, k.got, v.got, o.got, lse.got, do.got, dq.got, dk.got, dv.got)
				s.ref.AttentionBackward(p, q.ref, k.ref, v.ref, o.ref, lse.ref, do.ref, dq.ref, dk.ref, dv.ref)
				s.check("attention dqkv "+what, dqkv, TolAccumulate)
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
	{"clip-grad-norm", func(s *suite) {
		none := s.out(kernels.F32, 1)
		s.got.SumSquares(nil, none.got)
		s.ref.SumSquares(nil, none.ref)
		s.check("sum of squares of no gradients", none, 0)
		var grads []pair
		for _, n := range []int{1, 100, 70001, 33} {
			grads = append(grads, s.randIn(kernels.F32, n))
		}
		for _, maxNorm := range []float32{1e4, 1} {
			gs := make([]pair, len(grads))
			var gg, gr []kernels.Buf
			for i, g := range grads {
				gs[i] = s.in(kernels.F32, toF32(s.read(g.ref, s.ref)))
				gg, gr = append(gg, gs[i].got), append(gr, gs[i].ref)
			}
			sumsq, norm := s.out(kernels.F32, 1), s.out(kernels.F32, 1)
			s.got.SumSquares(gg, sumsq.got)
			s.ref.SumSquares(gr, sumsq.ref)
			s.check(fmt.Sprintf("sum of squares, max %v", maxNorm), sumsq, TolAccumulate)
			s.got.ClipGradNorm(gg, maxNorm, sumsq.got, norm.got)
			s.ref.ClipGradNorm(gr, maxNorm, sumsq.ref, norm.ref)
			s.check(fmt.Sprintf("grad norm, max %v", maxNorm), norm, TolAccumulate)
			for i, g := range gs {
				s.check(fmt.Sprintf("clipped grad %d, max %v", i, maxNorm), g, TolAccumulate)
			}
		}
		// UnscaleClip from a sum of squares: with and without a scale, a
		// clip that binds, one that does not, none; then an inf sum.
		scalar := func(v float32) pair { return s.in(kernels.F32, []float32{v}) }
		for _, c := range []struct {
			sumsq, scale, maxNorm float32
		}{{3.5e7, 4096, 1}, {3.5e7, 4096, 1e4}, {2.25, 0, 1}, {2.25, 0, 0}, {float32(math.Inf(1)), 1024, 1}} {
			sumsq := scalar(c.sumsq)
			var scale pair
			if c.scale != 0 {
				scale = scalar(c.scale)
			}
			norm, mult, found := s.out(kernels.F32, 1), s.out(kernels.F32, 1), scalar(0)
			s.got.UnscaleClip(c.maxNorm, sumsq.got, scale.got, norm.got, mult.got, found.got)
			s.ref.UnscaleClip(c.maxNorm, sumsq.ref, scale.ref, norm.ref, mult.ref, found.ref)
			what := fmt.Sprintf("unscale and clip %+v", c)
			s.check(what+" norm", norm, TolElementwise)
			s.check(what+" multiplier", mult, TolElementwise)
			s.check(what+" found", found, 0)
		}
	}},
}

// ConvShapes are the convolutions the suite checks: odd sizes, batch 1,
// stride 2, padding, 1×1 (direct), rectangular filters, and ResNet shapes.
var ConvShapes = []kernels.ConvParams{
	{N: 2, C: 3, H: 7, W: 6, K: 4, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
	{N: 1, C: 5, H: 9, W: 9, K: 3, R: 3, S: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1},
	{N: 3, C: 8, H: 5, W: 5, K: 6, R: 1, S: 1, StrideH: 1, StrideW: 1},
	{N: 2, C: 3, H: 8, W: 7, K: 5, R: 1, S: 1, StrideH: 2, StrideW: 2},
	{N: 5, C: 2, H: 6, W: 11, K: 2, R: 3, S: 5, StrideH: 2, StrideW: 1, PadH: 0, PadW: 2},
	{N: 8, C: 16, H: 28, W: 28, K: 16, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
	{N: 4, C: 32, H: 14, W: 14, K: 64, R: 3, S: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1},
}

func prod(s []int) int {
	p := 1
	for _, d := range s {
		p *= d
	}
	return p
}
