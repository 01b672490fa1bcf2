package serve

import (
	"errors"
	"fmt"
	"hash/maphash"
	"iter"
	"slices"
)

// Note [paged key-value memory]: a GPT's keys and values live in one
// arena of fixed blocks of BlockSize positions (nn.PagedKV), sized once
// when the server starts, as vLLM's PagedAttention lays them out. A
// sequence holds a block table, the blocks of its positions in order, and
// asks for a block only when its last one is full: at most BlockSize − 1
// slots of each sequence's blocks hold nothing, where a cache for the whole
// context reserves what the sequence may never reach.
//
//   - Each block has a reference count: the tables that hold it. A
//     sequence forked from another (several samples of one prompt) shares
//     its blocks, and copies a shared block before writing into it
//     (copy-on-write: Append returns the copy the engine makes on the
//     device before the step).
//   - A full block of a prompt, once its keys and values are written, is
//     registered in the prefix cache under a hash of its tokens and of every
//     token before it. A later prompt that begins with the same tokens takes
//     the same blocks and starts its prefill after them. A block no table
//     holds keeps its contents while cached, on a least-recently-used list,
//     and is evicted (its hash forgotten) only when a block is needed and
//     none is free.
//   - Prompts that arrive together share their prefix from the first
//     step: the full blocks a step's prefill rows write are registered for
//     that step (Writing), and a prompt admitted later in the same step
//     that begins with them takes them (Prefill) and runs only its own
//     rows. Its rows read those blocks in the forward that writes them,
//     which is sound because each layer writes every row's keys and
//     values before any row attends (nn.GPT.ForwardPaged), and the
//     prefill's rows are one forward. Without it, 64 prompts arriving at
//     once with a 512-token system prompt would compute that prompt once
//     for each of the first few, until the first step ended.
//   - Block 0 is never given out: a captured batch's padding rows read it.
//
// Running out of blocks is not an error for a request: the engine preempts
// its newest sequence (its blocks freed, its tokens prefilled again when it
// resumes) and asks again.

// ErrNoBlocks is returned when the memory has no block to give: the caller
// waits or preempts.
var ErrNoBlocks = errors.New("the key-value memory has no free block")

// BlockTable is one sequence's blocks and how many positions it holds.
type BlockTable struct {
	Blocks []int32
	Len    int // positions assigned to tokens: the next token's is Len
}

// Slot is where position pos of the table's sequence lives in the memory:
// block·size + offset.
func (t *BlockTable) Slot(pos, size int) int32 {
	return t.Blocks[pos/size]*int32(size) + int32(pos%size)
}

// BlockCopy is a block the engine must copy on the device before the
// step: the first N positions of From into To.
type BlockCopy struct {
	From, To int32
	N        int
}

// KVStats is the memory's state, for the metrics and the memory report.
type KVStats struct {
	Blocks, BlockSize int
	Used              int   // blocks some table holds
	Free              int   // blocks no one holds (the evictable cached ones among them)
	Cached            int   // blocks in the prefix cache, held or not
	SlotsAllocated    int   // Used·BlockSize
	SlotsHeld         int   // of those, the slots assigned to a token
	Hits, Misses      int64 // prompt blocks found in the prefix cache, and not
	Evictions         int64
}

// Waste is the share of the allocated slots that hold no token: the last
// block of each sequence, part full (at most BlockSize−1 slots a sequence).
func (s KVStats) Waste() float64 {
	if s.SlotsAllocated == 0 {
		return 0
	}
	return float64(s.SlotsAllocated-s.SlotsHeld) / float64(s.SlotsAllocated)
}

// ArenaWaste is the allocated slots that hold no token over all the
// memory's slots: what the paging loses of the arena (a cache of the
// whole context a sequence, as unpaged servers keep, loses the context
// less each sequence's length).
func (s KVStats) ArenaWaste() float64 {
	if s.Blocks == 0 {
		return 0
	}
	return float64(s.SlotsAllocated-s.SlotsHeld) / float64(s.Blocks*s.BlockSize)
}

// BlockManager gives out the blocks of a paged key-value memory (Note
// [paged key-value memory]). It is not safe for concurrent use: the
// engine's loop owns it.
type BlockManager struct {
	size    int
	refs    []int32 // tables holding each block
	held    []int32 // positions of each block assigned to a token
	free    []int32 // blocks with no holder and nothing cached, a stack
	key     []uint64
	tokens  [][]int32 // a cached block's tokens, to tell a hash's collision from a hit
	cache   map[uint64]int32
	lruPrev []int32 // the evictable cached blocks, oldest first (-1: none)
	lruNext []int32
	lruHead int32
	lruTail int32
	lruLen  int
	seed    maphash.Seed
	noCache bool
	// writing are the full prompt blocks the step being scheduled writes,
	// by their key (Writing), until NewStep.
	writing  map[uint64]writingBlock
	hits     int64
	misses   int64
	evicted  int64
	cachedOK int // cached blocks
	// used and slotsHeld are the blocks with a holder and the sum of held,
	// kept as they change: Stats reads them at every step.
	used      int
	slotsHeld int
}

// NewBlockManager manages blocks blocks of size positions (block 0
// reserved); without prefixCache no block is shared between prompts.
func NewBlockManager(blocks, size int, prefixCache bool) *BlockManager {
	if blocks < 2 || size < 1 {
		panic(fmt.Sprintf("serve: a block manager of %d blocks of %d positions", blocks, size))
	}
	m := &BlockManager{size: size, refs: make([]int32, blocks), held: make([]int32, blocks), key: make([]uint64, blocks),
		tokens: make([][]int32, blocks), cache: map[uint64]int32{}, lruPrev: make([]int32, blocks), lruNext: make([]int32, blocks),
		lruHead: -1, lruTail: -1, seed: maphash.MakeSeed(), noCache: !prefixCache}
	for b := int32(blocks - 1); b >= 1; b-- {
		m.free = append(m.free, b)
	}
	return m
}

// BlockSize is the positions a block holds.
func (m *BlockManager) BlockSize() int { return m.size }

// Available is the blocks a request can have now: free ones and cached ones
// no table holds.
func (m *BlockManager) Available() int { return len(m.free) + m.lruLen }

// blocksFor is the blocks n positions take.
func (m *BlockManager) blocksFor(n int) int { return (n + m.size - 1) / m.size }

// Prefill gives a new sequence the blocks of its prompt, reusing the
// cached blocks its first full blocks match, and returns the positions
// whose keys and values are already there (cached: a multiple of the
// block size, at most len(prompt) − 1, so that the prompt's last position
// always runs and gives the logits of the first token). It takes nothing
// and returns ErrNoBlocks when the rest does not fit.
func (m *BlockManager) Prefill(prompt []int32) (t *BlockTable, cached int, err error) {
	if len(prompt) == 0 {
		panic("serve: the blocks of an empty prompt")
	}
	t = &BlockTable{Len: len(prompt)}
	var hit []int32
	if !m.noCache {
		for i, h := range m.blockKeys(prompt, len(prompt)-1) { // full blocks before the last position
			b, ok := m.cache[h]
			if ok && !slices.Equal(m.tokens[b], prompt[i*m.size:(i+1)*m.size]) {
				break
			}
			if !ok { // written in this step by a prompt admitted before it
				w, inStep := m.writing[h]
				if !inStep || !slices.Equal(w.tokens, prompt[i*m.size:(i+1)*m.size]) {
					break
				}
				b = w.block
			}
			hit = append(hit, b)
		}
	}
	need := m.blocksFor(len(prompt)) - len(hit)
	evictable := 0
	for _, b := range hit {
		if m.refs[b] == 0 {
			evictable++ // taking it makes it unavailable to the others
		}
	}
	if need > m.Available()-evictable {
		return nil, 0, ErrNoBlocks
	}
	for _, b := range hit {
		m.hold(b)
	}
	m.hits += int64(len(hit))
	if !m.noCache {
		m.misses += int64((len(prompt)-1)/m.size - len(hit)) // the full blocks it could have had, and did not
	}
	t.Blocks = append(t.Blocks, hit...)
	for range need {
		t.Blocks = append(t.Blocks, m.take())
	}
	for i, b := range t.Blocks {
		m.setHeld(b, min(m.size, len(prompt)-i*m.size))
	}
	return t, len(hit) * m.size, nil
}

// Computed registers the full blocks among the first done positions of a
// sequence's prompt in the prefix cache, once their keys and values are
// written: the engine calls it after each step of a prefill.
func (m *BlockManager) Computed(t *BlockTable, prompt []int32, done int) {
	if m.noCache {
		return
	}
	for i, h := range m.blockKeys(prompt, done) {
		toks := prompt[i*m.size : (i+1)*m.size]
		b := t.Blocks[i]
		if m.key[b] != 0 {
			continue // registered already (a hit, or an earlier step)
		}
		if _, taken := m.cache[h]; taken {
			continue // another block holds these tokens: this one stays private
		}
		m.key[b], m.tokens[b], m.cache[h] = h, slices.Clone(toks), b
		m.cachedOK++
	}
}

// writingBlock is a block a step writes, and its tokens (the writer's
// prompt's).
type writingBlock struct {
	block  int32
	tokens []int32
}

// Writing registers the full blocks of t's prompt that the step being
// scheduled writes, its positions below upto: a prompt admitted after it
// in the same step shares those not cached yet (Prefill), as Note [paged
// key-value memory] says. NewStep forgets them.
func (m *BlockManager) Writing(t *BlockTable, prompt []int32, upto int) {
	if m.noCache {
		return
	}
	for i, h := range m.blockKeys(prompt, upto) {
		b := t.Blocks[i]
		if m.key[b] != 0 {
			continue // cached already
		}
		if _, cached := m.cache[h]; cached {
			continue // another block holds these tokens
		}
		if _, ok := m.writing[h]; !ok {
			if m.writing == nil {
				m.writing = map[uint64]writingBlock{}
			}
			m.writing[h] = writingBlock{b, prompt[i*m.size : (i+1)*m.size]}
		}
	}
}

// NewStep begins the scheduling of a step: the blocks the last one wrote
// (Writing) are cached now, where they were computed (Computed), or not
// to be shared.
func (m *BlockManager) NewStep() { clear(m.writing) }

// Append assigns the sequence's next position a slot, taking a block when
// its last is full, and copying its last block first when others share it
// (the copy, when not nil, is the engine's to make before the step). It
// takes nothing and returns ErrNoBlocks when no block is left.
func (m *BlockManager) Append(t *BlockTable) (slot int32, cp *BlockCopy, err error) {
	off := t.Len % m.size
	switch {
	case off == 0:
		if m.Available() == 0 {
			return 0, nil, ErrNoBlocks
		}
		t.Blocks = append(t.Blocks, m.take())
	case m.refs[t.Blocks[len(t.Blocks)-1]] > 1:
		if m.Available() == 0 {
			return 0, nil, ErrNoBlocks
		}
		old := t.Blocks[len(t.Blocks)-1]
		b := m.take()
		m.setHeld(b, off)
		cp = &BlockCopy{From: old, To: b, N: off}
		m.drop(old)
		t.Blocks[len(t.Blocks)-1] = b
	}
	b := t.Blocks[len(t.Blocks)-1]
	m.setHeld(b, max(int(m.held[b]), off+1))
	t.Len++
	return b*int32(m.size) + int32(off), cp, nil
}

// NeedsBlock says whether t's next position takes a block: its last is
// full, or shared (copied before the write).
func (m *BlockManager) NeedsBlock(t *BlockTable) bool {
	return t.Len%m.size == 0 || m.refs[t.Blocks[len(t.Blocks)-1]] > 1
}

// Fork is a new table sharing every block of t: a second sample of the
// same prompt.
func (m *BlockManager) Fork(t *BlockTable) *BlockTable {
	for _, b := range t.Blocks {
		m.hold(b)
	}
	return &BlockTable{Blocks: slices.Clone(t.Blocks), Len: t.Len}
}

// Release gives back t's blocks: a block no table holds any more is free,
// or, cached, evictable.
func (m *BlockManager) Release(t *BlockTable) {
	for _, b := range t.Blocks {
		m.drop(b)
	}
	t.Blocks, t.Len = nil, 0
}

// Stats is the memory's state.
func (m *BlockManager) Stats() KVStats {
	return KVStats{Blocks: len(m.refs), BlockSize: m.size, Free: m.Available(), Cached: m.cachedOK,
		Hits: m.hits, Misses: m.misses, Evictions: m.evicted, Used: m.used, SlotsAllocated: m.used * m.size, SlotsHeld: m.slotsHeld}
}

// blockKeys yields the index and key (chain) of each full block of
// prompt's first upto positions.
func (m *BlockManager) blockKeys(prompt []int32, upto int) iter.Seq2[int, uint64] {
	return func(yield func(int, uint64) bool) {
		h := uint64(0)
		for i := 0; (i+1)*m.size <= min(upto, len(prompt)); i++ {
			h = m.chain(h, prompt[i*m.size:(i+1)*m.size])
			if !yield(i, h) {
				return
			}
		}
	}
}

// chain is the key of a block of tokens after the blocks whose key is h.
func (m *BlockManager) chain(h uint64, toks []int32) uint64 {
	var mh maphash.Hash
	mh.SetSeed(m.seed)
	var buf [8]byte
	for i := range 8 {
		buf[i] = byte(h >> (8 * i))
	}
	mh.Write(buf[:])
	for _, t := range toks {
		mh.Write([]byte{byte(t), byte(t >> 8), byte(t >> 16), byte(t >> 24)})
	}
	if k := mh.Sum64(); k != 0 {
		return k
	}
	return 1 // 0 means no key
}

// take gives out a block: a free one, else the least recently used cached
// one no table holds, evicted.
func (m *BlockManager) take() int32 {
	var b int32
	if n := len(m.free); n > 0 {
		b, m.free = m.free[n-1], m.free[:n-1]
	} else {
		b = m.lruHead
		if b < 0 {
			panic("serve: a block taken with none available")
		}
		m.unlink(b)
		delete(m.cache, m.key[b])
		m.key[b], m.tokens[b] = 0, nil
		m.cachedOK--
		m.evicted++
	}
	m.refs[b] = 1
	m.used++
	m.setHeld(b, 0)
	return b
}

// setHeld sets b's positions assigned to a token.
func (m *BlockManager) setHeld(b int32, n int) {
	m.slotsHeld += n - int(m.held[b])
	m.held[b] = int32(n)
}

// hold adds a holder to b, taking it off the evictable list.
func (m *BlockManager) hold(b int32) {
	if m.refs[b] == 0 {
		m.unlink(b)
		m.used++
	}
	m.refs[b]++
}

// drop removes a holder from b.
func (m *BlockManager) drop(b int32) {
	if m.refs[b] <= 0 {
		panic(fmt.Sprintf("serve: block %d released more often than it was taken", b))
	}
	if m.refs[b]--; m.refs[b] > 0 {
		return
	}
	m.used--
	m.setHeld(b, 0)
	if m.key[b] != 0 { // cached: evictable, the most recently used
		m.lruPrev[b], m.lruNext[b] = m.lruTail, -1
		if m.lruTail >= 0 {
			m.lruNext[m.lruTail] = b
		} else {
			m.lruHead = b
		}
		m.lruTail = b
		m.lruLen++
		return
	}
	m.free = append(m.free, b)
}

// unlink takes b off the evictable list.
func (m *BlockManager) unlink(b int32) {
	p, n := m.lruPrev[b], m.lruNext[b]
	if p >= 0 {
		m.lruNext[p] = n
	} else {
		m.lruHead = n
	}
	if n >= 0 {
		m.lruPrev[n] = p
	} else {
		m.lruTail = p
	}
	m.lruLen--
}
