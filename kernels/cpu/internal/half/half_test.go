package half

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/x448/float16"
)

// The conversions (F16C assembly where the CPU has it, the table and
// x448/float16 otherwise) against x448/float16, bit for bit: on amd64 the
// assembly converts every value but a tail (to float32: by table; to half:
// through an eight-wide temporary).

func TestHalfToFloatEveryPattern(t *testing.T) {
	src := make([]uint16, 1<<16+5) // not a multiple of 8: the tail takes the portable path
	for i := range src {
		src[i] = uint16(i)
	}
	dst := make([]float32, len(src))
	ToFloat32(dst, src)
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
	if n := fromFloat(dst, src); HasF16C && n != len(src) {
		t.Fatalf("F16C converted %d of %d", n, len(src))
	}
	FromFloat32(dst, src)
	for i, v := range src {
		want := float16.Fromfloat32(v)
		got := float16.Frombits(dst[i])
		if got.Bits() != want.Bits() && !(got.IsNaN() && want.IsNaN()) {
			t.Fatalf("float %v (%#08x): got %#04x, want %#04x", v, math.Float32bits(v), got.Bits(), want.Bits())
		}
	}
}

func isNaN32(v float32) bool { return v != v }

// TestToFloat32Rows converts rows of every length from 1 to 40 (bodies of
// eight and table tails) with strides wider than the rows, exactly, and
// leaves the values between rows alone.
func TestToFloat32Rows(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for n := 1; n <= 40; n++ {
		const rows = 5
		lds, ldd := n+3, n+7
		src := make([]uint16, (rows-1)*lds+n)
		for i := range src {
			src[i] = uint16(rng.Uint32())
		}
		dst := make([]float32, (rows-1)*ldd+n)
		for i := range dst {
			dst[i] = -7 // what the gaps must keep
		}
		ToFloat32Rows(dst, ldd, src, lds, rows, n)
		for i, v := range dst {
			r, j := i/ldd, i%ldd
			want := float32(-7)
			if j < n {
				want = float16.Frombits(src[r*lds+j]).Float32()
			}
			if math.Float32bits(v) != math.Float32bits(want) && !(isNaN32(v) && isNaN32(want)) {
				t.Fatalf("n %d: dst[%d] (row %d, column %d) = %v, want %v", n, i, r, j, v, want)
			}
		}
	}
}

func TestToFloat32RowsChecksBounds(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("rows past the end of src were converted")
		}
	}()
	ToFloat32Rows(make([]float32, 40), 10, make([]uint16, 30), 10, 4, 8)
}
