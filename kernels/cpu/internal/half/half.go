// Package half converts between IEEE 754 binary16 (AMP's F16 tensors, held
// as their bits in uint16) and float32 on the CPU: with F16C instructions
// where the CPU has them, and with a table (to float32) and x448/float16 (to
// half) elsewhere, bit for bit the same. The CPU backend and sgemm's F16
// operands both convert through it.
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
// eight at a time with F16C, the last few (and all of them without F16C)
// by Table.
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
// ToFloat32 in one call for rows too short to convert one at a time (the
// panels a matrix product packs are 8 to 48 values wide).
func ToFloat32Rows(dst []float32, ldd int, src []uint16, lds int, rows, n int) {
	if rows <= 0 || n <= 0 {
		return
	}
	if ldd < n || lds < n || len(dst) < (rows-1)*ldd+n || len(src) < (rows-1)*lds+n {
		panic(fmt.Sprintf("half: %d rows of %d values with strides %d and %d, from %d into %d values",
			rows, n, lds, ldd, len(src), len(dst)))
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
// x448/float16 round), min(len(dst), len(src)) values: with F16C where the
// CPU has it, x448/float16 otherwise.
func FromFloat32(dst []uint16, src []float32) {
	n := min(len(dst), len(src))
	for i := fromFloat(dst[:n], src[:n]); i < n; i++ {
		dst[i] = float16.Fromfloat32(src[i]).Bits()
	}
}
