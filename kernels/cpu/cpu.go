// Package cpu is leangrad's CPU backend: AVX-512 passes (Go loops on other
// CPUs) over goroutines for elementwise work, reductions and normalisation,
// and the sgemm package (AVX-512 or AVX2 assembly microkernels, a Go kernel
// elsewhere) for matrix products and convolutions, whose image patches are
// packed straight into sgemm's panels or, for stride 1 and strided
// forwards, read in place from a padded grid (conv.go). F16 data is stored
// as IEEE half and computed in float32, converted as it is loaded and
// stored (package half: AVX-512 or F16C where the CPU has them), exactly as
// AMP needs. It is also the reference the CUDA backend is tested against;
// the CPU backend itself is tested against plain float64 loops
// (cpu_test.go), on every sgemm kernel the CPU runs.
//
// Operations run synchronously on the calling goroutine, fanning out over
// GOMAXPROCS cores (less those LeaveCores keeps free) when the work is
// large enough, to workers that stay awake between operations (package
// par); the optimizers' passes yield their cores now and then (yielding).
// Scratch space (F16 conversions, convolution grids and product outputs,
// packed panels) lives on the Go heap, outside the pool: the pool accounts
// for tensors.
package cpu

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu/internal/half"
	"github.com/leangrad/leangrad/kernels/cpu/internal/par"
	"github.com/leangrad/leangrad/kernels/cpu/sgemm"
	"github.com/leangrad/leangrad/memory"
)

// Backend is the CPU backend. Its zero value is not usable; call New.
type Backend struct {
	alloc *memory.Allocator
	mm    *sgemm.Multiplier // matrix products and convolutions
}

// New returns a CPU backend over a pool of Go heap slabs.
func New() *Backend {
	return NewWithAllocator(memory.New(memory.NewHeapSource(), memory.Config{Device: "cpu"}))
}

// NewWithAllocator returns a CPU backend over a's blocks, which must live on
// the Go heap (its Source must fill Segment.Host).
func NewWithAllocator(a *memory.Allocator) *Backend {
	return &Backend{alloc: a, mm: sgemm.Default()}
}

// WithKernel is a backend over the same pool whose matrix products and
// convolutions use the named sgemm microkernel (one of sgemm.Kernels: the
// tests run every operation on each).
func (c *Backend) WithKernel(name string) (*Backend, error) {
	mm, err := sgemm.New(name, 0)
	if err != nil {
		return nil, err
	}
	return &Backend{alloc: c.alloc, mm: mm}, nil
}

// Kernel is the sgemm microkernel the backend's products use.
func (c *Backend) Kernel() string { return c.mm.Kernel() }

var _ kernels.Backend = (*Backend)(nil)

// Name is "cpu".
func (c *Backend) Name() string { return "cpu" }

// Info describes the CPU: its cores, the SIMD its kernels use and its memory.
func (c *Backend) Info() kernels.Info {
	_, total := c.alloc.Source().MemInfo()
	return kernels.Info{Kind: kernels.KindCPU, Name: "cpu", Model: fmt.Sprintf("%d cores", runtime.NumCPU()), Capability: c.mm.Kernel(),
		Memory: total, Convolutions: "im2col-free packed SGEMM (" + c.mm.Kernel() + ")",
		Matmul: "packed SGEMM (" + c.mm.Kernel() + "), F32 strictly", Libraries: map[string]string{"sgemm": c.mm.Kernel()}}
}

// Allocator is the backend's pool.
func (c *Backend) Allocator() *memory.Allocator { return c.alloc }

// Stream is the default stream: CPU work is synchronous.
func (c *Backend) Stream() memory.Stream { return 0 }

// Synchronize returns at once: CPU work is done when its call returns.
func (c *Backend) Synchronize() error { return nil }

// raw is the buffer's bytes.
func raw(b kernels.Buf) []byte {
	if b.Block == nil {
		panic("cpu: operation on an empty buffer")
	}
	mem := b.Block.Bytes()
	if mem == nil {
		panic("cpu: buffer is not host memory")
	}
	return mem[b.Off : b.Off+b.Bytes()]
}

// overlaps reports whether a and b share a byte.
func overlaps(a, b kernels.Buf) bool {
	return a.Block == b.Block && a.Off < b.Off+b.Bytes() && b.Off < a.Off+a.Bytes()
}

func f32s(b kernels.Buf) []float32 {
	if b.DType != kernels.F32 {
		panic(fmt.Sprintf("cpu: want f32 buffer, have %v", b.DType))
	}
	if b.N == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&raw(b)[0])), b.N)
}

func u16s(b kernels.Buf) []uint16 {
	if b.N == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&raw(b)[0])), b.N)
}

func i32s(b kernels.Buf) []int32 {
	if b.DType != kernels.I32 {
		panic(fmt.Sprintf("cpu: want i32 buffer, have %v", b.DType))
	}
	if b.N == 0 {
		return nil
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(&raw(b)[0])), b.N)
}

// in returns b's values as float32: the buffer itself for F32, a converted
// copy for F16, BF16 (and I32).
func in(b kernels.Buf) []float32 {
	switch b.DType {
	case kernels.F32:
		return f32s(b)
	case kernels.F16, kernels.BF16:
		out := make([]float32, b.N)
		convertInto(out, b)
		return out
	case kernels.I32:
		v := i32s(b)
		out := make([]float32, len(v))
		for i, x := range v {
			out[i] = float32(x)
		}
		return out
	}
	panic(fmt.Sprintf("cpu: unknown dtype %v", b.DType))
}

// convertGrain is the fewest values a goroutine converts between F16 and
// float32 (128 KiB of float32): below it, handing a part to a second core
// costs more than the conversion it saves. AMP's casts of an MLP's weights
// (200K values a step) split over the cores.
const convertGrain = 1 << 15

// halfInto converts F16 values into float32, over goroutines when there are
// many.
func halfInto(dst []float32, h []uint16) {
	parallel(len(h), convertGrain, func(lo, hi int) { halfsToFloats(dst[lo:hi], h[lo:hi]) })
}

// convertInto converts a 16-bit float buffer's values into dst, over
// goroutines when there are many.
func convertInto(dst []float32, b kernels.Buf) {
	if b.DType == kernels.BF16 {
		h := u16s(b)
		parallel(len(h), convertGrain, func(lo, hi int) { half.BF16ToFloat32(dst[lo:hi], h[lo:hi]) })
		return
	}
	halfInto(dst, u16s(b))
}

// storeInto rounds src into a 16-bit float buffer, over goroutines when
// there are many.
func storeInto(b kernels.Buf, src []float32) {
	if b.DType == kernels.BF16 {
		h := u16s(b)
		parallel(len(src), convertGrain, func(lo, hi int) { half.BF16FromFloat32(h[lo:hi], src[lo:hi]) })
		return
	}
	storeF16(u16s(b), src)
}

// halfsToFloats converts src into dst on the calling goroutine.
func halfsToFloats(dst []float32, src []uint16) { half.ToFloat32(dst, src) }

// floatsToHalfs rounds src into dst on the calling goroutine.
func floatsToHalfs(dst []uint16, src []float32) { half.FromFloat32(dst, src) }

// out returns float32 storage for b's new values and a function that stores
// them: the buffer itself for F32 (the function does nothing), a scratch
// slice for F16 and BF16 that the function rounds into the buffer.
func out(b kernels.Buf) ([]float32, func()) {
	switch b.DType {
	case kernels.F32:
		return f32s(b), func() {}
	case kernels.F16, kernels.BF16:
		tmp := getScratch(b.N)
		return tmp, func() {
			storeInto(b, tmp)
			putScratch(tmp)
		}
	}
	panic(fmt.Sprintf("cpu: cannot write %v as float", b.DType))
}

// inout is out for a buffer that is read too (running statistics, C with beta).
func inout(b kernels.Buf) ([]float32, func()) {
	if b.DType == kernels.F32 {
		return f32s(b), func() {}
	}
	tmp, _ := view(b)
	return tmp, func() {
		storeInto(b, tmp)
		putScratch(tmp)
	}
}

func storeF16(dst []uint16, src []float32) {
	parallel(len(src), convertGrain, func(lo, hi int) { floatsToHalfs(dst[lo:hi], src[lo:hi]) })
}

// LeaveCores keeps n cores free, for the whole process, of the goroutines
// that one operation of a CPU backend spreads over (its matrix products'
// included) until release is called: an operation runs on GOMAXPROCS less
// every holder's n, at least one. A process whose host work runs beside a
// goroutine that must not wait for a core, such as the one queueing a
// GPU's kernels while the host updates the parameters the backward has
// finished, leaves that goroutine one so; holders add up (two GPUs' queues
// beside one host).
func LeaveCores(n int) (release func()) { return par.Leave(n) }

// parallel runs f over [0, n) in contiguous chunks on up to GOMAXPROCS
// goroutines (less the cores LeaveCores keeps free), giving each at least
// grain elements; small work runs inline.
func parallel(n, grain int, f func(lo, hi int)) {
	workers := par.Threads()
	if grain < 1 {
		grain = 1
	}
	chunks := min(workers, n/grain)
	if chunks <= 1 {
		if n > 0 {
			f(0, n)
		}
		return
	}
	step := (n + chunks - 1) / chunks
	par.Do((n+step-1)/step, func(c int) { f(c*step, min(n, (c+1)*step)) })
}

// yielding is f over [lo, hi) in runs of at most run values, letting the
// scheduler give the core to another goroutine between them. A part of an
// optimizer's update over a large parameter is otherwise one long call
// (of assembly, which Go does not preempt, or of Go, which it preempts
// after 10 ms): a goroutine that wakes while every core runs one waits
// for a part to end, milliseconds (BenchmarkWakeBesideAdamW).
func yielding(run int, f func(lo, hi int)) func(lo, hi int) {
	return func(lo, hi int) {
		for lo < hi {
			e := min(hi, lo+run)
			f(lo, e)
			if lo = e; lo < hi {
				runtime.Gosched()
			}
		}
	}
}

// yieldRun is how many values an optimizer's pass updates between yields
// (yielding): tens of microseconds of one core's work.
const yieldRun = 1 << 16

// serial runs f over [0, n) on the calling goroutine: parallel's signature,
// for work that a caller has already spread over the cores.
func serial(n, _ int, f func(lo, hi int)) {
	if n > 0 {
		f(0, n)
	}
}

// The reductions of the embedding, layer-norm, classifier and gradient-norm
// operations run in a fixed order that does not depend on the number of
// cores, so the results are the same bits on any machine: sums over rows
// are taken in blocks of a fixed number of rows, in float64, and added in
// block order.

// rowBlock is how many rows a partial sum over rows covers.
const rowBlock = 64

func checkIDs(op string, ids []int32, vocab int) {
	for i, v := range ids {
		if v < 0 || int(v) >= vocab {
			panic(fmt.Sprintf("cpu: %s: id %d at position %d is outside a vocabulary of %d", op, v, i, vocab))
		}
	}
}

// roundLike rounds v in place to dt's precision, as a product stored in dt
// would hold it (tmp: len(v) values of scratch for F16, whose conversions
// run eight values an instruction); nothing for F32.
func roundLike(dt kernels.DType, v []float32, tmp []uint16) {
	switch dt {
	case kernels.F16:
		half.FromFloat32(tmp, v)
		half.ToFloat32(v, tmp)
	case kernels.BF16:
		half.RoundBF16(v)
	}
}
