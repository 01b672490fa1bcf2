package nn

import (
	"slices"
	"testing"
)

// TestSegmentSpans: the segments each checkpoint mode cuts, and that the
// balanced cut of a CIFAR ResNet costs less (keep·the largest segment +
// the segments' inputs) than ⌈√n⌉ blocks a segment.
func TestSegmentSpans(t *testing.T) {
	uniform := func(n int) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = 1
		}
		return out
	}
	for _, tc := range []struct {
		name string
		mode CheckpointMode
		n    int
		in   int64
		out  []int64
		want [][2]int
	}{
		{"none", NoCheckpoint, 3, 0, nil, [][2]int{{0, 3}}},
		{"blocks", CheckpointBlocks, 3, 0, nil, [][2]int{{0, 1}, {1, 2}, {2, 3}}},
		{"sqrt without sizes", CheckpointSqrt, 10, 0, nil, [][2]int{{0, 4}, {4, 8}, {8, 10}}},
		// Segment k costs 2.5·its size + the inputs of segments 1 to k:
		// 1 + 7.5, 2 + 5, 3 + 5, 4 + 5, 5 + 2.5, 6 + 2.5: at most 9, where
		// four segments of three (8.5, 9.5, 10.5, 9) reach 10.5.
		{"sqrt, one size", CheckpointSqrt, 11, 1, uniform(11), [][2]int{{0, 3}, {3, 5}, {5, 7}, {7, 9}, {9, 10}, {10, 11}}},
		// 1 + 2.5·8 = 21 alone; the rest fit after it: 9 + 7.5.
		{"sqrt, a large first module alone", CheckpointSqrt, 4, 1, []int64{8, 1, 1, 1}, [][2]int{{0, 1}, {1, 4}}},
		{"nothing", CheckpointSqrt, 0, 0, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := segmentSpans(tc.mode, tc.n, tc.in, tc.out); !slices.Equal(got, tc.want) {
				t.Errorf("segmentSpans = %v, want %v", got, tc.want)
			}
		})
	}

	for _, tc := range []struct {
		name         string
		mode         CheckpointMode
		first, n     int
		want         [][2]int
		checkpointed int
	}{
		{"none", NoCheckpoint, 0, 3, [][2]int{{0, 3}}, 0},
		{"every block", CheckpointBlocks, 0, 3, [][2]int{{0, 1}, {1, 2}, {2, 3}}, 3},
		{"the first two", CheckpointBlocks, 2, 5, [][2]int{{0, 1}, {1, 2}, {2, 5}}, 2},
		{"the first, of two", CheckpointBlocks, 1, 2, [][2]int{{0, 1}, {1, 2}}, 1},
		{"all of them by number", CheckpointBlocks, 3, 3, [][2]int{{0, 1}, {1, 2}, {2, 3}}, 3},
		{"sqrt ignores first", CheckpointSqrt, 2, 10, [][2]int{{0, 4}, {4, 8}, {8, 10}}, 3},
	} {
		t.Run("checkpointSpans "+tc.name, func(t *testing.T) {
			got, ck := checkpointSpans(tc.mode, tc.first, tc.n, 0, nil)
			if !slices.Equal(got, tc.want) || ck != tc.checkpointed {
				t.Errorf("checkpointSpans = %v, %d checkpointed; want %v, %d", got, ck, tc.want, tc.checkpointed)
			}
		})
	}

	// ResNet-1202 on 28×28 images: 200 blocks a stage of 16·28², 32·14²,
	// 64·7² values. The balanced cut's peak by the Note's count is near
	// half of ⌈√n⌉ blocks a segment's.
	var out []int64
	for _, size := range []int64{16 * 28 * 28, 32 * 14 * 14, 64 * 7 * 7} {
		for range 200 {
			out = append(out, size)
		}
	}
	in := out[0]
	peak := func(spans [][2]int) float64 {
		var largest, inputs float64
		for _, sp := range spans {
			var sum float64
			for _, o := range out[sp[0]:sp[1]] {
				sum += float64(o)
			}
			if sp[0] == 0 {
				inputs += float64(in)
			} else {
				inputs += float64(out[sp[0]-1])
			}
			largest = max(largest, keepPerBlock*sum+inputs)
		}
		return largest
	}
	balanced, sqrt := segmentSpans(CheckpointSqrt, len(out), in, out), segmentSpans(CheckpointSqrt, len(out), in, nil)
	if len(balanced) != 61 || peak(balanced) >= 0.55*peak(sqrt) {
		t.Errorf("ResNet-1202: the balanced cut's %d segments peak at %.0f, ⌈√n⌉ blocks a segment's %d at %.0f", len(balanced), peak(balanced), len(sqrt), peak(sqrt))
	}
}
