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
	"sync"
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

// withDefaults is o with its zero tolerances set to their defaults.
func (o Options) withDefaults() Options {
	if o.ConvTol == 0 {
		o.ConvTol = TolAccumulate
	}
	if o.GemmTol == 0 {
		o.GemmTol = TolAccumulate
	}
	return o
}

// reporter is what a case reports to: its test, or in RunOOM's runs, whose
// operations fail on purpose, a quiet one.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(f func())
}

// suite runs operations on a backend and the reference side by side.
type suite struct {
	t        reporter
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

// newSuite is a run of case c on got against a fresh CPU backend, its
// inputs drawn from a generator seeded by the case, the same at every run.
func newSuite(t reporter, got kernels.Backend, c testCase, opt Options) *suite {
	return &suite{t: t, got: got, ref: cpu.New(), rng: rand.New(rand.NewPCG(uint64(len(c.name)), 0xC0FFEE)), opt: opt}
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
		case kernels.U8:
			raw[i] = uint8(v)
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
		case kernels.U8:
			out[i] = float64(raw[i])
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
// named groups of cases ("conv", "batchnorm", ...) when names are given. A
// whole run also fails if some method of a family (kernels.Families) was
// never called by any case: every operation has a conformance case.
func Run(t *testing.T, be kernels.Backend, names ...string) { RunWith(t, be, Options{}, names...) }

// RunWith is Run with options.
func RunWith(t *testing.T, be kernels.Backend, opt Options, names ...string) {
	opt = opt.withDefaults()
	var called sync.Map // method name -> true
	if len(names) == 0 {
		be = &kernels.Observed{B: be, Hook: func(method, _ string, _ kernels.DType) func() {
			called.Store(method, true)
			return nil
		}}
	}
	for _, c := range cases {
		if len(names) > 0 && !slices.Contains(names, c.name) {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			s := newSuite(t, be, c, opt)
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
	if len(names) == 0 {
		for _, m := range Uncovered(func(method string) bool { _, ok := called.Load(method); return ok }) {
			t.Errorf("no conformance case runs %s", m)
		}
	}
}

// Uncovered lists, as "Family.Method" (CopyOps.Transpose), the methods of
// kernels.Families that ran says no case ran, with the file whose cases
// should.
func Uncovered(ran func(method string) bool) []string {
	var out []string
	for _, f := range kernels.Families {
		for i := range f.Ops.NumMethod() {
			if m := f.Ops.Method(i).Name; !ran(m) {
				out = append(out, fmt.Sprintf("%s.%s (add one to kernels/kerneltest/%s.go)", f.Ops.Name(), m, f.Name))
			}
		}
	}
	return out
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

// cases are every family's, in the order kernels.Families lists them.
var cases = slices.Concat(copyCases, elementwiseCases, reduceCases, gemmCases, convCases, normCases, poolCases, lossCases, randomCases, optimCases, transformerCases)

func prod(s []int) int {
	p := 1
	for _, d := range s {
		p *= d
	}
	return p
}
