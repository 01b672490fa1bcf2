package cpu

import (
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/leangrad/leangrad/kernels"
)

// TestScratchIsBounded: the free lists reuse what they hold and never hold
// more than scratchLimit bytes, however much is given back.
func TestScratchIsBounded(t *testing.T) {
	scratch.Lock()
	scratch.free, scratch.bytes = [64][][]float32{}, 0 // what earlier tests left
	scratch.Unlock()
	a := getScratch(1000)
	if cap(a) != 1024 {
		t.Fatalf("cap %d, want the power of two 1024", cap(a))
	}
	putScratch(a)
	if b := getScratch(700); &b[:1][0] != &a[:1][0] {
		t.Error("a slice given back was not reused")
	} else {
		putScratch(b)
	}
	var big [][]float32
	for range 2 * scratchLimit / (4 << 20) {
		big = append(big, getScratch(1<<20))
	}
	for _, s := range big {
		putScratch(s)
	}
	scratch.Lock()
	held := scratch.bytes
	scratch.Unlock()
	if held > scratchLimit {
		t.Errorf("lists hold %d bytes, limit %d", held, scratchLimit)
	}
}

// LeaveCores keeps cores free of an operation's goroutines, its
// products' included, until released.
func TestLeaveCores(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	chunks := func() int {
		var n atomic.Int32
		parallel(1<<12, 1, func(lo, hi int) { n.Add(1) })
		return int(n.Load())
	}
	for _, c := range []struct{ leave, want int }{{0, 4}, {2, 2}, {3, 1}, {8, 1}} {
		release := LeaveCores(c.leave)
		if got := chunks(); got != c.want {
			t.Errorf("LeaveCores(%d), GOMAXPROCS 4: an operation ran in %d parts, want %d", c.leave, got, c.want)
		}
		if got := New().mm.Threads(); got != c.want {
			t.Errorf("LeaveCores(%d), GOMAXPROCS 4: products run on %d goroutines, want %d", c.leave, got, c.want)
		}
		release()
	}
	if got := chunks(); got != 4 {
		t.Errorf("after every release an operation ran in %d parts, want 4", got)
	}
}

// yielding covers [lo, hi) once, in order, in runs of at most run values.
func TestYielding(t *testing.T) {
	for _, c := range []struct{ lo, hi, run int }{{0, 0, 4}, {3, 4, 4}, {0, 8, 4}, {5, 18, 4}, {7, 1000, 1}, {0, 100, 1 << 16}} {
		var got [][2]int
		yielding(c.run, func(lo, hi int) { got = append(got, [2]int{lo, hi}) })(c.lo, c.hi)
		at := c.lo
		for _, r := range got {
			if r[0] != at || r[1] <= r[0] || r[1]-r[0] > c.run {
				t.Fatalf("yielding(%d) over [%d, %d): runs %v", c.run, c.lo, c.hi, got)
			}
			at = r[1]
		}
		if at != c.hi || (c.hi > c.lo) != (len(got) > 0) {
			t.Errorf("yielding(%d) over [%d, %d): runs %v, want [%d, %d) covered", c.run, c.lo, c.hi, got, c.lo, c.hi)
		}
	}
}

// TestStretchesLeaveNoGarbage: operations that work a stretch at a time
// through scratch (16-bit elementwise maps, the sums of micro-batches'
// parts, AdamW over 16-bit working weights) allocate next to nothing on
// the Go heap once warm, whatever the values' count: their stretches are
// scratch from the free lists, not arrays the compiler moves to the heap
// at every chunk.
func TestStretchesLeaveNoGarbage(t *testing.T) {
	const n = 1 << 22
	x, y := buf(t, kernels.BF16, n), buf(t, kernels.BF16, n)
	dst, sum := buf(t, kernels.F32, n), buf(t, kernels.F32, n)
	be.Fill(x, 0.5)
	be.Fill(sum, 0.25)
	for _, op := range []struct {
		name string
		run  func()
	}{
		{"GELU over BF16", func() { be.Unary(kernels.GELU, y, x) }},
		{"SumPart of a BF16 part", func() { be.SumPart(dst, sum, x) }},
	} {
		op.run() // warm: the free lists fill
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		for range 3 {
			op.run()
		}
		runtime.ReadMemStats(&ms)
		if got := (ms.TotalAlloc - before) / 3; got > 64<<10 {
			t.Errorf("%s over %d values: %d bytes allocated on the Go heap a call (%.3f a value), want next to nothing", op.name, n, got, float64(got)/n)
		}
	}
}
