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
// done: F32 buffers are read in place; F16 ones are converted into scratch.
func view(b kernels.Buf) (x []float32, done func()) {
	if b.DType != kernels.F16 {
		return in(b), func() {}
	}
	x = getScratch(b.N)
	halfInto(x, u16s(b))
	return x, func() { putScratch(x) }
}

// values are a buffer's elements as float32 for a pass that reads or
// writes them a stretch at a time (elementwise operations and reductions a
// chunk at a time, batch norm a channel, convolutions' grids a row): F32 ones
// read and written in place, F16 ones converted on the way, with no
// converted copy of the whole buffer.
type values struct {
	f32 []float32
	f16 []uint16
}

// valuesOf is b's elements; b is F32 or F16.
func valuesOf(b kernels.Buf) values {
	switch b.DType {
	case kernels.F32:
		return values{f32: f32s(b)}
	case kernels.F16:
		return values{f16: u16s(b)}
	}
	panic(fmt.Sprintf("cpu: want an f32 or f16 buffer, have %v", b.DType))
}

// optValuesOf is valuesOf for an optional buffer: no values when b is not
// given.
func optValuesOf(b kernels.Buf) values {
	if !b.Valid() {
		return values{}
	}
	return valuesOf(b)
}

// span is elements [off, off+n) as float32: in place for F32, converted
// into buf for F16, nil for no values.
func (v values) span(off, n int, buf []float32) []float32 {
	switch {
	case v.f32 != nil:
		return v.f32[off : off+n]
	case v.f16 != nil:
		v.read(buf[:n], off)
		return buf[:n]
	}
	return nil
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
	default:
		return nil
	}
	return b
}

// target is where to compute elements [off, off+n) before commit: in place
// for F32, buf for F16, nil for no values.
func (v values) target(off, n int, buf []float32) []float32 {
	switch {
	case v.f32 != nil:
		return v.f32[off : off+n]
	case v.f16 != nil:
		return buf[:n]
	}
	return nil
}

// commit stores what target returned (rounding it into an F16 buffer).
func (v values) commit(off int, t []float32) {
	if v.f16 != nil {
		v.write(off, t)
	}
}

// read copies len(dst) elements from off into dst.
func (v values) read(dst []float32, off int) {
	if v.f16 == nil {
		copy(dst, v.f32[off:])
		return
	}
	halfsToFloats(dst, v.f16[off:off+len(dst)])
}

// readRows copies rows rows of n elements, contiguous from off, into dst
// with row stride ldd (converting F16 ones as it goes).
func (v values) readRows(dst []float32, ldd, off, n, rows int) {
	if v.f16 != nil {
		half.ToFloat32Rows(dst, ldd, v.f16[off:off+rows*n], n, rows, n)
		return
	}
	half.CopyRows(dst, ldd, v.f32[off:off+rows*n], n, rows, n)
}

// writeRows stores rows rows of n values of src (row stride lds)
// contiguously from off (rounding them into an F16 buffer as it goes).
func (v values) writeRows(off, n, rows int, src []float32, lds int) {
	if v.f16 != nil {
		half.FromFloat32Rows(v.f16[off:off+rows*n], n, src, lds, rows, n)
		return
	}
	half.CopyRows(v.f32[off:off+rows*n], n, src, lds, rows, n)
}

// write stores src at off (rounded to F16 for an F16 buffer).
func (v values) write(off int, src []float32) {
	if v.f16 == nil {
		copy(v.f32[off:], src)
		return
	}
	floatsToHalfs(v.f16[off:off+len(src)], src)
}
