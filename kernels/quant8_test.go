package kernels_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/leangrad/leangrad/kernels"
)

// TestQuant8Maps: each code book is 256 distinct ascending values, the
// signed one spanning about [-1, 1] with 0 and 1, the unsigned [0, 1]; each
// reaches down seven decades; and Quant8Code finds the nearest value, as a
// search of every value does, on random values of every scale.
func TestQuant8Maps(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 8))
	for k, c := range []struct {
		name   string
		lo, hi float32
	}{{"signed", -0.993, 1}, {"unsigned", 0, 1}} {
		book := kernels.Quant8Maps[256*k : 256*k+256]
		if len(book) != 256 {
			t.Fatalf("%s book: %d values", c.name, len(book))
		}
		for i := 1; i < 256; i++ {
			if !(book[i] > book[i-1]) {
				t.Fatalf("%s book: value %d (%v) not above value %d (%v)", c.name, i, book[i], i-1, book[i-1])
			}
		}
		if math.Abs(float64(book[0]-c.lo)) > 1e-3 || book[255] != c.hi {
			t.Errorf("%s book spans [%v, %v], want [%v, %v]", c.name, book[0], book[255], c.lo, c.hi)
		}
		zero, smallest := -1, float32(1)
		for i, v := range book {
			if v == 0 {
				zero = i
			} else {
				smallest = min(smallest, float32(math.Abs(float64(v))))
			}
		}
		if zero < 0 || smallest > 1e-6 || smallest < 1e-7 {
			t.Errorf("%s book: zero at %d, smallest magnitude %v; want a zero and 1e-7 < smallest < 1e-6", c.name, zero, smallest)
		}
		for range 20000 {
			x := float32(math.Pow(10, -8*rng.Float64()))
			if k == 0 && rng.IntN(2) == 0 {
				x = -x
			}
			got := int(kernels.Quant8Code(book, x))
			best := 0
			for i, v := range book {
				if math.Abs(float64(v-x)) < math.Abs(float64(book[best]-x)) {
					best = i
				}
			}
			if math.Abs(float64(book[got]-x)) != math.Abs(float64(book[best]-x)) {
				t.Fatalf("%s book: code of %v is %d (%v), nearest is %d (%v)", c.name, x, got, book[got], best, book[best])
			}
		}
		for _, x := range []float32{-2, 2, 0} {
			got := kernels.Quant8Code(book, x)
			if want := min(max(x, book[0]), book[255]); book[got] != want && x != 0 {
				t.Errorf("%s book: code of %v is %d (%v), want the end %v", c.name, x, got, book[got], want)
			}
			if x == 0 && book[got] != 0 && k == 1 {
				t.Errorf("%s book: code of 0 is %d (%v)", c.name, got, book[got])
			}
		}
	}
}
