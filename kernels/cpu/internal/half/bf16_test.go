package half

import (
	"math"
	"math/big"
	"math/rand/v2"
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

// TestBF16Paths: BF16's conversions on every path this CPU has (AVX-512's,
// with masked tails, and Go's loops) give BF16Bits's and BF16Value's bits
// for every 16-bit pattern, the rounding cases (ties, NaNs, infinities,
// out-of-range values), and rows of every length from 1 to 40 with strides
// wider than the rows, whose gaps they leave alone.
func TestBF16Paths(t *testing.T) {
	src := roundingCases()
	for i := uint32(0); i < 1<<16; i++ { // BF16's own ties and neighbours
		src = append(src, math.Float32frombits(i<<16|0x8000), math.Float32frombits(i<<16|0x7fff), math.Float32frombits(i<<16|0x18000))
	}
	rng := rand.New(rand.NewPCG(7, 8))
	eachPath(t, func(t *testing.T) {
		got := make([]uint16, len(src))
		BF16FromFloat32(got, src)
		for i, f := range src {
			if want := BF16Bits(f); got[i] != want {
				t.Fatalf("BF16FromFloat32(%g = %#08x) = %#04x, want %#04x", f, math.Float32bits(f), got[i], want)
			}
		}
		every := make([]uint16, 1<<16+5)
		for i := range every {
			every[i] = uint16(i)
		}
		wide := make([]float32, len(every))
		BF16ToFloat32(wide, every)
		for i, h := range every {
			if want := BF16Value(h); math.Float32bits(wide[i]) != math.Float32bits(want) {
				t.Fatalf("BF16ToFloat32(%#04x) = %#08x, want %#08x", h, math.Float32bits(wide[i]), math.Float32bits(want))
			}
		}
		for n := 1; n <= 40; n++ {
			const rows = 5
			lds, ldd := n+3, n+7
			in := make([]uint16, (rows-1)*lds+n)
			for i := range in {
				in[i] = uint16(rng.Uint32())
			}
			out := make([]float32, (rows-1)*ldd+n)
			for i := range out {
				out[i] = -7
			}
			BF16ToFloat32Rows(out, ldd, in, lds, rows, n)
			for i, v := range out {
				want := float32(-7)
				if r, j := i/ldd, i%ldd; j < n {
					want = BF16Value(in[r*lds+j])
				}
				if math.Float32bits(v) != math.Float32bits(want) {
					t.Fatalf("n %d: BF16ToFloat32Rows: out[%d] = %#08x, want %#08x", n, i, math.Float32bits(v), math.Float32bits(want))
				}
			}
			for i := range out { // fresh values to round, off BF16's grid
				out[i] = float32(rng.NormFloat64() * 100)
			}
			back := make([]uint16, len(in))
			for i := range back {
				back[i] = 0xbeef
			}
			BF16FromFloat32Rows(back, lds, out, ldd, rows, n)
			for i, h := range back {
				want := uint16(0xbeef)
				if r, j := i/lds, i%lds; j < n {
					want = BF16Bits(out[r*ldd+j])
				}
				if h != want {
					t.Fatalf("n %d: BF16FromFloat32Rows: back[%d] = %#04x, want %#04x", n, i, h, want)
				}
			}
		}
	})
}
