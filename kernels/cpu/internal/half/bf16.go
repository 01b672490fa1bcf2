package half

import "math"

// bfloat16 (BF16): the top 16 bits of a float32, so it converts to float32
// exactly by a shift, and from float32 by rounding to nearest even on the
// dropped 16 bits (NaNs stay NaN, quiet, sign kept; a finite value beyond
// the largest BF16 rounds to infinity), as PyTorch and the CUDA backend
// convert: a few integer instructions, sixteen values at a time with
// AVX-512.

// BF16Bits rounds f to the nearest BF16 value, ties to even, and returns
// its bits.
func BF16Bits(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40 // NaN: quiet
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// BF16Value is the float32 value of BF16 bits (exact).
func BF16Value(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// BF16ToFloat32 converts src into dst, min(len(dst), len(src)) values
// (sixteen an instruction with AVX-512).
func BF16ToFloat32(dst []float32, src []uint16) {
	n := min(len(dst), len(src))
	if bf16ToFloatRows(dst, 0, src, 0, 1, n) {
		return
	}
	for i, h := range src[:n] {
		dst[i] = math.Float32frombits(uint32(h) << 16)
	}
}

// BF16FromFloat32 rounds src into dst, min(len(dst), len(src)) values
// (sixteen an instruction with AVX-512).
func BF16FromFloat32(dst []uint16, src []float32) {
	n := min(len(dst), len(src))
	if bf16FromFloatRows(dst, 0, src, 0, 1, n) {
		return
	}
	for i, f := range src[:n] {
		dst[i] = BF16Bits(f)
	}
}

// RoundBF16 rounds every value of v in place to the nearest BF16 value (as
// BF16Bits), in one pass and with no 16-bit copy.
func RoundBF16(v []float32) {
	for i, f := range v {
		v[i] = BF16Value(BF16Bits(f))
	}
}

// BF16ToFloat32Rows is ToFloat32Rows for BF16 values.
func BF16ToFloat32Rows(dst []float32, ldd int, src []uint16, lds int, rows, n int) {
	if !checkRows(len(dst), ldd, len(src), lds, rows, n) || bf16ToFloatRows(dst, ldd, src, lds, rows, n) {
		return
	}
	for r := range rows {
		BF16ToFloat32(dst[r*ldd:r*ldd+n], src[r*lds:r*lds+n])
	}
}

// BF16FromFloat32Rows is FromFloat32Rows for BF16 values.
func BF16FromFloat32Rows(dst []uint16, ldd int, src []float32, lds int, rows, n int) {
	if !checkRows(len(dst), ldd, len(src), lds, rows, n) || bf16FromFloatRows(dst, ldd, src, lds, rows, n) {
		return
	}
	for r := range rows {
		BF16FromFloat32(dst[r*ldd:r*ldd+n], src[r*lds:r*lds+n])
	}
}
