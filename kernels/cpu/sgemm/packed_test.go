package sgemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestPackedB multiplies through a B packed ahead of time, by the
// Multiplier that packed it (its panels read in place) and by every other
// (read through Pack, panels of another width): the same bits as the
// product that packs B itself, and within float32's error of float64;
// over k across several of the packed stretches, n across panel edges, B
// stored both ways, and alpha and beta that scale and add.
func TestPackedB(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	shapes := []struct{ m, n, k int }{{1, 1, 1}, {5, 47, 9}, {16, 48, 128}, {9, 97, 385}, {20, 130, 800}, {3, 5, 0}}
	for _, packer := range multipliers(t) {
		for _, s := range shapes {
			for _, tb := range []bool{false, true} {
				br, bc := s.k, s.n
				if tb {
					br, bc = s.n, s.k
				}
				ldb := bc + 2
				b := random(rng, max(br*ldb, 1))
				dst := random(rng, packer.PackedLen(s.k, s.n)+5) // poisoned: every value written or unread
				pk := packer.PackB(dst, MatrixB(b, ldb, tb), s.k, s.n)
				for _, mu := range multipliers(t) {
					name := fmt.Sprintf("packed by %s/t%d, run by %s/t%d, %dx%dx%d, tb=%v", packer.Kernel(), packer.threads, mu.Kernel(), mu.threads, s.m, s.n, s.k, tb)
					a := random(rng, max(s.m*s.k, 1))
					c0 := random(rng, max(s.m*s.n, 1))
					want := append([]float32(nil), c0...)
					mu.GemmOp(s.m, s.n, s.k, 0.5, MatrixA(a, s.k, false), MatrixB(b, ldb, tb), 0.25, want, s.n)
					got := append([]float32(nil), c0...)
					mu.GemmOp(s.m, s.n, s.k, 0.5, MatrixA(a, s.k, false), pk, 0.25, got, s.n)
					for i := range got {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("%s: C[%d] = %v through the packed B, %v packing it", name, i, got[i], want[i])
						}
					}
					checkClose(t, name, got, reference(false, tb, s.m, s.n, s.k, 0.5, a, s.k, b, ldb, 0.25, c0, s.n), s.m, s.n, s.n, s.k)
				}
			}
		}
	}
}

// TestPackBRefusesShortDestination: PackB panics, naming the sizes, when
// dst cannot hold the panels.
func TestPackBRefusesShortDestination(t *testing.T) {
	mu := Default()
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "4×50 B") || !strings.Contains(fmt.Sprint(r), "want") {
			t.Fatalf("PackB into too few values: recovered %v", r)
		}
	}()
	mu.PackB(make([]float32, mu.PackedLen(4, 50)-1), MatrixB(make([]float32, 200), 50, false), 4, 50)
}
