package cuda

import (
	"slices"
	"testing"
)

// TestRankAlgos: several searches' results merge into each algorithm's
// median time, fastest first; an algorithm that failed or was missing in
// any round is left out.
func TestRankAlgos(t *testing.T) {
	ok := func(algo, math int32, ms float32) algoPerf {
		return algoPerf{algo: algo, mathType: math, time: ms, status: cudnnStatusSuccess}
	}
	failed := func(algo, math int32) algoPerf { return algoPerf{algo: algo, mathType: math, status: 3} }
	type am struct{ algo, math int32 }
	for _, tc := range []struct {
		name   string
		rounds [][]algoPerf
		want   []am
		times  []float32
	}{
		{"none", nil, nil, nil},
		{"one round keeps cuDNN's order", [][]algoPerf{{ok(1, 1, 0.5), ok(0, 1, 0.7), failed(2, 1)}}, []am{{1, 1}, {0, 1}}, []float32{0.5, 0.7}},
		{"an outlier round does not reorder", [][]algoPerf{
			{ok(1, 1, 0.9), ok(0, 1, 0.6)}, // algorithm 1 timed slow once
			{ok(1, 1, 0.4), ok(0, 1, 0.6)},
			{ok(0, 1, 0.6), ok(1, 1, 0.5)},
		}, []am{{1, 1}, {0, 1}}, []float32{0.5, 0.6}},
		{"math types apart", [][]algoPerf{
			{ok(1, 1, 0.3), ok(1, 3, 0.8)},
			{ok(1, 3, 0.7), ok(1, 1, 0.4)},
			{ok(1, 1, 0.2), ok(1, 3, 0.9)},
		}, []am{{1, 1}, {1, 3}}, []float32{0.3, 0.8}},
		{"failed or missing once: out", [][]algoPerf{
			{ok(1, 1, 0.3), ok(2, 1, 0.4), ok(3, 1, 0.5)},
			{ok(1, 1, 0.3), failed(2, 1), ok(3, 1, 0.5)},
			{ok(1, 1, 0.3), ok(2, 1, 0.4)},
		}, []am{{1, 1}}, []float32{0.3}},
		{"ties keep the first round's order", [][]algoPerf{
			{ok(5, 1, 0.5), ok(4, 1, 0.5)},
			{ok(4, 1, 0.5), ok(5, 1, 0.5)},
		}, []am{{5, 1}, {4, 1}}, []float32{0.5, 0.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := rankAlgos(tc.rounds)
			var algos []am
			var times []float32
			for _, pr := range got {
				algos = append(algos, am{pr.algo, pr.mathType})
				times = append(times, pr.time)
			}
			if !slices.Equal(algos, tc.want) || !slices.Equal(times, tc.times) {
				t.Errorf("ranked %v at %v ms, want %v at %v", algos, times, tc.want, tc.times)
			}
		})
	}
}
