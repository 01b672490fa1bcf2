package serve

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

// checkBlocks asserts the manager's invariants against the tables that
// hold blocks: each block's count is its holders, every block is held,
// free or evictable exactly once, and block 0 is never given out.
func checkBlocks(t *testing.T, m *BlockManager, tables ...*BlockTable) {
	t.Helper()
	refs := make([]int32, len(m.refs))
	for _, tb := range tables {
		for _, b := range tb.Blocks {
			if b == 0 {
				t.Fatalf("block 0 given out: %v", tb.Blocks)
			}
			refs[b]++
		}
	}
	if !slices.Equal(refs, m.refs) {
		t.Fatalf("reference counts %v, the tables hold %v", m.refs, refs)
	}
	seen := make([]int, len(m.refs))
	for _, b := range m.free {
		seen[b]++
	}
	for b := m.lruHead; b >= 0; b = m.lruNext[b] {
		seen[b]++
		if m.key[b] == 0 || m.refs[b] != 0 {
			t.Fatalf("block %d evictable with key %x and %d holders", b, m.key[b], m.refs[b])
		}
	}
	for b := 1; b < len(m.refs); b++ {
		if n := seen[b] + min(1, int(m.refs[b])); n != 1 {
			t.Fatalf("block %d is held, free or evictable %d times", b, n)
		}
	}
	used, held := 0, 0
	for b, r := range m.refs {
		if r > 0 {
			used, held = used+1, held+int(m.held[b])
		} else if m.held[b] != 0 {
			t.Fatalf("block %d has no holder and %d positions held", b, m.held[b])
		}
	}
	if s := m.Stats(); s.Used != used || s.SlotsHeld != held || s.SlotsAllocated != used*m.size {
		t.Fatalf("Stats: %d blocks used, %d of %d positions held; counted, %d and %d of %d", s.Used, s.SlotsHeld, s.SlotsAllocated, used, held, used*m.size)
	}
	if got, want := m.Available(), len(m.free)+m.lruLen; got != want {
		t.Fatalf("Available %d, free and evictable %d", got, want)
	}
}

func toks(n int, base int32) []int32 {
	v := make([]int32, n)
	for i := range v {
		v[i] = base + int32(i)
	}
	return v
}

// TestBlocksOfASequence: a prompt takes its blocks, each new position a
// slot in turn and a block when the last is full; the slots follow the
// table; running out is ErrNoBlocks and takes nothing; releasing frees
// everything; the waste is the unassigned slots of the blocks held.
func TestBlocksOfASequence(t *testing.T) {
	m := NewBlockManager(6, 4, false) // 5 blocks to give: 20 positions
	tb, cached, err := m.Prefill(toks(6, 100))
	if err != nil || cached != 0 || len(tb.Blocks) != 2 || tb.Len != 6 {
		t.Fatalf("prefill of 6: %v, %d cached, %+v", err, cached, tb)
	}
	if s := m.Stats(); s.Used != 2 || s.SlotsAllocated != 8 || s.SlotsHeld != 6 || s.Waste() != 0.25 {
		t.Fatalf("after a prompt of 6: %+v, waste %v", s, s.Waste())
	}
	for pos := 6; pos < 20; pos++ {
		slot, cp, err := m.Append(tb)
		if err != nil || cp != nil || slot != tb.Slot(pos, 4) {
			t.Fatalf("position %d: slot %d (%v, copy %v), the table says %d", pos, slot, err, cp, tb.Slot(pos, 4))
		}
	}
	checkBlocks(t, m, tb)
	if s := m.Stats(); s.Used != 5 || s.Waste() != 0 || s.Free != 0 {
		t.Fatalf("full: %+v", s)
	}
	if _, _, err := m.Append(tb); !errors.Is(err, ErrNoBlocks) || tb.Len != 20 || len(tb.Blocks) != 5 {
		t.Fatalf("past the memory: %v, %+v", err, tb)
	}
	if _, _, err := m.Prefill(toks(1, 0)); !errors.Is(err, ErrNoBlocks) {
		t.Fatalf("a prompt with no block left: %v", err)
	}
	m.Release(tb)
	checkBlocks(t, m)
	if s := m.Stats(); s.Used != 0 || s.Free != 5 || s.Waste() != 0 {
		t.Fatalf("released: %+v", s)
	}
}

// TestForkCopiesOnWrite: a fork shares every block; the first write into a
// shared, partly filled block copies it (the copy says what to move), and
// writes into a block the sequence holds alone copy nothing.
func TestForkCopiesOnWrite(t *testing.T) {
	m := NewBlockManager(10, 4, false)
	a, _, _ := m.Prefill(toks(6, 0))
	b := m.Fork(a)
	checkBlocks(t, m, a, b)
	if m.refs[a.Blocks[0]] != 2 || m.refs[a.Blocks[1]] != 2 {
		t.Fatalf("forked: %v", m.refs)
	}
	slot, cp, err := m.Append(b)
	if err != nil || cp == nil || cp.From != a.Blocks[1] || cp.To != b.Blocks[1] || cp.N != 2 || slot != b.Blocks[1]*4+2 {
		t.Fatalf("the fork's first write: slot %d, copy %+v, %v (a %v, b %v)", slot, cp, err, a.Blocks, b.Blocks)
	}
	if _, cp, _ := m.Append(a); cp != nil {
		t.Fatalf("the parent's write into a block it now holds alone copied %+v", cp)
	}
	if _, cp, _ := m.Append(b); cp != nil {
		t.Fatalf("the fork's second write copied %+v", cp)
	}
	checkBlocks(t, m, a, b)
	if s := m.Stats(); s.Used != 3 || s.SlotsHeld != 4+3+4 {
		t.Fatalf("sequences of 7 and 8 positions, a block shared: %+v", s)
	}
	m.Release(a)
	m.Release(b)
	checkBlocks(t, m)
}

// TestPrefixCache: a prompt's full blocks, once computed, serve a later
// prompt with the same first tokens (never its last position's block);
// a block no one holds stays cached until a block is needed, then the
// least recently used goes; without the cache nothing is shared.
func TestPrefixCache(t *testing.T) {
	m := NewBlockManager(8, 4, true) // 7 blocks
	sys := toks(8, 500)              // a system prompt of two blocks
	p1 := append(slices.Clone(sys), 1, 2, 3)
	a, cached, _ := m.Prefill(p1)
	if cached != 0 {
		t.Fatalf("a cold cache had %d positions", cached)
	}
	m.Computed(a, p1, len(p1))
	p2 := append(slices.Clone(sys), 9)
	b, cached, err := m.Prefill(p2)
	if err != nil || cached != 8 || b.Blocks[0] != a.Blocks[0] || b.Blocks[1] != a.Blocks[1] || b.Blocks[2] == a.Blocks[2] {
		t.Fatalf("the same system prompt: %v, %d cached, a %v, b %v", err, cached, a.Blocks, b.Blocks)
	}
	if s := m.Stats(); s.Hits != 2 || s.Used != 4 {
		t.Fatalf("after a hit: %+v", s)
	}
	// A prompt that is exactly the cached blocks runs its last block again.
	c, cached, _ := m.Prefill(slices.Clone(sys))
	if cached != 4 || c.Blocks[0] != a.Blocks[0] || c.Blocks[1] == a.Blocks[1] {
		t.Fatalf("a prompt of the two cached blocks: %d cached, %v", cached, c.Blocks)
	}
	checkBlocks(t, m, a, b, c)
	m.Release(c)
	m.Release(a)
	m.Release(b) // sys's blocks: cached, evictable; the others free
	checkBlocks(t, m)
	if s := m.Stats(); s.Used != 0 || s.Free != 7 || s.Cached != 2 {
		t.Fatalf("released: %+v", s)
	}
	// Taking every block evicts the cached ones last, the oldest first.
	var all []*BlockTable
	for i := range 5 {
		tb, _, err := m.Prefill(toks(4, int32(1000+10*i)))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, tb)
	}
	if s := m.Stats(); s.Cached != 2 || s.Evictions != 0 {
		t.Fatalf("five blocks taken with two free and two cached: %+v", s)
	}
	tb, _, _ := m.Prefill(toks(4, 2000))
	if s := m.Stats(); s.Cached != 1 || s.Evictions != 1 {
		t.Fatalf("the sixth evicted: %+v", s)
	}
	checkBlocks(t, m, append(all, tb)...)
	for _, x := range append(all, tb) {
		m.Release(x)
	}
	d, cached, err := m.Prefill(append(slices.Clone(sys), 7))
	if err != nil || cached != 0 {
		t.Fatalf("after sys's first block was evicted: %v, %d cached", err, cached) // the chain breaks at the first block
	}
	checkBlocks(t, m, d)
	// Without the cache, nothing is shared.
	n := NewBlockManager(8, 4, false)
	x, _, _ := n.Prefill(p1)
	n.Computed(x, p1, len(p1))
	if _, cached, _ := n.Prefill(p2); cached != 0 {
		t.Fatalf("no cache, and %d positions cached", cached)
	}
}

// TestPrefixSharedInTheStep: a prompt admitted in the step that writes a
// prefix's blocks shares them (those its rows in that step cover), and
// once the step is over only what was computed is shared.
func TestPrefixSharedInTheStep(t *testing.T) {
	m := NewBlockManager(16, 4, true)
	sys := toks(12, 500) // three blocks
	p1 := append(slices.Clone(sys), 1, 2)
	a, _, _ := m.Prefill(p1)
	m.Writing(a, p1, 8) // a chunk of its first 8 positions this step
	p2 := append(slices.Clone(sys), 9)
	b, cached, err := m.Prefill(p2)
	if err != nil || cached != 8 || !slices.Equal(b.Blocks[:2], a.Blocks[:2]) || b.Blocks[2] == a.Blocks[2] {
		t.Fatalf("a prompt beside the chunk that writes the first two of its blocks: %v, %d cached, a %v, b %v", err, cached, a.Blocks, b.Blocks)
	}
	m.Writing(b, p2, len(p2)) // b writes its third block itself: the later prompts may take it
	c, cached, _ := m.Prefill(append(slices.Clone(sys), 3, 4))
	if cached != 12 || !slices.Equal(c.Blocks[:2], a.Blocks[:2]) || c.Blocks[2] != b.Blocks[2] {
		t.Fatalf("a third prompt: %d cached, a %v, b %v, c %v", cached, a.Blocks, b.Blocks, c.Blocks)
	}
	if s := m.Stats(); s.Hits != 2+3 {
		t.Fatalf("hits %d, want 5", s.Hits)
	}
	checkBlocks(t, m, a, b, c)
	// The step ends with a's chunk and b computed; c's own never ran (say
	// the step failed for it): the next step shares what was computed.
	m.Computed(a, p1, 8)
	m.Computed(b, p2, len(p2))
	m.NewStep()
	d, cached, _ := m.Prefill(append(slices.Clone(sys), 5))
	if cached != 12 || d.Blocks[2] != b.Blocks[2] {
		t.Fatalf("after the step: %d cached, %v", cached, d.Blocks)
	}
	m.NewStep()
	e, cached, _ := m.Prefill(append(toks(8, 900), 1)) // written by no one
	if cached != 0 {
		t.Fatalf("an unseen prompt: %d cached, %v", cached, e.Blocks)
	}
	checkBlocks(t, m, a, b, c, d, e)
	// Without the cache nothing is shared, in the step or after it.
	n := NewBlockManager(16, 4, false)
	x, _, _ := n.Prefill(p1)
	n.Writing(x, p1, len(p1))
	if _, cached, _ := n.Prefill(p2); cached != 0 {
		t.Fatalf("no cache, and %d positions shared in the step", cached)
	}
}

// TestBlocksRandomly runs random prefills, appends, forks, computations
// and releases, checking the invariants after each: counts match the
// tables, no block is lost or given twice, and everything comes back.
func TestBlocksRandomly(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	m := NewBlockManager(40, 4, true)
	prompts := [][]int32{toks(9, 0), toks(13, 0), toks(5, 100), toks(12, 100), toks(3, 7)}
	var live []*BlockTable
	var their [][]int32
	// Half the prefills are written by the step being scheduled (Writing),
	// computed when it ends, as the engine's are; the others computed at
	// once. A step ends before anything is released.
	var writing []int // into live
	endStep := func() {
		for _, i := range writing {
			m.Computed(live[i], their[i], len(their[i]))
		}
		writing = nil
		m.NewStep()
	}
	for step := range 3000 {
		switch r := rng.IntN(10); {
		case r < 3:
			p := slices.Clone(prompts[rng.IntN(len(prompts))])
			tb, cached, err := m.Prefill(p)
			if errors.Is(err, ErrNoBlocks) {
				break
			}
			if cached >= len(p) || cached%4 != 0 {
				t.Fatalf("step %d: %d cached of %d", step, cached, len(p))
			}
			live, their = append(live, tb), append(their, p)
			if rng.IntN(2) == 0 {
				m.Writing(tb, p, len(p))
				writing = append(writing, len(live)-1)
			} else {
				m.Computed(tb, p, len(p))
			}
		case r < 7 && len(live) > 0:
			i := rng.IntN(len(live))
			if _, cp, err := m.Append(live[i]); err == nil && cp != nil && (cp.N <= 0 || cp.N >= 4) {
				t.Fatalf("step %d: copy %+v", step, cp)
			}
		case r < 8 && len(live) > 0:
			i := rng.IntN(len(live))
			live, their = append(live, m.Fork(live[i])), append(their, their[i])
		case len(live) > 0:
			endStep()
			i := rng.IntN(len(live))
			m.Release(live[i])
			live, their = slices.Delete(live, i, i+1), slices.Delete(their, i, i+1)
		}
		checkBlocks(t, m, live...)
	}
	endStep()
	for _, tb := range live {
		m.Release(tb)
	}
	checkBlocks(t, m)
	if s := m.Stats(); s.Used != 0 || s.Free != 39 {
		t.Fatalf("all released: %+v", s)
	}
}
