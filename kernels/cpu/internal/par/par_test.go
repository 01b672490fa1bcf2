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

// Threads is GOMAXPROCS less the cores Leave's holders keep free, at
// least one; the holders add up, and a release counts once.
func TestLeave(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(6))
	want := func(n int, when string) {
		t.Helper()
		if got := Threads(); got != n {
			t.Errorf("Threads %d %s, want %d", got, when, n)
		}
	}
	want(6, "with GOMAXPROCS 6 and no holder")
	a, b := Leave(1), Leave(2)
	want(3, "with 1 and 2 cores left of 6")
	a()
	a()
	want(4, "after one holder of 1 released (twice)")
	c := Leave(9)
	want(1, "with 11 cores left of 6")
	b()
	c()
	want(6, "after every holder released")
}
