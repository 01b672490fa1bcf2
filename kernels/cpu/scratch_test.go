package cpu

import "testing"

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
