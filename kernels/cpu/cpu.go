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
// GOMAXPROCS cores when the work is large enough, to workers that stay
// awake between operations (package par). Scratch space (F16
// conversions, convolution grids and product outputs, packed panels) lives on
// the Go heap, outside the pool: the pool accounts for tensors.
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
	"github.com/x448/float16"
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
	return kernels.Info{Kind: "cpu", Name: "cpu", Model: fmt.Sprintf("%d cores", runtime.NumCPU()), Capability: c.mm.Kernel(),
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

// parallel runs f over [0, n) in contiguous chunks on up to GOMAXPROCS
// goroutines, giving each at least grain elements; small work runs inline.
func parallel(n, grain int, f func(lo, hi int)) {
	workers := runtime.GOMAXPROCS(0)
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

// serial runs f over [0, n) on the calling goroutine: parallel's signature,
// for work that a caller has already spread over the cores.
func serial(n, _ int, f func(lo, hi int)) {
	if n > 0 {
		f(0, n)
	}
}

// Write copies host bytes into dst.
func (c *Backend) Write(dst kernels.Buf, src []byte) {
	if int64(len(src)) != dst.Bytes() {
		panic(fmt.Sprintf("cpu: write of %d bytes into a %d-byte buffer", len(src), dst.Bytes()))
	}
	copy(raw(dst), src)
}

// Read copies src into host bytes.
func (c *Backend) Read(dst []byte, src kernels.Buf) {
	if int64(len(dst)) != src.Bytes() {
		panic(fmt.Sprintf("cpu: read of a %d-byte buffer into %d bytes", src.Bytes(), len(dst)))
	}
	copy(dst, raw(src))
}

// Copy copies src into dst.
func (c *Backend) Copy(dst, src kernels.Buf) {
	if dst.DType != src.DType || dst.N != src.N {
		panic(fmt.Sprintf("cpu: copy of %d %v into %d %v", src.N, src.DType, dst.N, dst.DType))
	}
	copy(raw(dst), raw(src))
}

// CopyMany copies each src[i] into dst[i].
func (c *Backend) CopyMany(dst, src []kernels.Buf) {
	kernels.CheckLists("copy many", dst, src)
	for i := range dst {
		c.Copy(dst[i], src[i])
	}
}

// CastMany converts each src[i] into dst[i].
func (c *Backend) CastMany(dst, src []kernels.Buf) {
	kernels.CheckCastLists("cast many", dst, src)
	for i := range dst {
		c.Cast(dst[i], src[i])
	}
}

// AccumulateMany adds each src[i], converted, into dst[i].
func (c *Backend) AccumulateMany(dst, src []kernels.Buf) {
	kernels.CheckAccumulateLists("accumulate many", dst, src)
	for i := range dst {
		d := f32s(dst[i])
		s, done := view(src[i])
		for j, v := range s {
			d[j] += v
		}
		done()
	}
}

// Fill sets every element of dst to v.
func (c *Backend) Fill(dst kernels.Buf, v float32) {
	switch dst.DType {
	case kernels.F32:
		d := f32s(dst)
		parallel(len(d), 1<<15, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				d[i] = v
			}
		})
	case kernels.F16, kernels.BF16:
		d, h := u16s(dst), float16.Fromfloat32(v).Bits()
		if dst.DType == kernels.BF16 {
			h = half.BF16Bits(v)
		}
		for i := range d {
			d[i] = h
		}
	case kernels.I32:
		d := i32s(dst)
		for i := range d {
			d[i] = int32(v)
		}
	}
}

// Cast converts src into dst's dtype.
func (c *Backend) Cast(dst, src kernels.Buf) {
	kernels.CheckLen("cast", src.N, dst)
	if dst.DType == src.DType {
		c.Copy(dst, src)
		return
	}
	if dst.DType == kernels.I32 {
		s, d := in(src), i32s(dst)
		for i, x := range s {
			d[i] = int32(x)
		}
		return
	}
	switch {
	case dst.DType.Half() && src.DType == kernels.F32:
		storeInto(dst, f32s(src))
		return
	case dst.DType == kernels.F32 && src.DType.Half():
		convertInto(f32s(dst), src)
		return
	}
	s, doneS := view(src)
	defer doneS()
	o, done := out(dst)
	copy(o, s)
	done()
}

// Transpose swaps the inner axes of src into dst, moving the elements'
// bits (no rounding), a tile at a time so that both sides stay in cache.
func (c *Backend) Transpose(dst, src kernels.Buf, t kernels.Transposition) {
	kernels.CheckTranspose(t, dst, src)
	switch dst.DType.Size() {
	case 4:
		transpose(unsafe.Slice((*uint32)(unsafe.Pointer(&raw(dst)[0])), dst.N), unsafe.Slice((*uint32)(unsafe.Pointer(&raw(src)[0])), src.N), t)
	case 2:
		transpose(u16s(dst), u16s(src), t)
	default:
		panic(fmt.Sprintf("cpu: transpose of %v", dst.DType))
	}
}

// transpose is Transpose for elements of one width.
func transpose[E uint16 | uint32](dst, src []E, t kernels.Transposition) {
	const tile = 32
	n := t.Rows * t.Cols
	for o := 0; o < t.Outer; o++ {
		d, s := dst[o*n:][:n], src[o*n:][:n]
		for r0 := 0; r0 < t.Rows; r0 += tile {
			for c0 := 0; c0 < t.Cols; c0 += tile {
				for r := r0; r < min(r0+tile, t.Rows); r++ {
					for c := c0; c < min(c0+tile, t.Cols); c++ {
						d[c*t.Rows+r] = s[r*t.Cols+c]
					}
				}
			}
		}
	}
}
