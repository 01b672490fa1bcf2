package kernels

import (
	"fmt"
	"math"
	"slices"
)

// Quant8Block is how many values a block of an 8-bit optimizer state holds
// (OptimOps.AdamW8): each block's values are stored as one byte each, a
// code into one of Quant8Maps' halves, scaled by the block's largest
// magnitude.
const Quant8Block = 256

// Quant8Blocks is the blocks of a state of n values.
func Quant8Blocks(n int) int { return (n + Quant8Block - 1) / Quant8Block }

// Quant8Maps are the code books of 8-bit optimizer states, 512 values: the
// first 256, ascending in [-0.993, 1], a signed map for AdamW's first
// moment; the next 256, ascending in [0, 1], an unsigned one for the
// square root of its second moment. Both are dynamic (tree) quantisation
// as in Dettmers et al., "8-bit Optimizers via Block-wise Quantization"
// (2022): 0, 1, and seven decades from 10⁻⁶ up, each decade's values the
// midpoints of an even split of [0.1, 1] into twice as many parts as the
// decade below (the unsigned map's decades have twice the signed map's
// parts, the sign bit's worth): a block's small values keep their
// magnitude to seven decades, its large ones their precision.
var Quant8Maps = append(quant8Map(true), quant8Map(false)...)

func quant8Map(signed bool) []float32 {
	var vals []float64
	for d := range 7 {
		scale, parts := math.Pow(10, float64(d-6)), 1<<d
		if !signed {
			parts *= 2
		}
		for j := range parts {
			v := scale * (0.1 + 0.9*(float64(j)+0.5)/float64(parts))
			vals = append(vals, v)
			if signed {
				vals = append(vals, -v)
			}
		}
	}
	vals = append(vals, 0, 1)
	slices.Sort(vals)
	out := make([]float32, len(vals))
	for i, v := range vals {
		out[i] = float32(v)
	}
	if len(out) != 256 {
		panic(fmt.Sprintf("kernels: an 8-bit code book of %d values", len(out)))
	}
	return out
}

// Quant8Code is the code of x in the code book m (256 ascending values):
// the index of the value nearest x, the lower one of a tie, in float32 (the
// code every backend's kernel must give): the last value not above x, by
// eight halvings that compile without branches, then it or the next.
func Quant8Code(m []float32, x float32) uint8 {
	m = m[:256]
	lo := 0
	for half := 128; half > 0; half >>= 1 {
		if m[lo+half] <= x {
			lo += half
		}
	}
	if lo == 255 || x-m[lo] <= m[lo+1]-x {
		return uint8(lo)
	}
	return uint8(lo + 1)
}

// CheckQuant8 panics unless AdamW8's lists agree: params and grads F32 of
// one length each, codes U8 of twice it, absmax F32 of two a block, qmap
// F32 of 512 values.
func CheckQuant8(op string, qmap Buf, params, grads, codes, absmax []Buf) {
	CheckLists(op, params, grads)
	if len(codes) != len(params) || len(absmax) != len(params) {
		panic(fmt.Sprintf("kernels: %s: %d parameters, %d code lists and %d absmax lists", op, len(params), len(codes), len(absmax)))
	}
	if qmap.N != len(Quant8Maps) || qmap.DType != F32 {
		panic(fmt.Sprintf("kernels: %s: a code book of %d %v values, want %d f32", op, qmap.N, qmap.DType, len(Quant8Maps)))
	}
	for i, p := range params {
		if c := codes[i]; c.N != 2*p.N || c.DType != U8 {
			panic(fmt.Sprintf("kernels: %s: tensor %d: %d %v codes for %d values, want %d u8", op, i, c.N, c.DType, p.N, 2*p.N))
		}
		if a := absmax[i]; a.N != 2*Quant8Blocks(p.N) || a.DType != F32 {
			panic(fmt.Sprintf("kernels: %s: tensor %d: %d %v absmax values for %d values, want %d f32", op, i, a.N, a.DType, p.N, 2*Quant8Blocks(p.N)))
		}
	}
}
