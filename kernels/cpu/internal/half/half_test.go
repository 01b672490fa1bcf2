package half

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/x448/float16"
)

// The conversions against x448/float16, bit for bit, on every path this CPU
// has: the AVX-512 one (masked tails), the F16C one (eight at a time, tails
// by table or through an eight-wide temporary), and the portable one on
// other CPUs and under the purego tag.

// eachPath runs f with the AVX-512 conversions on, where the CPU has them,
// and off.
func eachPath(t *testing.T, f func(t *testing.T)) {
	on := wide
	defer func() { wide = on }()
	for _, w := range []bool{true, false} {
		if w && !on {
			continue
		}
		wide = w
		t.Run(fmt.Sprintf("avx512=%v", w), f)
	}
}

func TestHalfToFloatEveryPattern(t *testing.T) {
	eachPath(t, func(t *testing.T) {
		src := make([]uint16, 1<<16+5) // not a multiple of 8 or 16: a tail
		for i := range src {
			src[i] = uint16(i)
		}
		dst := make([]float32, len(src))
		ToFloat32(dst, src)
		for i, h := range src {
			if want := float16.Frombits(h).Float32(); !same(dst[i], want) {
				t.Fatalf("half %#04x: got %v (%#08x), want %v", h, dst[i], math.Float32bits(dst[i]), want)
			}
		}
	})
}

// roundingCases are every half's value, the midpoints between neighbours
// (ties round to even), values just off them, random bit patterns (NaNs,
// infinities, numbers out of range) and random normal numbers.
func roundingCases() []float32 {
	rng := rand.New(rand.NewPCG(5, 6))
	var src []float32
	for h := 0; h < 1<<16; h++ {
		v := float16.Frombits(uint16(h)).Float32()
		next := float16.Frombits(uint16(h + 1)).Float32()
		mid := float32((float64(v) + float64(next)) / 2)
		src = append(src, v, mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, float32(math.Inf(1))))
	}
	for i := 0; i < 100000; i++ {
		src = append(src, math.Float32frombits(rng.Uint32()), float32(rng.NormFloat64()*1000))
	}
	return append(src, 1, 2, 3) // a tail
}

func TestFloatToHalfRounding(t *testing.T) {
	src := roundingCases()
	eachPath(t, func(t *testing.T) {
		dst := make([]uint16, len(src))
		if n := fromFloat(dst, src); HasF16C && n != len(src) {
			t.Fatalf("the assembly converted %d of %d", n, len(src))
		}
		FromFloat32(dst, src)
		for i, v := range src {
			if want := float16.Fromfloat32(v); !sameHalf(dst[i], want.Bits()) {
				t.Fatalf("float %v (%#08x): got %#04x, want %#04x", v, math.Float32bits(v), dst[i], want.Bits())
			}
		}
	})
}

// TestRows converts rows of every length from 1 to 40 (whole vectors and
// tails) with strides wider than the rows, both ways, and copies them, and
// leaves the values between rows alone.
func TestRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	eachPath(t, func(t *testing.T) {
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
			back := make([]uint16, len(src))
			for i := range back {
				back[i] = 0xbeef
			}
			FromFloat32Rows(back, lds, dst, ldd, rows, n)
			copied := make([]float32, len(dst))
			CopyRows(copied, ldd, dst, ldd, rows, n)
			for i, v := range copied {
				if want := dst[i]; i%ldd < n && !same(v, want) || i%ldd >= n && v != 0 {
					t.Fatalf("n %d: CopyRows: copied[%d] = %v, want %v", n, i, v, want)
				}
			}
			for i, v := range dst {
				r, j := i/ldd, i%ldd
				want := float32(-7)
				if j < n {
					want = float16.Frombits(src[r*lds+j]).Float32()
				}
				if !same(v, want) {
					t.Fatalf("n %d: dst[%d] (row %d, column %d) = %v, want %v", n, i, r, j, v, want)
				}
			}
			for i, h := range back {
				want := uint16(0xbeef)
				if i%lds < n {
					want = src[i]
				}
				if !sameHalf(h, want) {
					t.Fatalf("n %d: back[%d] = %#04x, want %#04x", n, i, h, want)
				}
			}
		}
	})
}

func TestRowsCheckBounds(t *testing.T) {
	for name, f := range map[string]func(){
		"to float32": func() { ToFloat32Rows(make([]float32, 40), 10, make([]uint16, 30), 10, 4, 8) },
		"to half":    func() { FromFloat32Rows(make([]uint16, 30), 10, make([]float32, 40), 10, 4, 8) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: rows past the end were converted", name)
				}
			}()
			f()
		}()
	}
}

func isNaN32(v float32) bool { return v != v }

// same reports whether a and b are the same float32, or both NaN.
func same(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || isNaN32(a) && isNaN32(b)
}

// sameHalf reports whether a and b are the same half, or both NaN.
func sameHalf(a, b uint16) bool {
	return a == b || float16.Frombits(a).IsNaN() && float16.Frombits(b).IsNaN()
}
