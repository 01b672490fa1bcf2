package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/x448/float16"
)

// The F16 conversions (F16C assembly where the CPU has it, the table and
// x448/float16 otherwise) against x448/float16, bit for bit: on amd64 the
// assembly converts every value (tails through an eight-wide temporary).

func TestHalfToFloatEveryPattern(t *testing.T) {
	src := make([]uint16, 1<<16+5) // not a multiple of 8: the tail takes the portable path
	for i := range src {
		src[i] = uint16(i)
	}
	dst := make([]float32, len(src))
	halfsToFloats(dst, src)
	for i, h := range src {
		want := float16.Frombits(h).Float32()
		if math.Float32bits(dst[i]) != math.Float32bits(want) && !(isNaN32(dst[i]) && isNaN32(want)) {
			t.Fatalf("half %#04x: got %v (%#08x), want %v", h, dst[i], math.Float32bits(dst[i]), want)
		}
	}
}

func TestFloatToHalfRounding(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var src []float32
	// Every half's value, the midpoints between neighbours (ties round to
	// even), values just off them, random bit patterns (NaNs, infinities,
	// numbers out of range) and random normal numbers.
	for h := 0; h < 1<<16; h++ {
		v := float16.Frombits(uint16(h)).Float32()
		next := float16.Frombits(uint16(h + 1)).Float32()
		mid := float32((float64(v) + float64(next)) / 2)
		src = append(src, v, mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, float32(math.Inf(1))))
	}
	for i := 0; i < 100000; i++ {
		src = append(src, math.Float32frombits(rng.Uint32()), float32(rng.NormFloat64()*1000))
	}
	dst := make([]uint16, len(src))
	if n := convertFloat(dst, src); hasF16C && n != len(src) {
		t.Fatalf("F16C converted %d of %d", n, len(src))
	}
	floatsToHalfs(dst, src)
	for i, v := range src {
		want := float16.Fromfloat32(v)
		got := float16.Frombits(dst[i])
		if got.Bits() != want.Bits() && !(got.IsNaN() && want.IsNaN()) {
			t.Fatalf("float %v (%#08x): got %#04x, want %#04x", v, math.Float32bits(v), got.Bits(), want.Bits())
		}
	}
}

func isNaN32(v float32) bool { return v != v }
