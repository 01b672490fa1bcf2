package half

import (
	"math"
	"math/big"
	"slices"
	"testing"
)

// bf16Ref rounds f to BF16 through exact big-float arithmetic: the nearest
// of the representable neighbours, ties to the even mantissa, overflow to
// infinity, NaN to a quiet NaN. Independent of BF16Bits's bit tricks.
func bf16Ref(f float32) uint16 {
	if math.IsNaN(float64(f)) {
		return 0x7fc0 | uint16(math.Float32bits(f)>>16)&0x8000
	}
	u := math.Float32bits(f)
	lo := uint16(u >> 16) // truncation: the neighbour towards zero
	hi := lo + 1          // the neighbour away from zero (may be infinity)
	x := new(big.Float).SetFloat64(float64(f))
	a := new(big.Float).SetFloat64(float64(math.Float32frombits(uint32(lo) << 16)))
	if u&0xffff == 0 {
		return lo
	}
	var b *big.Float
	if (hi & 0x7fff) == 0x7f80 { // the next is infinity: the step is still 2^(e-7)
		step := new(big.Float).Sub(new(big.Float).SetFloat64(float64(math.Float32frombits(uint32(lo)<<16))),
			new(big.Float).SetFloat64(float64(math.Float32frombits(uint32(lo-1)<<16))))
		b = new(big.Float).Add(a, step)
	} else {
		b = new(big.Float).SetFloat64(float64(math.Float32frombits(uint32(hi) << 16)))
	}
	da := new(big.Float).Abs(new(big.Float).Sub(x, a))
	db := new(big.Float).Abs(new(big.Float).Sub(b, x))
	switch da.Cmp(db) {
	case -1:
		return lo
	case 1:
		return hi
	}
	if lo&1 == 0 {
		return lo
	}
	return hi
}

func TestBF16Rounding(t *testing.T) {
	cases := []float32{0, -0, 1, -1, 1.00390625, 1.01171875, 3.140625, 65504, 1e-40, -1e-40,
		math.MaxFloat32, -math.MaxFloat32, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()),
		math.Float32frombits(0x3f808000), math.Float32frombits(0x3f818000), math.Float32frombits(0x7f7f8000)}
	for i := uint32(0); i < 1<<16; i++ {
		cases = append(cases, math.Float32frombits(i*65537+12345), math.Float32frombits(0x3f800000|i), math.Float32frombits(0x00008000|i<<8))
	}
	for _, f := range cases {
		got, want := BF16Bits(f), bf16Ref(f)
		if math.IsNaN(float64(f)) {
			if v := BF16Value(got); !math.IsNaN(float64(v)) {
				t.Errorf("BF16(NaN) = %#x, not a NaN", got)
			}
			continue
		}
		if got != want {
			t.Fatalf("BF16(%g = %#08x) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
		if back := BF16Value(got); BF16Bits(back) != got {
			t.Fatalf("BF16 %#04x does not round-trip through float32 (%g)", got, back)
		}
	}
	// In place: each value the reference's BF16, as a float32.
	v := slices.Clone(cases)
	RoundBF16(v)
	for i, f := range cases {
		if want := BF16Value(bf16Ref(f)); !math.IsNaN(float64(f)) && math.Float32bits(v[i]) != math.Float32bits(want) {
			t.Fatalf("RoundBF16(%g) = %g, want %g", f, v[i], want)
		}
		if math.IsNaN(float64(f)) != math.IsNaN(float64(v[i])) {
			t.Fatalf("RoundBF16(%g) = %g", f, v[i])
		}
	}
	dst := make([]uint16, 3)
	BF16FromFloat32(dst, []float32{1, 2, 3})
	f := make([]float32, 3)
	BF16ToFloat32(f, dst)
	if f[0] != 1 || f[1] != 2 || f[2] != 3 {
		t.Errorf("round trip of 1, 2, 3: %v", f)
	}
}
