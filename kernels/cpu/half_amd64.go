//go:build amd64 && !purego

package cpu

import "golang.org/x/sys/cpu"

//go:noescape
func halfToFloat8(dst *float32, src *uint16, n int)

//go:noescape
func floatToHalf8(dst *uint16, src *float32, n int)

// hasF16C reports the F16C conversions. x/sys/cpu does not report F16C
// itself; every CPU with AVX2 and FMA has it (Intel since Haswell, AMD since
// Piledriver).
var hasF16C = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// convertHalf converts the leading multiple of eight values of src into dst
// with F16C where the CPU has it, returning how many it converted: the
// caller's table lookups do the last few (cheaper than a trip through an
// eight-wide temporary: a convolution's rows and a plane's tails are short).
func convertHalf(dst []float32, src []uint16) int {
	n := min(len(dst), len(src))
	if !hasF16C {
		return 0
	}
	body := n &^ 7
	if body > 0 {
		halfToFloat8(&dst[0], &src[0], body)
	}
	return body
}

// convertFloat converts src into dst (rounding to nearest even) eight at a
// time with F16C where the CPU has it, the last few through an eight-wide
// temporary, returning how many it converted: all of them, or none without
// F16C.
func convertFloat(dst []uint16, src []float32) int {
	n := min(len(dst), len(src))
	if !hasF16C || n == 0 {
		return 0
	}
	body := n &^ 7
	if body > 0 {
		floatToHalf8(&dst[0], &src[0], body)
	}
	if body < n {
		var f [8]float32
		var h [8]uint16
		copy(f[:], src[body:n])
		floatToHalf8(&h[0], &f[0], 8)
		copy(dst[body:n], h[:])
	}
	return n
}
