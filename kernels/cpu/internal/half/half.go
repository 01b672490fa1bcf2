// Package half converts between IEEE 754 binary16 (AMP's F16 tensors, held
// as their bits in uint16) and float32 on the CPU: with F16C instructions
// where the CPU has them, and with a table (to float32) and x448/float16 (to
// half) elsewhere, bit for bit the same. The CPU backend and sgemm's F16
// operands convert through it. CopyRows copies float32 rows with the loop of
// the row conversions.
package half

import (
	"fmt"
	"sync"

	"github.com/x448/float16"
)

// Table maps every binary16 bit pattern to its float32 value (exact), built
// once from x448/float16's conversion: a load instead of bit manipulation,
// for the few values a vector conversion leaves over.
var Table = sync.OnceValue(func() *[1 << 16]float32 {
	t := new([1 << 16]float32)
	for i := range t {
		t[i] = float16.Frombits(uint16(i)).Float32()
	}
	return t
})

// ToFloat32 converts src into dst (exact), min(len(dst), len(src)) values:
// in assembly where the CPU has the instructions (AVX-512, or F16C eight at
// a time), by Table otherwise and for what F16C leaves over.
func ToFloat32(dst []float32, src []uint16) {
	n := min(len(dst), len(src))
	i := toFloat(dst[:n], src[:n])
	if i == n {
		return
	}
	table := Table()
	for ; i < n; i++ {
		dst[i] = table[src[i]]
	}
}

// ToFloat32Rows converts rows rows of n values each, with row strides ldd and
// lds: dst[r·ldd + j] = float32(src[r·lds + j]) for r < rows, j < n. It is
// ToFloat32 in one call for rows too short to convert one at a time (a
// product's panels of 8 to 48 values, a 7×7 image's rows).
func ToFloat32Rows(dst []float32, ldd int, src []uint16, lds int, rows, n int) {
	if !checkRows(len(dst), ldd, len(src), lds, rows, n) {
		return
	}
	body := toFloatRows(dst, ldd, src, lds, rows, n)
	if body == n {
		return
	}
	table := Table()
	for r := range rows {
		for j, v := range src[r*lds+body : r*lds+n] {
			dst[r*ldd+body+j] = table[v]
		}
	}
}

// FromFloat32 rounds src into dst (to nearest even, as IEEE 754 and
// x448/float16 round), min(len(dst), len(src)) values: in assembly where the
// CPU has the instructions, with x448/float16 otherwise.
func FromFloat32(dst []uint16, src []float32) {
	n := min(len(dst), len(src))
	for i := fromFloat(dst[:n], src[:n]); i < n; i++ {
		dst[i] = float16.Fromfloat32(src[i]).Bits()
	}
}

// FromFloat32Rows rounds rows rows of n values each, with row strides ldd and
// lds: dst[r·ldd + j] = half(src[r·lds + j]) for r < rows, j < n.
func FromFloat32Rows(dst []uint16, ldd int, src []float32, lds int, rows, n int) {
	if !checkRows(len(dst), ldd, len(src), lds, rows, n) {
		return
	}
	if fromFloatRows(dst, ldd, src, lds, rows, n) == n {
		return
	}
	for r := range rows {
		FromFloat32(dst[r*ldd:r*ldd+n], src[r*lds:r*lds+n])
	}
}

// CopyRows copies rows rows of n float32 values each, with row strides ldd
// and lds: dst[r·ldd + j] = src[r·lds + j]. It is the loop of
// ToFloat32Rows without the conversion, in one assembly call with AVX-512
// (a convolution's short rows into and out of its padded grid), and copy
// row by row otherwise.
func CopyRows(dst []float32, ldd int, src []float32, lds int, rows, n int) {
	if !checkRows(len(dst), ldd, len(src), lds, rows, n) || copyRows(dst, ldd, src, lds, rows, n) {
		return
	}
	for r := range rows {
		copy(dst[r*ldd:r*ldd+n], src[r*lds:r*lds+n])
	}
}

// checkRows reports whether there is anything to convert, and panics unless
// rows rows of n values with strides ldd and lds fit in dst and src.
func checkRows(dst, ldd, src, lds, rows, n int) bool {
	if rows <= 0 || n <= 0 {
		return false
	}
	if ldd < n || lds < n || dst < (rows-1)*ldd+n || src < (rows-1)*lds+n {
		panic(fmt.Sprintf("half: %d rows of %d values with strides %d and %d, from %d values into %d",
			rows, n, lds, ldd, src, dst))
	}
	return true
}
