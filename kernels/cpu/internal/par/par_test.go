package par

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Every part runs exactly once, whether the workers are awake, asleep
// (after Spin without work), busy with another Do, or the caller of Do is
// itself a part.
func TestDoRunsEveryPartOnce(t *testing.T) {
	check := func(what string, n int, do func(n int, f func(int))) {
		t.Helper()
		counts := make([]atomic.Int32, n)
		do(n, func(i int) { counts[i].Add(1) })
		for i := range counts {
			if c := counts[i].Load(); c != 1 {
				t.Errorf("%s: part %d of %d ran %d times", what, i, n, c)
			}
		}
	}
	for _, n := range []int{0, 1, 2, 3, 17} {
		check("awake", n, Do)
	}
	time.Sleep(3 * Spin) // the workers sleep
	check("asleep", 4, Do)
	check("nested", 5, func(n int, f func(int)) {
		Do(3, func(outer int) {
			if outer == 0 {
				Do(n, f)
			}
		})
	})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range 200 {
				check("concurrent", 2+g%3, Do)
			}
		})
	}
	wg.Wait()
}

// Do returns only after every part has: what the parts wrote is visible
// to the caller (the race detector checks the ordering).
func TestDoWaitsForTheParts(t *testing.T) {
	out := make([]int, 64)
	for round := range 100 {
		Do(len(out), func(i int) {
			spin := 0
			for range (i % 3) * 1000 { // parts of unequal length
				spin++
			}
			out[i] = round + i + spin - spin
		})
		for i, v := range out {
			if v != round+i {
				t.Fatalf("round %d: part %d wrote %d before Do returned, want %d", round, i, v, round+i)
			}
		}
	}
}

// Threads is GOMAXPROCS, or SetLimit's cap where lower; SetLimit returns
// the cap it replaces.
func TestThreadsLimit(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(6))
	defer SetLimit(SetLimit(0))
	for _, c := range []struct{ limit, want, prev int }{
		{0, 6, 0}, {4, 4, 0}, {9, 6, 4}, {-1, 6, 9}, {1, 1, 0},
	} {
		if prev := SetLimit(c.limit); prev != c.prev {
			t.Errorf("SetLimit(%d) returned %d, want %d", c.limit, prev, c.prev)
		}
		if got := Threads(); got != c.want {
			t.Errorf("with the cap at %d and GOMAXPROCS 6: Threads %d, want %d", c.limit, got, c.want)
		}
	}
}
