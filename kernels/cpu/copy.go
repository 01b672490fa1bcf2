package cpu

import (
	"fmt"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu/internal/half"
	"github.com/x448/float16"
)

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
	case kernels.U8:
		d := raw(dst)[:dst.N]
		for i := range d {
			d[i] = uint8(v)
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
