//go:build amd64 && !purego

package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestGeluPassesMatchGo: geluRow through its AVX-512 passes gives the
// bits of its Go loops, on rows of every length to 300 (whole vectors and
// tails) of normal values, large ones either side, infinities, NaN and
// both zeros, into another row and in place.
func TestGeluPassesMatchGo(t *testing.T) {
	if !hasAVX512 {
		t.Skip("no AVX-512 on this CPU: geluRow runs its Go loops only")
	}
	rng := rand.New(rand.NewPCG(11, 12))
	special := []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 0, float32(math.Copysign(0, -1)), 60, -60, 1e-30}
	for n := 0; n <= 300; n++ {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * 3)
			if rng.IntN(10) == 0 {
				x[i] = special[rng.IntN(len(special))]
			}
		}
		want, got, inPlace := make([]float32, n), make([]float32, n), append([]float32(nil), x...)
		hasAVX512 = false
		geluRow(want, x)
		hasAVX512 = true
		geluRow(got, x)
		geluRow(inPlace, inPlace)
		for i := range x {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) || math.Float32bits(inPlace[i]) != math.Float32bits(want[i]) {
				t.Fatalf("n %d: GELU(%v) is %v with the passes (%v in place), %v with the Go loops", n, x[i], got[i], inPlace[i], want[i])
			}
		}
	}
}
