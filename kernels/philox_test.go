package kernels

import (
	"math"
	"testing"
)

// Known-answer vectors of Philox4x32-10 from Random123's kat_vectors.
func TestPhiloxKnownAnswers(t *testing.T) {
	for _, tc := range []struct {
		ctr    [4]uint32
		k0, k1 uint32
		want   [4]uint32
	}{
		{[4]uint32{0, 0, 0, 0}, 0, 0, [4]uint32{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
		{[4]uint32{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, 0xffffffff, 0xffffffff,
			[4]uint32{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
		{[4]uint32{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, 0xa4093822, 0x299f31d0,
			[4]uint32{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
	} {
		if got := philox4x32(tc.ctr, tc.k0, tc.k1); got != tc.want {
			t.Errorf("philox(%08x, %08x %08x) = %08x, want %08x", tc.ctr, tc.k0, tc.k1, got, tc.want)
		}
	}
}

func TestPhiloxUniformAndNormalMoments(t *testing.T) {
	g := Philox{Seed: 42, Offset: 7}
	const n = 200000
	var su, sn, sn2 float64
	for i := 0; i < n; i++ {
		u := ToUniform(g.Word(i))
		if u < 0 || u >= 1 {
			t.Fatalf("uniform %v outside [0,1)", u)
		}
		su += float64(u)
		z := float64(g.NormalAt(i))
		if math.IsNaN(z) || math.IsInf(z, 0) {
			t.Fatalf("normal %v", z)
		}
		sn += z
		sn2 += z * z
	}
	if m := su / n; math.Abs(m-0.5) > 0.005 {
		t.Errorf("uniform mean %v", m)
	}
	if m := sn / n; math.Abs(m) > 0.01 {
		t.Errorf("normal mean %v", m)
	}
	if v := sn2 / n; math.Abs(v-1) > 0.01 {
		t.Errorf("normal variance %v", v)
	}
	if g.Blocks(9) != 3 {
		t.Errorf("Blocks(9) = %d", g.Blocks(9))
	}
}

func TestBroadcast(t *testing.T) {
	for _, tc := range []struct {
		a, b, out []int
		ndim      int
	}{
		{[]int{2, 3}, []int{2, 3}, []int{2, 3}, 1},
		{[]int{4, 5}, []int{5}, []int{4, 5}, 2},
		{[]int{2, 3, 4, 5}, []int{1, 3, 1, 1}, []int{2, 3, 4, 5}, 3},
		{[]int{2, 3, 4, 5}, []int{}, []int{2, 3, 4, 5}, 1},
		{[]int{3, 1}, []int{1, 4}, []int{3, 4}, 2},
	} {
		out, err := BroadcastShape(tc.a, tc.b)
		if err != nil || len(out) != len(tc.out) {
			t.Fatalf("BroadcastShape(%v, %v) = %v, %v", tc.a, tc.b, out, err)
		}
		bc := NewBroadcast(out, tc.a, tc.b)
		if bc.NDim != tc.ndim {
			t.Errorf("%v,%v: ndim %d, want %d", tc.a, tc.b, bc.NDim, tc.ndim)
		}
		// Check every offset against a direct computation.
		n := bc.Len()
		idx := make([]int, len(out))
		for i := 0; i < n; i++ {
			rem := i
			for d := len(out) - 1; d >= 0; d-- {
				idx[d] = rem % out[d]
				rem /= out[d]
			}
			oa, ob := bc.Offsets(i)
			if wa := flatIndex(idx, tc.a); oa != wa {
				t.Fatalf("%v,%v elem %d: a offset %d, want %d", tc.a, tc.b, i, oa, wa)
			}
			if wb := flatIndex(idx, tc.b); ob != wb {
				t.Fatalf("%v,%v elem %d: b offset %d, want %d", tc.a, tc.b, i, ob, wb)
			}
		}
	}
	if _, err := BroadcastShape([]int{2, 3}, []int{4}); err == nil {
		t.Error("[2 3] and [4] broadcast")
	}
}

func flatIndex(idx, shape []int) int {
	off, stride := 0, 1
	for d := len(shape) - 1; d >= 0; d-- {
		k := idx[len(idx)-len(shape)+d]
		if shape[d] == 1 {
			k = 0
		}
		off += k * stride
		stride *= shape[d]
	}
	return off
}
