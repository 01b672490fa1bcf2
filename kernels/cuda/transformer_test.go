package cuda

import "testing"

// TestClsChunkRows: the classifier's chunks are as few as the rows allowed
// permit, even, multiples of 64 where they are not all the rows, and never
// more rows than allowed.
func TestClsChunkRows(t *testing.T) {
	for _, c := range []struct{ n, most, want int }{
		{16384, 5312, 4096}, // GPT-2 small at batch 16: not 3×5312 + 448
		{16384, 16384, 16384},
		{16384, 100000, 16384},
		{1000, 37, 37}, // small chunks stay as they are
		{1000, 64, 64},
		{1000, 130, 128}, // 8 chunks of 125 rounded up to 128
		{700, 500, 384},  // 448 allowed, 2 chunks of 350 → 384
		{129, 128, 128},  // 2 chunks of 65 → 128: the second has 1 row
		{1, 1, 1},
	} {
		got := clsChunkRows(c.n, c.most)
		if got != c.want {
			t.Errorf("clsChunkRows(%d, %d) = %d, want %d", c.n, c.most, got, c.want)
		}
		if got > max(1, c.most) {
			t.Errorf("clsChunkRows(%d, %d) = %d: more than allowed", c.n, c.most, got)
		}
	}
}
