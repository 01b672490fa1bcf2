// Package race says whether the race detector is on, so that tests whose
// work is long and has no concurrency of its own (a training run checked
// for its accuracy, a numeric check over many sizes, decompressing a
// dataset) can leave the detector's run of the suite, which slows such
// work ten to twenty times, to a run without it (CI's, .ci/run).
package race

import "testing"

// Skip skips t when the race detector is on, saying which command runs it
// without: the test must have nothing for the detector to find that the
// suite's other tests do not exercise.
func Skip(t testing.TB, without string) {
	t.Helper()
	if Enabled {
		t.Skipf("long work without concurrency of its own: run without the race detector (%s)", without)
	}
}
