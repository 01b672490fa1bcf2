//go:build amd64 && !purego

package half

import "golang.org/x/sys/cpu"

//go:noescape
func toFloatRows8(dst *float32, ldd int, src *uint16, lds int, rows, n int)

//go:noescape
func fromFloat8(dst *uint16, src *float32, n int)

//go:noescape
func toFloatRows16(dst *float32, ldd int, src *uint16, lds int, rows, n int)

//go:noescape
func bf16ToFloatRows16(dst *float32, ldd int, src *uint16, lds int, rows, n int)

//go:noescape
func bf16FromFloatRows16(dst *uint16, ldd int, src *float32, lds int, rows, n int)

//go:noescape
func copyRows16(dst *float32, ldd int, src *float32, lds int, rows, n int)

//go:noescape
func fromFloatRows16(dst *uint16, ldd int, src *float32, lds int, rows, n int)

// HasF16C reports the F16C conversions. x/sys/cpu does not report F16C
// itself; every CPU with AVX2 and FMA has it (Intel since Haswell, AMD since
// Piledriver).
var HasF16C = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// wide turns on the AVX-512 conversions, sixteen values at a time with
// masked loads and stores for the last few (so every value of a short row
// is converted in one pass). A variable, so the tests run the F16C ones on
// an AVX-512 CPU too.
var wide = cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL

// toFloat converts src into dst in assembly where the CPU has the
// instructions, returning how many it converted: all of them with AVX-512,
// the leading multiple of eight with F16C (Table does the last few: cheaper
// than a trip through an eight-wide temporary for short rows).
func toFloat(dst []float32, src []uint16) int {
	return toFloatRows(dst, 0, src, 0, 1, len(src))
}

// toFloatRows is toFloat for rows rows of n values with strides ldd and lds
// (ToFloat32Rows has checked the bounds), returning how many of each row it
// converted.
func toFloatRows(dst []float32, ldd int, src []uint16, lds int, rows, n int) int {
	switch {
	case rows == 0 || n == 0:
		return 0
	case wide:
		toFloatRows16(&dst[0], ldd, &src[0], lds, rows, n)
		return n
	case HasF16C && n >= 8:
		toFloatRows8(&dst[0], ldd, &src[0], lds, rows, n&^7)
		return n &^ 7
	}
	return 0
}

// fromFloat rounds src into dst in assembly where the CPU has the
// instructions (with F16C, the last few through an eight-wide temporary),
// returning how many it converted: all of them, or none.
func fromFloat(dst []uint16, src []float32) int {
	n := len(src)
	switch {
	case n == 0:
		return 0
	case wide:
		fromFloatRows16(&dst[0], 0, &src[0], 0, 1, n)
		return n
	case !HasF16C:
		return 0
	}
	body := n &^ 7
	if body > 0 {
		fromFloat8(&dst[0], &src[0], body)
	}
	if body < n {
		var f [8]float32
		var h [8]uint16
		copy(f[:], src[body:n])
		fromFloat8(&h[0], &f[0], 8)
		copy(dst[body:n], h[:])
	}
	return n
}

// fromFloatRows is fromFloat for rows of n values with strides ldd and lds
// (FromFloat32Rows has checked the bounds), returning how many of each row
// it converted: with AVX-512 all of them, otherwise none (FromFloat32Rows
// converts row by row).
func fromFloatRows(dst []uint16, ldd int, src []float32, lds int, rows, n int) int {
	if !wide || rows == 0 || n == 0 {
		return 0
	}
	fromFloatRows16(&dst[0], ldd, &src[0], lds, rows, n)
	return n
}

// copyRows copies rows of n float32 with strides ldd and lds in one
// assembly call with AVX-512 (CopyRows has checked the bounds), returning
// false without it.
func copyRows(dst []float32, ldd int, src []float32, lds int, rows, n int) bool {
	if !wide {
		return false
	}
	copyRows16(&dst[0], ldd, &src[0], lds, rows, n)
	return true
}

// bf16ToFloatRows converts rows of n BF16 values with strides ldd and lds
// (the callers have checked the bounds) in one assembly call with
// AVX-512, reporting whether it did.
func bf16ToFloatRows(dst []float32, ldd int, src []uint16, lds int, rows, n int) bool {
	if !wide || rows == 0 || n == 0 {
		return wide
	}
	bf16ToFloatRows16(&dst[0], ldd, &src[0], lds, rows, n)
	return true
}

// bf16FromFloatRows rounds rows of n values into BF16 as bf16ToFloatRows
// converts them back.
func bf16FromFloatRows(dst []uint16, ldd int, src []float32, lds int, rows, n int) bool {
	if !wide || rows == 0 || n == 0 {
		return wide
	}
	bf16FromFloatRows16(&dst[0], ldd, &src[0], lds, rows, n)
	return true
}
