package memory

import (
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

const (
	KiB = int64(1) << 10
	MiB = int64(1) << 20
	GiB = int64(1) << 30
)

func mustAlloc(t *testing.T, a *Allocator, size int64) *Block {
	t.Helper()
	b, err := a.Alloc(size, 0)
	if err != nil {
		t.Fatalf("Alloc(%d): %v", size, err)
	}
	return b
}

func TestRoundSize(t *testing.T) {
	for _, tc := range []struct{ in, want int64 }{
		{0, 512}, {1, 512}, {511, 512}, {512, 512}, {513, 1024}, {1000, 1024},
		{MiB, MiB}, {MiB + 1, MiB + 512}, {10*MiB - 1, 10 * MiB},
	} {
		if got := RoundSize(tc.in); got != tc.want {
			t.Errorf("RoundSize(%d) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestPoolChoiceAndSegmentSize(t *testing.T) {
	for _, tc := range []struct {
		size     int64
		pool     PoolKind
		segment  int64
		blockLen int64
	}{
		{1, Small, SmallBuffer, 512},
		{4 * KiB, Small, SmallBuffer, 4 * KiB},
		{MiB, Small, SmallBuffer, MiB},
		{MiB + 1, Large, LargeBuffer, MiB + 512},
		{5 * MiB, Large, LargeBuffer, 5 * MiB},
		{10*MiB - 512, Large, LargeBuffer, 10*MiB - 512},
		{10 * MiB, Large, 10 * MiB, 10 * MiB},
		{11*MiB + 3, Large, 12 * MiB, 12 * MiB}, // the 1 MiB - 512 rest is too small to split off
		{100 * MiB, Large, 100 * MiB, 100 * MiB},
	} {
		t.Run(fmt.Sprint(tc.size), func(t *testing.T) {
			src := newAddrSource()
			a := New(src, Config{})
			b := mustAlloc(t, a, tc.size)
			if b.Pool() != tc.pool {
				t.Errorf("pool = %v, want %v", b.Pool(), tc.pool)
			}
			if b.Size() != tc.blockLen {
				t.Errorf("block size = %d, want %d", b.Size(), tc.blockLen)
			}
			if got := src.liveBytes(); got != tc.segment {
				t.Errorf("segment size = %d, want %d", got, tc.segment)
			}
			s := a.Stats()
			if s.Reserved[tc.pool].Current != tc.segment || s.Reserved[All].Current != tc.segment {
				t.Errorf("reserved = %+v, want %d in pool %v", s.Reserved, tc.segment, tc.pool)
			}
			if s.Requested[All].Current != tc.size {
				t.Errorf("requested = %d, want %d", s.Requested[All].Current, tc.size)
			}
		})
	}
}

func TestSplitAndCoalesce(t *testing.T) {
	src := newAddrSource()
	a := New(src, Config{})
	x := mustAlloc(t, a, 1000) // 1024
	y := mustAlloc(t, a, 4096) // 4096
	z := mustAlloc(t, a, 100)  // 512
	if y.Addr() != x.Addr()+1024 || z.Addr() != y.Addr()+4096 {
		t.Fatalf("blocks not carved in order from one segment: %#x %#x %#x", x.Addr(), y.Addr(), z.Addr())
	}
	if n := a.Stats().Segments[All].Current; n != 1 {
		t.Fatalf("segments = %d, want 1", n)
	}
	// Free the middle one: it stays separate (its neighbours are allocated).
	a.Free(y)
	s := a.Stats()
	if s.InactiveSplitBlocks[All].Current != 2 { // the freed middle block and the segment's tail
		t.Errorf("inactive split blocks = %d, want 2", s.InactiveSplitBlocks[All].Current)
	}
	// A request that fits the hole takes it (best fit: the 4 KiB hole, not the tail).
	w := mustAlloc(t, a, 3000)
	if w.Addr() != y.Addr() {
		t.Errorf("best fit took %#x, want the 4 KiB hole at %#x", w.Addr(), y.Addr())
	}
	if w.Size() != 3072 {
		t.Errorf("split block size = %d, want 3072", w.Size())
	}
	a.Free(w)
	a.Free(x) // x, the freed hole and ... coalesce: x+hole is one free block
	a.Free(z) // now the whole segment is one free block
	s = a.Stats()
	if s.InactiveSplit[All].Current != 0 || s.InactiveSplitBlocks[All].Current != 0 {
		t.Errorf("after freeing everything, inactive split = %d bytes / %d blocks, want 0",
			s.InactiveSplit[All].Current, s.InactiveSplitBlocks[All].Current)
	}
	if len(a.small.free) != 1 || a.small.free[0].Size() != SmallBuffer {
		t.Fatalf("free list = %d blocks, want one whole 2 MiB segment", len(a.small.free))
	}
	// The coalesced segment serves a request of its full size.
	full := mustAlloc(t, a, SmallSize)
	if full.Addr() != x.Addr() {
		t.Errorf("full-size request at %#x, want segment start %#x", full.Addr(), x.Addr())
	}
	if n := a.Stats().Segments[All].Current; n != 1 {
		t.Errorf("segments = %d, want 1 (reused)", n)
	}
}

func TestLargePoolSplitThreshold(t *testing.T) {
	a := New(newAddrSource(), Config{})
	b := mustAlloc(t, a, 20*MiB) // a segment of its own
	if b.Size() != 20*MiB {
		t.Fatalf("size = %d", b.Size())
	}
	a.Free(b)
	// A 19 MiB request would leave exactly 1 MiB, which is not worth a large-pool
	// split (the rest must exceed 1 MiB): the whole cached block is handed out.
	c := mustAlloc(t, a, 19*MiB)
	if c.Size() != 20*MiB || c.Addr() != b.Addr() {
		t.Errorf("got block of %d at %#x, want the unsplit cached block", c.Size(), c.Addr())
	}
	a.Free(c)
	// A 2 MiB request leaves more than 1 MiB: split.
	d := mustAlloc(t, a, 2*MiB)
	if d.Size() != 2*MiB {
		t.Errorf("split block = %d, want %d", d.Size(), 2*MiB)
	}
}

func TestStreamsDoNotShareBlocks(t *testing.T) {
	a := New(newAddrSource(), Config{})
	b, _ := a.Alloc(4096, 1)
	a.Free(b)
	c, _ := a.Alloc(4096, 2)
	if c.Addr() == b.Addr() || c.Stream() != 2 {
		t.Errorf("block freed on stream 1 was handed to stream 2")
	}
	if n := a.Stats().Segments[All].Current; n != 2 {
		t.Errorf("segments = %d, want 2 (one per stream)", n)
	}
	d, _ := a.Alloc(4096, 1)
	if d.Addr() != b.Addr() {
		t.Errorf("stream 1 did not reuse its cached block")
	}
}

func TestEmptyCache(t *testing.T) {
	src := newAddrSource()
	a := New(src, Config{})
	keep := mustAlloc(t, a, 4096)  // pins a small segment
	tmp := mustAlloc(t, a, 8192)   // same segment
	big := mustAlloc(t, a, 30*MiB) // its own large segment
	mid := mustAlloc(t, a, 3*MiB)  // a 20 MiB large segment
	a.Free(tmp)
	a.Free(big)
	a.Free(mid)
	if got, want := src.liveBytes(), SmallBuffer+30*MiB+LargeBuffer; got != want {
		t.Fatalf("source holds %d, want %d before EmptyCache", got, want)
	}
	a.EmptyCache()
	if got := src.liveBytes(); got != SmallBuffer {
		t.Errorf("after EmptyCache the source holds %d bytes, want only the pinned small segment (%d)", got, SmallBuffer)
	}
	s := a.Stats()
	if s.Reserved[All].Current != SmallBuffer || s.Segments[All].Current != 1 {
		t.Errorf("reserved = %d in %d segments, want %d in 1", s.Reserved[All].Current, s.Segments[All].Current, SmallBuffer)
	}
	if s.Reserved[All].Freed != 30*MiB+LargeBuffer {
		t.Errorf("reserved freed = %d", s.Reserved[All].Freed)
	}
	a.Free(keep)
	a.EmptyCache()
	if got := src.liveBytes(); got != 0 {
		t.Errorf("after freeing everything and EmptyCache the source holds %d bytes", got)
	}
}

func TestMemoryFractionCap(t *testing.T) {
	src := Limit(newAddrSource(), 100*MiB)
	a := New(src, Config{Device: "test:0"})
	if err := a.SetMemoryFraction(1.5); err == nil {
		t.Error("fraction 1.5 accepted")
	}
	if err := a.SetMemoryFraction(0.5); err != nil {
		t.Fatal(err)
	}
	b := mustAlloc(t, a, 40*MiB)
	_, err := a.Alloc(20*MiB, 0) // 40+20 > 50
	var oom *OOMError
	if !errors.As(err, &oom) || !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("Alloc over the cap: err = %v, want an *OOMError", err)
	}
	if oom.Limit != 50*MiB {
		t.Errorf("limit in error = %d, want %d", oom.Limit, 50*MiB)
	}
	if !strings.Contains(err.Error(), "at most 50.00 MiB (its memory cap)") {
		t.Errorf("error text does not name the cap: %q", err)
	}
	a.Free(b)
	if err := a.SetMemoryFraction(0); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Alloc(60*MiB, 0); err != nil {
		t.Errorf("after removing the cap: %v", err)
	}
}

func TestOOMRetryThenError(t *testing.T) {
	src := Limit(newAddrSource(), 64*MiB)
	a := New(src, Config{Device: "test:0"})
	// Fill the cache with free segments: 20 + 20 MiB large segments, all freed.
	b1 := mustAlloc(t, a, 5*MiB)
	b2 := mustAlloc(t, a, 19*MiB)
	b3 := mustAlloc(t, a, 6*MiB)
	a.Free(b1)
	a.Free(b2)
	a.Free(b3)
	if r := a.Stats().Reserved[All].Current; r != 40*MiB {
		t.Fatalf("cached %d bytes, want two 20 MiB segments", r)
	}
	// 40 MiB does not fit next to the cached segments, but does once they are released.
	big := mustAlloc(t, a, 40*MiB)
	s := a.Stats()
	if s.NumAllocRetries != 1 {
		t.Errorf("retries = %d, want 1", s.NumAllocRetries)
	}
	if s.NumOOMs != 0 {
		t.Errorf("ooms = %d, want 0", s.NumOOMs)
	}
	if s.Reserved[All].Current != 40*MiB {
		t.Errorf("reserved = %d, want only the new 40 MiB segment", s.Reserved[All].Current)
	}
	// Now a request that cannot fit even after a flush.
	small := mustAlloc(t, a, 3000) // a 2 MiB small segment; 22 MiB free in the source
	_, err := a.Alloc(30*MiB, 0)
	var oom *OOMError
	if !errors.As(err, &oom) {
		t.Fatalf("err = %v, want *OOMError", err)
	}
	s = a.Stats()
	if s.NumOOMs != 1 || s.NumAllocRetries != 2 {
		t.Errorf("ooms = %d, retries = %d; want 1 and 2", s.NumOOMs, s.NumAllocRetries)
	}
	if oom.Requested != 30*MiB || oom.Capacity != 64*MiB || oom.Free != 22*MiB ||
		oom.Allocated != 40*MiB+3072 || oom.Reserved != 42*MiB {
		t.Errorf("oom fields = %+v", oom)
	}
	want := []string{
		"test:0 out of memory", "Tried to allocate 30.00 MiB", "total capacity of 64.00 MiB",
		"of which 22.00 MiB is free", "40.00 MiB is allocated by leangrad",
		"2.00 MiB is reserved by leangrad but unallocated",
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error text lacks %q:\n%s", w, err)
		}
	}
	// The failure left the allocator consistent: the earlier blocks still free normally.
	a.Free(small)
	a.Free(big)
	a.EmptyCache()
	if allocs, frees := src.Counts(); allocs != frees {
		t.Errorf("source allocs %d != frees %d after EmptyCache", allocs, frees)
	}
}

func TestResetPeak(t *testing.T) {
	a := New(newAddrSource(), Config{})
	b := mustAlloc(t, a, 4*MiB)
	c := mustAlloc(t, a, 1024)
	a.Free(b)
	s := a.Stats()
	if s.Allocated[All].Peak != 4*MiB+1024 || s.Allocated[All].Current != 1024 {
		t.Fatalf("allocated = %+v", s.Allocated[All])
	}
	a.ResetPeak()
	s = a.Stats()
	if s.Allocated[All].Peak != 1024 || s.Allocated[Large].Peak != 0 {
		t.Errorf("after ResetPeak: %+v", s.Allocated)
	}
	if s.Reserved[All].Peak != s.Reserved[All].Current {
		t.Errorf("reserved peak %d != current %d", s.Reserved[All].Peak, s.Reserved[All].Current)
	}
	a.Free(c)
}

func TestFreeTwicePanics(t *testing.T) {
	a := New(newAddrSource(), Config{})
	b := mustAlloc(t, a, 10)
	a.Free(b)
	defer func() {
		if r := recover(); r == nil {
			t.Error("second Free did not panic")
		}
	}()
	a.Free(b)
}

// checkInvariants asserts what must hold of any Stats snapshot.
func checkInvariants(t *testing.T, s Stats) {
	t.Helper()
	for k := All; k <= Large; k++ {
		if s.Allocated[k].Current > s.Reserved[k].Current {
			t.Fatalf("pool %d: allocated %d > reserved %d", k, s.Allocated[k].Current, s.Reserved[k].Current)
		}
		if s.Allocated[k].Current > s.Active[k].Current || s.Active[k].Current > s.Reserved[k].Current {
			t.Fatalf("pool %d: want allocated <= active <= reserved, got %d %d %d", k,
				s.Allocated[k].Current, s.Active[k].Current, s.Reserved[k].Current)
		}
		if s.Requested[k].Current > s.Allocated[k].Current {
			t.Fatalf("pool %d: requested %d > allocated %d", k, s.Requested[k].Current, s.Allocated[k].Current)
		}
		if s.Allocated[k].Current+s.InactiveSplit[k].Current > s.Reserved[k].Current {
			t.Fatalf("pool %d: allocated + inactive split > reserved", k)
		}
		for _, st := range []Stat{s.Allocated[k], s.Active[k], s.Requested[k], s.Reserved[k], s.Allocations[k],
			s.Segments[k], s.InactiveSplit[k], s.InactiveSplitBlocks[k]} {
			if st.Peak < st.Current || st.Current < 0 {
				t.Fatalf("pool %d: stat %+v: peak < current or negative", k, st)
			}
			if st.Allocated-st.Freed != st.Current {
				t.Fatalf("pool %d: stat %+v: totals do not balance", k, st)
			}
		}
	}
	for _, arr := range []StatArray{s.Allocated, s.Reserved, s.Requested, s.Allocations, s.Segments} {
		if arr[All].Current != arr[Small].Current+arr[Large].Current {
			t.Fatalf("all-pools row %d != small %d + large %d", arr[All].Current, arr[Small].Current, arr[Large].Current)
		}
	}
}

// TestRandomized mixes thousands of allocations and frees of every size class
// against a model of the expected bytes, with occasional cache flushes.
func TestRandomized(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			src := newAddrSource()
			a := New(src, Config{})
			type alloc struct{ requested, size int64 }
			live := map[*Block]alloc{}
			var wantAlloc, wantReq, peak int64
			sizes := func() int64 {
				switch rng.IntN(10) {
				case 0:
					return rng.Int64N(40*MiB) + 1
				case 1, 2:
					return rng.Int64N(9*MiB) + MiB
				default:
					return rng.Int64N(MiB) + 1
				}
			}
			for i := 0; i < 5000; i++ {
				switch r := rng.IntN(100); {
				case r < 55 || len(live) == 0:
					n := sizes()
					b := mustAlloc(t, a, n)
					// A small block is exactly the rounded size; a large one may keep an
					// unsplit rest of at most SmallSize.
					extra := b.Size() - RoundSize(n)
					if extra < 0 || b.Pool() == Small && extra != 0 || extra > SmallSize {
						t.Fatalf("Alloc(%d) gave a %d-byte block", n, b.Size())
					}
					for o := range live {
						if b.Addr() < o.Addr()+uintptr(o.Size()) && o.Addr() < b.Addr()+uintptr(b.Size()) {
							t.Fatalf("block %#x+%d overlaps live block %#x+%d", b.Addr(), b.Size(), o.Addr(), o.Size())
						}
					}
					live[b] = alloc{n, b.Size()}
					wantAlloc += b.Size()
					wantReq += n
					peak = max(peak, wantAlloc)
				case r < 98:
					for b, l := range live {
						a.Free(b)
						delete(live, b)
						wantAlloc -= l.size
						wantReq -= l.requested
						break
					}
				default:
					a.EmptyCache()
					if got, want := src.liveBytes(), a.Stats().Reserved[All].Current; got != want {
						t.Fatalf("source holds %d, reserved says %d", got, want)
					}
				}
				s := a.Stats()
				checkInvariants(t, s)
				if s.Allocated[All].Current != wantAlloc || s.Requested[All].Current != wantReq {
					t.Fatalf("step %d: allocated %d requested %d, model says %d %d", i,
						s.Allocated[All].Current, s.Requested[All].Current, wantAlloc, wantReq)
				}
				if s.Allocations[All].Current != int64(len(live)) {
					t.Fatalf("step %d: %d allocations, model has %d", i, s.Allocations[All].Current, len(live))
				}
				if s.Allocated[All].Peak != peak {
					t.Fatalf("step %d: peak %d, model says %d", i, s.Allocated[All].Peak, peak)
				}
			}
			for b := range live {
				a.Free(b)
			}
			a.EmptyCache()
			s := a.Stats()
			checkInvariants(t, s)
			if s.Reserved[All].Current != 0 || src.liveBytes() != 0 || s.Allocations[All].Allocated != s.Allocations[All].Freed {
				t.Errorf("after freeing all and EmptyCache: reserved %d, source %d, allocs %d/%d",
					s.Reserved[All].Current, src.liveBytes(), s.Allocations[All].Allocated, s.Allocations[All].Freed)
			}
		})
	}
}

// TestConcurrent hammers one allocator from many goroutines; run with -race.
func TestConcurrent(t *testing.T) {
	src := newAddrSource()
	a := New(src, Config{})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			var mine []*Block
			for i := 0; i < 2000; i++ {
				if len(mine) > 0 && rng.IntN(2) == 0 {
					j := rng.IntN(len(mine))
					a.Free(mine[j])
					mine = append(mine[:j], mine[j+1:]...)
					continue
				}
				b, err := a.Alloc(rng.Int64N(3*MiB)+1, Stream(g%2))
				if err != nil {
					t.Error(err)
					return
				}
				mine = append(mine, b)
				if i%500 == 0 {
					a.EmptyCache()
				}
			}
			for _, b := range mine {
				a.Free(b)
			}
		}(g)
	}
	wg.Wait()
	s := a.Stats()
	checkInvariants(t, s)
	if s.Allocated[All].Current != 0 {
		t.Errorf("allocated = %d after all goroutines freed everything", s.Allocated[All].Current)
	}
}

func TestHeapSourceBlocksAreUsable(t *testing.T) {
	a := New(NewHeapSource(), Config{Device: "cpu"})
	b := mustAlloc(t, a, 1000)
	c := mustAlloc(t, a, 3000)
	bb, cb := b.Bytes(), c.Bytes()
	if len(bb) != 1000 || len(cb) != 3000 {
		t.Fatalf("Bytes lengths %d %d", len(bb), len(cb))
	}
	for i := range bb {
		bb[i] = 0xAB
	}
	for i := range cb {
		if cb[i] != 0 {
			t.Fatalf("writing one block changed its neighbour at %d", i)
		}
	}
	a.Free(b)
	a.Free(c)
	a.EmptyCache()
	if free, total := a.Source().MemInfo(); free != total {
		t.Errorf("heap source: %d of %d free after EmptyCache", free, total)
	}
}

func TestSummaryLayout(t *testing.T) {
	a := New(newAddrSource(), Config{Device: "cuda:0"})
	b := mustAlloc(t, a, 3*MiB)
	c := mustAlloc(t, a, 1000)
	a.Free(b)
	out := a.Summary()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for i, l := range lines {
		if len(l) != 77 || l[0] != '|' || l[76] != '|' {
			t.Errorf("line %d is not a 77-column table row: %q", i, l)
		}
	}
	for _, want := range []string{
		"leangrad memory summary, device cuda:0",
		"| Allocated memory      |   1024 B   |   3073 KiB |   3073 KiB |   3072 KiB |",
		"|       from large pool |      0 B   |   3072 KiB |   3072 KiB |   3072 KiB |",
		"| Reserved memory       |  22528 KiB |  22528 KiB |  22528 KiB |      0 B   |",
		"| Allocations           |       1    |       2    |       2    |       1    |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	a.Free(c)
}

func TestTimelineCSV(t *testing.T) {
	a := New(newAddrSource(), Config{})
	b := mustAlloc(t, a, 100) // not recorded
	a.RecordTimeline(true)
	a.Mark("step 1")
	c := mustAlloc(t, a, 3*MiB)
	a.Free(c)
	a.EmptyCache()
	a.RecordTimeline(false)
	a.Free(b) // not recorded
	ev := a.Timeline()
	kinds := []EventKind{EventMark, EventSegmentAlloc, EventAlloc, EventFree, EventSegmentFree}
	if len(ev) != len(kinds) {
		t.Fatalf("events = %+v", ev)
	}
	for i, k := range kinds {
		if ev[i].Kind != k {
			t.Errorf("event %d = %v, want %v", i, ev[i].Kind, k)
		}
	}
	if ev[2].Allocated != 512+3*MiB || ev[2].Reserved != SmallBuffer+LargeBuffer {
		t.Errorf("alloc event = %+v", ev[2])
	}
	var buf bytes.Buffer
	if err := WriteTimelineCSV(&buf, ev); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 6 || strings.Join(recs[0], ",") != "time_s,event,size,allocated,reserved,label" || recs[1][5] != "step 1" {
		t.Errorf("csv = %v", recs)
	}
}

func TestWindowPeak(t *testing.T) {
	a := New(newAddrSource(), Config{})
	b := mustAlloc(t, a, 3*MiB)
	a.Free(b)
	if al, res := a.WindowPeak(); al != 3*MiB || res != LargeBuffer {
		t.Errorf("first window: %d %d", al, res)
	}
	c := mustAlloc(t, a, MiB)
	if al, _ := a.WindowPeak(); al != MiB {
		t.Errorf("second window peak %d, want %d", al, MiB)
	}
	if al, res := a.WindowPeak(); al != MiB || res != LargeBuffer+SmallBuffer {
		t.Errorf("an idle window starts at the current values: %d %d", al, res)
	}
	if p := a.Stats().Allocated[All].Peak; p != 3*MiB {
		t.Errorf("WindowPeak disturbed the Stats peak: %d", p)
	}
	a.Free(c)
}

func TestFaultySource(t *testing.T) {
	for _, tc := range []struct {
		name   string
		f      Faults
		failed []int // the failing calls, from 1, among the first 12
	}{
		{"every 4", Faults{Every: 4}, []int{4, 8, 12}},
		{"every 5, bursts of 3", Faults{Every: 5, Burst: 3}, []int{5, 6, 7, 10, 11, 12}},
		{"every 3, at most 2", Faults{Every: 3, Max: 2}, []int{3, 6}},
		{"never", Faults{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Inject(NewHeapSource(), tc.f)
			var failed []int
			for i := 1; i <= 12; i++ {
				seg, err := s.Alloc(64)
				if err != nil {
					if !errors.Is(err, ErrOutOfMemory) {
						t.Fatalf("call %d: %v does not wrap ErrOutOfMemory", i, err)
					}
					failed = append(failed, i)
					continue
				}
				s.Free(seg)
			}
			if !slices.Equal(failed, tc.failed) {
				t.Errorf("failed calls %v, want %v", failed, tc.failed)
			}
		})
	}
	// Random faults are the seed's: the same seed fails the same calls.
	pattern := func(seed uint64) []bool {
		s := Inject(NewHeapSource(), Faults{Probability: 0.3, Seed: seed})
		out := make([]bool, 200)
		for i := range out {
			_, err := s.Alloc(8)
			out[i] = err != nil
		}
		return out
	}
	a, b, c := pattern(7), pattern(7), pattern(8)
	n := 0
	for _, f := range a {
		if f {
			n++
		}
	}
	if !slices.Equal(a, b) || slices.Equal(a, c) || n < 30 || n > 90 {
		t.Errorf("random faults: %d of 200 failed; same seed equal %v, other seed equal %v", n, slices.Equal(a, b), slices.Equal(a, c))
	}
}

// A burst of three failed calls gets past the allocator's flush-and-retry
// and reaches the caller as an *OOMError; the allocator is then as before.
func TestInjectedFaultReachesTheCaller(t *testing.T) {
	src := Inject(NewHeapSource(), Faults{Every: 2, Burst: 3, Max: 1})
	a := New(src, Config{Device: "test"})
	b1, err := a.Alloc(4<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Alloc(30<<20, 0)
	var oom *OOMError
	if !errors.As(err, &oom) || !strings.Contains(err.Error(), "injected fault 1") {
		t.Fatalf("err = %v, want an *OOMError of the injected fault", err)
	}
	if st := a.Stats(); st.Allocated[All].Current != RoundSize(4<<20) || st.NumOOMs != 1 {
		t.Errorf("after the fault: allocated %d, %d OOMs", st.Allocated[All].Current, st.NumOOMs)
	}
	b2, err := a.Alloc(30<<20, 0)
	if err != nil {
		t.Fatalf("after the burst: %v", err)
	}
	a.Free(b1)
	a.Free(b2)
}

// downSource is addrSource handing out ever lower addresses.
type downSource struct{ addrSource }

func (s *downSource) Alloc(size int64) (Segment, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next -= uintptr(size) + 4096
	s.live[s.next] = size
	return Segment{Addr: s.next, Size: size}, nil
}

// TestBestFitIgnoresAddresses: among free blocks of one size the pool takes
// the one of the segment obtained first, whatever the source's addresses
// (the Go heap's move with the garbage collector's timing), so a run's
// layout and what fits under a cap are the same every run.
func TestBestFitIgnoresAddresses(t *testing.T) {
	for _, c := range []struct {
		name string
		src  Source
	}{{"rising", newAddrSource()}, {"falling", &downSource{addrSource{next: 1 << 40, live: map[uintptr]int64{}}}}} {
		t.Run(c.name, func(t *testing.T) {
			a := New(c.src, Config{})
			first, second := mustAlloc(t, a, 12*MiB), mustAlloc(t, a, 12*MiB) // a segment each
			want := first.seg
			a.Free(second)
			a.Free(first)
			got := mustAlloc(t, a, 12*MiB)
			if got.seg != want {
				t.Errorf("took the block at %#x, of the segment obtained second; want the first's, at %#x", got.Addr(), want.Addr)
			}
			a.Free(got)
		})
	}
}

// TestBudgetParsesSizesAndFractionsWithoutWrapping: sizes in every unit,
// fractions of the device, and refusals that name what is wrong: too
// small, an unknown unit, and sizes past what an int64 holds (1e20GiB once
// wrapped to a budget that bound nothing).
func TestBudgetParsesSizesAndFractionsWithoutWrapping(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Budget
	}{{"200MiB", Budget{Bytes: 200 << 20}}, {"1.5GiB", Budget{Bytes: 3 << 29}}, {"500MB", Budget{Bytes: 5e8}}, {"0.5", Budget{Fraction: 0.5}},
		{"1", Budget{Fraction: 1}}, {"2097152", Budget{Bytes: 2 << 20}}, {"8EiB", Budget{}}} {
		var b Budget
		err := b.Set(c.in)
		if c.want == (Budget{}) {
			if err == nil {
				t.Errorf("%q: accepted as %+v", c.in, b)
			}
			continue
		}
		if err != nil || b != c.want {
			t.Errorf("%q: %+v, %v; want %+v", c.in, b, err, c.want)
		}
	}
	for _, c := range []struct{ in, want string }{{"1e20GiB", "more bytes than a 64-bit count holds"}, {"20XB", `unknown unit "XB"`},
		{"10KiB", "less than 1 MiB"}, {"lots", "want a size"}, {"-1GiB", "want a size"}, {"NaN", "want a"}} {
		if _, err := ParseBudget(c.in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.in, err, c.want)
		}
	}
	if got := (Budget{Fraction: 0.25}).Of(8 << 30); got != 2<<30 {
		t.Errorf("a quarter of 8 GiB: %d", got)
	}
}

func TestProduct(t *testing.T) {
	for _, c := range []struct {
		xs   []int
		want int
		ok   bool
	}{
		{nil, 1, true},
		{[]int{3, 4}, 12, true},
		{[]int{1 << 40, 1 << 40}, 0, false},
		{[]int{1<<62 + 1, 4}, 0, false},
		{[]int{1 << 40, 1 << 40, 0}, 0, true},
		{[]int{math.MaxInt, 1}, math.MaxInt, true},
		{[]int{math.MaxInt/2 + 1, 2}, 0, false},
		{[]int{3, -1}, 0, false},
	} {
		if got, ok := Product(c.xs...); got != c.want || ok != c.ok {
			t.Errorf("Product(%v) = %d, %v; want %d, %v", c.xs, got, ok, c.want, c.ok)
		}
	}
}
