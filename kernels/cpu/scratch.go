package cpu

import (
	"fmt"
	"math/bits"
	"sync"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu/internal/half"
)

// Scratch (F16 operands converted to float32, padded convolution grids,
// product outputs) is kept in free lists of power-of-two sizes, so a
// training step neither hands the garbage collector megabytes per operation
// nor writes into pages the runtime has just returned to the OS (a
// sync.Pool empties at every collection, and the first writes to fresh
// pages cost more than a conversion). The lists keep at most scratchLimit
// bytes; what would pass it goes to the garbage collector. Scratch lives on
// the Go heap, outside the tensor pool.
const scratchLimit = 64 << 20

var scratch struct {
	sync.Mutex
	free  [64][][]float32
	bytes int // held in the lists
}

// getScratch returns n float32s of undefined contents; give them back with
// putScratch.
func getScratch(n int) []float32 {
	if n == 0 {
		return nil
	}
	class := bits.Len(uint(n - 1))
	scratch.Lock()
	defer scratch.Unlock()
	if l := scratch.free[class]; len(l) > 0 {
		s := l[len(l)-1]
		scratch.free[class] = l[:len(l)-1]
		scratch.bytes -= 4 * cap(s)
		return s[:n]
	}
	return make([]float32, n, 1<<class)
}

// putScratch gives back a slice from getScratch.
func putScratch(s []float32) {
	if cap(s) == 0 || cap(s)&(cap(s)-1) != 0 {
		return // not from getScratch
	}
	class := bits.Len(uint(cap(s) - 1))
	scratch.Lock()
	defer scratch.Unlock()
	if scratch.bytes+4*cap(s) <= scratchLimit {
		scratch.free[class] = append(scratch.free[class], s[:cap(s)])
		scratch.bytes += 4 * cap(s)
	}
}

// view is in(b) for an operation that gives the values back when it is
// done: F32 buffers are read in place; F16 and BF16 ones are converted into
// scratch.
func view(b kernels.Buf) (x []float32, done func()) {
	if !b.DType.Half() {
		return in(b), func() {}
	}
	x = getScratch(b.N)
	convertInto(x, b)
	return x, func() { putScratch(x) }
}

// values are a buffer's elements as float32 for a pass that reads or
// writes them a stretch at a time (elementwise operations and reductions a
// chunk at a time, batch norm a channel, convolutions' grids a row): F32 ones
// read and written in place, F16 and BF16 ones converted on the way, with
// no converted copy of the whole buffer. Exactly one of f32, f16 and bf16
// is set, or none for no values; the assembly fast paths take f16 only.
type values struct {
	f32  []float32
	f16  []uint16
	bf16 []uint16
}

// valuesOf is b's elements; b is F32, F16 or BF16.
func valuesOf(b kernels.Buf) values {
	switch b.DType {
	case kernels.F32:
		return values{f32: f32s(b)}
	case kernels.F16:
		return values{f16: u16s(b)}
	case kernels.BF16:
		return values{bf16: u16s(b)}
	}
	panic(fmt.Sprintf("cpu: want an f32, f16 or bf16 buffer, have %v", b.DType))
}

// optValuesOf is valuesOf for an optional buffer: no values when b is not
// given.
func optValuesOf(b kernels.Buf) values {
	if !b.Valid() {
		return values{}
	}
	return valuesOf(b)
}

// none reports whether v holds no values.
func (v values) none() bool { return v.f32 == nil && v.f16 == nil && v.bf16 == nil }

// span is elements [off, off+n) as float32: in place for F32, converted
// into buf for 16-bit values, nil for no values.
func (v values) span(off, n int, buf []float32) []float32 {
	switch {
	case v.f32 != nil:
		return v.f32[off : off+n]
	case v.none():
		return nil
	}
	v.read(buf[:n], off)
	return buf[:n]
}

// strided is the n elements at off, off+stride, … as float32: span for
// stride 1, gathered (and converted) into buf otherwise.
func (v values) strided(off, stride, n int, buf []float32) []float32 {
	if stride == 1 {
		return v.span(off, n, buf)
	}
	b := buf[:n]
	switch {
	case v.f32 != nil:
		for i := range b {
			b[i] = v.f32[off+i*stride]
		}
	case v.f16 != nil:
		table := half.Table()
		for i := range b {
			b[i] = table[v.f16[off+i*stride]]
		}
	case v.bf16 != nil:
		for i := range b {
			b[i] = half.BF16Value(v.bf16[off+i*stride])
		}
	default:
		return nil
	}
	return b
}

// target is where to compute elements [off, off+n) before commit: in place
// for F32, buf for 16-bit values, nil for no values.
func (v values) target(off, n int, buf []float32) []float32 {
	switch {
	case v.f32 != nil:
		return v.f32[off : off+n]
	case v.none():
		return nil
	}
	return buf[:n]
}

// commit stores what target returned (rounding it into a 16-bit buffer).
func (v values) commit(off int, t []float32) {
	if v.f32 == nil && !v.none() {
		v.write(off, t)
	}
}

// read copies len(dst) elements from off into dst.
func (v values) read(dst []float32, off int) {
	switch {
	case v.f16 != nil:
		halfsToFloats(dst, v.f16[off:off+len(dst)])
	case v.bf16 != nil:
		half.BF16ToFloat32(dst, v.bf16[off:off+len(dst)])
	default:
		copy(dst, v.f32[off:])
	}
}

// readRows copies rows rows of n elements, contiguous from off, into dst
// with row stride ldd (converting 16-bit ones as it goes).
func (v values) readRows(dst []float32, ldd, off, n, rows int) {
	switch {
	case v.f16 != nil:
		half.ToFloat32Rows(dst, ldd, v.f16[off:off+rows*n], n, rows, n)
	case v.bf16 != nil:
		half.BF16ToFloat32Rows(dst, ldd, v.bf16[off:off+rows*n], n, rows, n)
	default:
		half.CopyRows(dst, ldd, v.f32[off:off+rows*n], n, rows, n)
	}
}

// writeRows stores rows rows of n values of src (row stride lds)
// contiguously from off (rounding them into a 16-bit buffer as it goes).
func (v values) writeRows(off, n, rows int, src []float32, lds int) {
	switch {
	case v.f16 != nil:
		half.FromFloat32Rows(v.f16[off:off+rows*n], n, src, lds, rows, n)
	case v.bf16 != nil:
		half.BF16FromFloat32Rows(v.bf16[off:off+rows*n], n, src, lds, rows, n)
	default:
		half.CopyRows(v.f32[off:off+rows*n], n, src, lds, rows, n)
	}
}

// write stores src at off (rounded for a 16-bit buffer).
func (v values) write(off int, src []float32) {
	switch {
	case v.f16 != nil:
		floatsToHalfs(v.f16[off:off+len(src)], src)
	case v.bf16 != nil:
		half.BF16FromFloat32(v.bf16[off:off+len(src)], src)
	default:
		copy(v.f32[off:], src)
	}
}
