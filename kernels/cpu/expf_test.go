package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestExpf(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	xs := []float32{0, 1, -1, 0.5, -0.5, 88.7, -87.3, 1e-8, -1e-8, float32(math.Ln2), 20, -20}
	for range 100000 {
		xs = append(xs, float32(rng.Float64()*176-87.3))
	}
	var worst float64
	for _, x := range xs {
		want := math.Exp(float64(x))
		got := float64(expf(x))
		ulp := float64(math.Nextafter32(float32(want), float32(math.Inf(1)))) - float64(float32(want))
		if e := math.Abs(got-want) / ulp; e > worst {
			worst = e
			if e > 2 {
				t.Errorf("expf(%v) = %v, exp = %v: %.1f ulp", x, got, want, e)
			}
		}
	}
	for _, tc := range []struct{ x, want float32 }{
		{89, float32(math.Inf(1))}, {-88, 0}, {float32(math.Inf(-1)), 0}, {float32(math.Inf(1)), float32(math.Inf(1))},
	} {
		if got := expf(tc.x); got != tc.want {
			t.Errorf("expf(%v) = %v, want %v", tc.x, got, tc.want)
		}
	}
	if got := expf(float32(math.NaN())); got == got {
		t.Errorf("expf(NaN) = %v", got)
	}
	t.Logf("worst error %.2f ulp", worst)
}

func BenchmarkExpf(b *testing.B) {
	xs := make([]float32, 4096)
	for i := range xs {
		xs[i] = float32(i%200) * -0.05
	}
	b.Run("expf", func(b *testing.B) {
		var s float32
		for b.Loop() {
			for _, x := range xs {
				s += expf(x)
			}
		}
		_ = s
	})
	b.Run("math.Exp", func(b *testing.B) {
		var s float64
		for b.Loop() {
			for _, x := range xs {
				s += math.Exp(float64(x))
			}
		}
		_ = s
	})
}

// TestExpShift: the vector pass (where the CPU has one) and the scalar tail
// agree with exp(x − shift) for x ≤ shift and sum what they wrote.
func TestExpShift(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 5, 8, 37, 1000} {
		z := make([]float32, n)
		for i := range z {
			z[i] = float32(30 - rng.Float64()*130)
		}
		if n > 3 {
			z[0], z[1], z[2] = 30, -200, 0 // the shift's own value, one far below, zero
		}
		want := make([]float64, n)
		for i, v := range z {
			want[i] = math.Exp(float64(v - 30)) // the difference is float32's, as the kernels take it
		}
		sum := expShift(z, 30)
		var wantSum float64
		for i := range z {
			wantSum += want[i]
			if tol := 3e-7*want[i] + 1.2e-38; math.Abs(float64(z[i])-want[i]) > tol {
				t.Errorf("n %d: exp(z[%d] − 30) = %v, want %v", n, i, z[i], want[i])
			}
		}
		if math.Abs(sum-wantSum) > 1e-6*wantSum {
			t.Errorf("n %d: sum %v, want %v", n, sum, wantSum)
		}
	}
}
