//go:build amd64 && !purego

package half

import "golang.org/x/sys/cpu"

//go:noescape
func toFloat8(dst *float32, src *uint16, n int)

//go:noescape
func toFloatRows8(dst *float32, ldd int, src *uint16, lds int, rows, n int)

//go:noescape
func fromFloat8(dst *uint16, src *float32, n int)

// HasF16C reports the F16C conversions. x/sys/cpu does not report F16C
// itself; every CPU with AVX2 and FMA has it (Intel since Haswell, AMD since
// Piledriver).
var HasF16C = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// toFloat converts the leading multiple of eight values of src into dst
// with F16C where the CPU has it, returning how many it converted: Table
// does the last few (cheaper than a trip through an eight-wide temporary:
// a convolution's rows and a plane's tails are short).
func toFloat(dst []float32, src []uint16) int {
	body := len(src) &^ 7
	if !HasF16C || body == 0 {
		return 0
	}
	toFloat8(&dst[0], &src[0], body)
	return body
}

// fromFloat rounds src into dst eight at a time with F16C where the CPU has
// it, the last few through an eight-wide temporary, returning how many it
// converted: all of them, or none without F16C.
func fromFloat(dst []uint16, src []float32) int {
	n := len(src)
	if !HasF16C || n == 0 {
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

// toFloatRows converts the leading multiple of eight values of each row
// with F16C where the CPU has it, returning how many of each it converted
// (ToFloat32Rows has checked the bounds).
func toFloatRows(dst []float32, ldd int, src []uint16, lds int, rows, n int) int {
	body := n &^ 7
	if !HasF16C || body == 0 || rows == 0 {
		return 0
	}
	toFloatRows8(&dst[0], ldd, &src[0], lds, rows, body)
	return body
}
