// Package memory is leangrad's caching allocator. It knows nothing of CUDA:
// it sits on a raw Source (Go heap slabs on the CPU, cuMemAlloc on a GPU) and
// follows the semantics, constants and statistics names of PyTorch's
// CUDACachingAllocator, so its reports read the way PyTorch users expect.
//
// Requests are rounded up to 512 bytes. Requests of at most 1 MiB are served
// from the small pool, whose segments are 2 MiB; larger ones from the large
// pool, whose segments are 20 MiB for requests under 10 MiB and the request
// rounded up to 2 MiB otherwise. A request takes the smallest free block of
// its pool and stream that fits (best fit), splitting off the rest when the
// rest is worth keeping; a freed block coalesces with free neighbours in its
// segment. Segments go back to the Source only through EmptyCache, or when a
// Source allocation fails: then every wholly free segment is released and the
// allocation retried once (a large request then also tries a segment of
// exactly its size: Note [exact segments]) before the request fails with an
// *OOMError. SetLimit and SetMemoryFraction cap what may be reserved;
// Config.NoCaching makes every request a segment of its own.
//
// RecordHistory records every event with its Go call sites, and Snapshot and
// WriteSnapshot turn it into a file PyTorch's memory viewer opens
// (history.go, pickle.go). Inject wraps a Source so that chosen allocations
// fail, for tests of what happens then (faults.go).
//
// Work that repeats exactly (a training step of fixed shapes) can instead be
// traced once and planned: PlanTrace assigns every buffer an offset in one
// Arena, and the allocator then serves the work's requests from the plan
// (arena.go, plan.go).
package memory

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
)

// The allocator's constants, the same as PyTorch's.
const (
	MinBlockSize  = 512      // every request is rounded up to a multiple of this
	SmallSize     = 1 << 20  // largest request served by the small pool
	SmallBuffer   = 2 << 20  // size of a small-pool segment
	LargeBuffer   = 20 << 20 // size of a large-pool segment for requests under MinLargeAlloc
	MinLargeAlloc = 10 << 20 // requests from here on get a segment of their own size
	RoundLarge    = 2 << 20  // ...rounded up to a multiple of this
)

// RoundSize is the size a request of n bytes occupies in a block.
func RoundSize(n int64) int64 {
	if n < MinBlockSize {
		return MinBlockSize
	}
	return (n + MinBlockSize - 1) / MinBlockSize * MinBlockSize
}

// SegmentSize is the size of the segment the allocator obtains from its Source
// when no cached block fits a request of rounded size n.
func SegmentSize(n int64) int64 {
	switch {
	case n <= SmallSize:
		return SmallBuffer
	case n < MinLargeAlloc:
		return LargeBuffer
	default:
		return (n + RoundLarge - 1) / RoundLarge * RoundLarge
	}
}

// Stream identifies the stream a block is tied to. A freed block is only
// reused by requests on the same stream. The zero Stream is the default one.
type Stream uintptr

// PoolKind indexes the per-pool rows of Stats.
type PoolKind int

// The rows of every StatArray: all pools together, the small pool, the large pool.
const (
	All PoolKind = iota
	Small
	Large
)

// Block is a piece of a segment handed out by Alloc. Its fields are read
// through methods; it is owned by the Allocator until returned with Free.
type Block struct {
	seg       *segment
	pcs       []uintptr // where it was allocated, while the history records
	off       int64
	size      int64
	requested int64
	stream    Stream
	allocated bool
	prev      *Block
	next      *Block
}

// Size is the block's rounded size in bytes.
func (b *Block) Size() int64 { return b.size }

// Requested is the size that was asked of Alloc.
func (b *Block) Requested() int64 { return b.requested }

// Addr is the block's address in the source's address space.
func (b *Block) Addr() uintptr { return b.seg.Addr + uintptr(b.off) }

// Bytes is the block's memory, when it lives on the Go heap; nil otherwise.
// Its length is the requested size.
func (b *Block) Bytes() []byte {
	if b.seg.Host == nil {
		return nil
	}
	return b.seg.Host[b.off : b.off+b.requested : b.off+b.size]
}

// Stream is the stream the block is tied to.
func (b *Block) Stream() Stream { return b.stream }

// Pool is the pool the block came from: Small or Large.
func (b *Block) Pool() PoolKind { return b.seg.pool.kind }

func (b *Block) split() bool { return b.prev != nil || b.next != nil }

type segment struct {
	Segment
	seq    uint64 // the order the allocator obtained its segments in
	pool   *pool
	stream Stream
	arena  bool      // an Arena's: its blocks are planned, not pooled
	first  *Block    // the block at offset 0 (it stays first: blocks merge into their predecessor)
	pcs    []uintptr // where it was obtained, while the history records
}

// pool holds the free blocks of one size class, ordered by (stream, size,
// segment, offset) so that a best-fit search is a binary search. The
// segments' order is the order they were obtained in, not their addresses:
// the Go heap's addresses move with the garbage collector's timing, and a
// CPU run's layout (what fits under a cap) must not.
type pool struct {
	kind PoolKind
	free []*Block
}

func less(a, b *Block) bool {
	if a.stream != b.stream {
		return a.stream < b.stream
	}
	if a.size != b.size {
		return a.size < b.size
	}
	if a.seg != b.seg {
		return a.seg.seq < b.seg.seq
	}
	return a.off < b.off
}

func (p *pool) insert(b *Block) {
	i := sort.Search(len(p.free), func(i int) bool { return !less(p.free[i], b) })
	p.free = append(p.free, nil)
	copy(p.free[i+1:], p.free[i:])
	p.free[i] = b
}

func (p *pool) remove(b *Block) {
	i := sort.Search(len(p.free), func(i int) bool { return !less(p.free[i], b) })
	if i == len(p.free) || p.free[i] != b {
		panic("memory: free block missing from its pool")
	}
	p.free = append(p.free[:i], p.free[i+1:]...)
}

// bestFit returns the smallest free block on stream of at least size bytes.
func (p *pool) bestFit(stream Stream, size int64) *Block {
	i := sort.Search(len(p.free), func(i int) bool {
		f := p.free[i]
		if f.stream != stream {
			return f.stream > stream
		}
		return f.size >= size
	})
	if i == len(p.free) || p.free[i].stream != stream {
		return nil
	}
	return p.free[i]
}

// Config names an allocator for its messages and reports.
type Config struct {
	// Device names the device in error messages and summaries ("cpu", "cuda:0").
	Device string
	// NoCaching makes every allocation a segment of its own, obtained from
	// the Source and returned to it on Free, as PYTORCH_NO_CUDA_MEMORY_CACHING=1
	// does: slow, but every request reaches the Source, for tools that watch
	// it and for tests that inject faults there.
	NoCaching bool
}

// Allocator is a caching allocator over a Source. It is safe for concurrent use.
type Allocator struct {
	mu       sync.Mutex
	src      Source
	cfg      Config
	small    pool
	large    pool
	stats    Stats
	fraction float64 // 0: no cap
	limit    int64   // 0: no cap
	timeline *Timeline
	window   window
	wsPolicy WorkspacePolicy
	trace    *traceState   // non-nil while tracing
	tracing  atomic.Bool   // trace != nil, read without mu
	planned  *plannedState // non-nil while a plan serves the requests
	owner    int           // the OS thread tracing or planned (Note [the planner's goroutine])
	segs     map[*segment]struct{}
	segSeq   uint64   // segments obtained so far
	hist     *history // the last RecordHistory's
	histOn   bool
}

// New returns an Allocator that obtains its segments from src.
func New(src Source, cfg Config) *Allocator {
	if cfg.Device == "" {
		cfg.Device = "device"
	}
	return &Allocator{src: src, cfg: cfg, small: pool{kind: Small}, large: pool{kind: Large}, segs: map[*segment]struct{}{}}
}

// Device is the device name the allocator was configured with.
func (a *Allocator) Device() string { return a.cfg.Device }

// Source is the raw allocator under the cache.
func (a *Allocator) Source() Source { return a.src }

// Alloc returns a block of at least size bytes on stream. When neither the
// cache nor the Source can provide it, even after the cache is flushed, it
// returns an *OOMError (which wraps ErrOutOfMemory). While a plan is in use
// (BeginPlanned) the block of the planned goroutine is the plan's next one,
// inside its arena.
func (a *Allocator) Alloc(size int64, stream Stream) (*Block, error) {
	if size < 0 {
		return nil, fmt.Errorf("memory: negative allocation size %d", size)
	}
	a.mu.Lock()
	if ps := a.planned; ps != nil && a.mine() {
		defer a.mu.Unlock()
		b, _, err := ps.alloc([]int64{size}, stream)
		return b, err
	}
	a.mu.Unlock()
	return a.alloc(size, stream, nil, 0)
}

// alloc serves a request from the pools; options, when not nil, are the
// sizes a workspace could have taken and taken the one it did, for the trace.
func (a *Allocator) alloc(size int64, stream Stream, options []int64, taken int) (*Block, error) {
	rounded := RoundSize(size)
	a.mu.Lock()
	defer a.mu.Unlock()
	p := &a.large
	if rounded <= SmallSize {
		p = &a.small
	}
	var b *Block
	if !a.cfg.NoCaching {
		b = p.bestFit(stream, rounded)
	}
	if b != nil {
		p.remove(b)
		a.noteFreeLeaves(b)
	} else {
		var err error
		size := SegmentSize(rounded)
		if a.cfg.NoCaching {
			size = rounded
		} else if a.limitLocked() > 0 && p.kind == Large { // Note [exact segments]
			size = a.exact(rounded)
		}
		b, err = a.grow(p, rounded, size, stream, true)
		if err != nil {
			return nil, err
		}
		p = b.seg.pool // the other pool's, under a cap (Note [the other pool under a cap])
	}
	if a.shouldSplit(b, rounded) {
		rest := &Block{seg: b.seg, off: b.off + rounded, size: b.size - rounded, stream: stream, prev: b, next: b.next}
		if b.next != nil {
			b.next.prev = rest
		}
		b.next = rest
		b.size = rounded
		p.insert(rest)
		a.noteFreeEnters(rest)
	}
	b.allocated = true
	b.requested = size
	k := p.kind
	a.stats.Allocations.add(k, 1)
	a.stats.Allocated.add(k, b.size)
	a.stats.ActiveBlocks.add(k, 1)
	a.stats.Active.add(k, b.size)
	a.stats.Requested.add(k, size)
	a.window.allocated = max(a.window.allocated, a.stats.Allocated[All].Current)
	a.record(EventAlloc, b.size)
	if a.histOn {
		b.pcs = callers()
		a.remember("alloc", b.Addr(), b.size, b.pcs)
	}
	if a.trace != nil && a.mine() {
		sizes, asked := []int64{rounded}, []int64{size}
		if options != nil {
			sizes, asked = make([]int64, len(options)), options
			for i, o := range options {
				sizes[i] = RoundSize(o)
			}
		}
		a.trace.alloc(b, sizes, asked, taken)
	}
	return b, nil
}

func (a *Allocator) shouldSplit(b *Block, size int64) bool {
	rest := b.size - size
	if b.seg.pool.kind == Small {
		return rest >= MinBlockSize
	}
	return rest > SmallSize
}

// grow obtains a new segment of size bytes for a request of rounded size,
// flushing the cache and retrying once when the source is out of memory
// (Note [exact segments]); with other, it then takes a free block of the
// other pool (Note [the other pool under a cap]).
func (a *Allocator) grow(p *pool, rounded, size int64, stream Stream, other bool) (*Block, error) {
	b, err := a.newSegment(p, size, stream)
	if errors.Is(err, ErrOutOfMemory) {
		a.stats.NumAllocRetries++
		a.releaseCached()
		b, err = a.newSegment(p, size, stream)
		if exact := a.exact(rounded); errors.Is(err, ErrOutOfMemory) && exact < size {
			b, err = a.newSegment(p, exact, stream)
		}
		if errors.Is(err, ErrOutOfMemory) && other && !a.cfg.NoCaching {
			o := &a.large
			if p.kind == Large {
				o = &a.small
			}
			if ob := o.bestFit(stream, rounded); ob != nil {
				o.remove(ob)
				a.noteFreeLeaves(ob)
				return ob, nil
			}
		}
	}
	if err == nil {
		return b, nil
	}
	if !errors.Is(err, ErrOutOfMemory) {
		return nil, fmt.Errorf("memory: %s: allocating a %d-byte segment: %w", a.cfg.Device, size, err)
	}
	a.stats.NumOOMs++
	a.record(EventOOM, rounded)
	free, total := a.src.MemInfo()
	if a.histOn {
		a.remember("oom", 0, rounded, callers())
		a.hist.events[len(a.hist.events)-1].Free = free
	}
	return nil, &OOMError{
		Device:    a.cfg.Device,
		Requested: rounded,
		Capacity:  total,
		Free:      free,
		Allocated: a.stats.Allocated[All].Current,
		Reserved:  a.stats.Reserved[All].Current,
		Limit:     a.limitLocked(),
		Cause:     err,
	}
}

func (a *Allocator) newSegment(p *pool, size int64, stream Stream) (*Block, error) {
	if limit := a.limitLocked(); limit > 0 && a.stats.Reserved[All].Current+size > limit {
		return nil, fmt.Errorf("memory cap of %s reached: %w", Bytes(limit), ErrOutOfMemory)
	}
	s, err := a.src.Alloc(size)
	if err != nil {
		return nil, err
	}
	a.segSeq++
	seg := &segment{Segment: s, seq: a.segSeq, pool: p, stream: stream}
	a.stats.Segments.add(p.kind, 1)
	a.stats.Reserved.add(p.kind, size)
	a.window.reserved = max(a.window.reserved, a.stats.Reserved[All].Current)
	a.record(EventSegmentAlloc, size)
	if a.histOn {
		seg.pcs = callers()
		a.remember("segment_alloc", seg.Addr, size, seg.pcs)
	}
	seg.first = &Block{seg: seg, size: size, stream: stream}
	a.segs[seg] = struct{}{}
	return seg.first, nil
}

// Free returns b to the cache, coalescing it with free neighbours.
// Freeing a block twice panics.
func (a *Allocator) Free(b *Block) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !b.allocated {
		panic("memory: block freed twice")
	}
	if b.seg.arena {
		b.allocated = false
		if a.planned != nil {
			a.planned.free(b)
		}
		return
	}
	if a.trace != nil {
		a.trace.free(b)
	}
	p := b.seg.pool
	k := p.kind
	b.allocated = false
	a.stats.Allocations.sub(k, 1)
	a.stats.Allocated.sub(k, b.size)
	a.stats.ActiveBlocks.sub(k, 1)
	a.stats.Active.sub(k, b.size)
	a.stats.Requested.sub(k, b.requested)
	a.record(EventFree, b.size)
	if a.histOn {
		a.remember("free_completed", b.Addr(), b.size, callers())
	}
	b.requested = 0
	b.pcs = nil
	if prev := b.prev; prev != nil && !prev.allocated {
		p.remove(prev)
		a.noteFreeLeaves(prev)
		prev.size += b.size
		prev.next = b.next
		if b.next != nil {
			b.next.prev = prev
		}
		b = prev
	}
	if next := b.next; next != nil && !next.allocated {
		p.remove(next)
		a.noteFreeLeaves(next)
		b.size += next.size
		b.next = next.next
		if next.next != nil {
			next.next.prev = b
		}
	}
	p.insert(b)
	a.noteFreeEnters(b)
	if a.cfg.NoCaching {
		a.releaseCached()
	}
}

// noteFreeEnters and noteFreeLeaves keep the non-releasable (inactive split)
// statistics: free blocks that share a segment with other blocks. A free
// block's split state cannot change while it sits in its pool, because free
// neighbours are always coalesced.
func (a *Allocator) noteFreeEnters(b *Block) {
	if b.split() {
		a.stats.InactiveSplitBlocks.add(b.seg.pool.kind, 1)
		a.stats.InactiveSplit.add(b.seg.pool.kind, b.size)
	}
}

func (a *Allocator) noteFreeLeaves(b *Block) {
	if b.split() {
		a.stats.InactiveSplitBlocks.sub(b.seg.pool.kind, 1)
		a.stats.InactiveSplit.sub(b.seg.pool.kind, b.size)
	}
}

// EmptyCache returns every wholly free segment to the Source. Blocks in use
// and segments that are partly in use stay.
func (a *Allocator) EmptyCache() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.releaseCached()
}

func (a *Allocator) releaseCached() {
	for _, p := range []*pool{&a.small, &a.large} {
		kept := p.free[:0]
		for _, b := range p.free {
			if b.split() {
				kept = append(kept, b)
				continue
			}
			if err := a.src.Free(b.seg.Segment); err != nil {
				// The source refused; keep the segment cached rather than lose track of it.
				kept = append(kept, b)
				continue
			}
			a.stats.Segments.sub(p.kind, 1)
			a.stats.Reserved.sub(p.kind, b.size)
			a.record(EventSegmentFree, b.size)
			a.remember("segment_free", b.seg.Addr, b.size, nil)
			delete(a.segs, b.seg)
		}
		clear(p.free[len(kept):])
		p.free = kept
	}
}

// exact is the segment of its own that a request of rounded size takes
// (Note [exact segments]): its size, to the source's granularity.
func (a *Allocator) exact(rounded int64) int64 {
	if g, ok := a.src.(Granular); ok {
		if u := g.Granularity(); u > 1 {
			return (rounded + u - 1) / u * u
		}
	}
	return rounded
}

// Note [the other pool under a cap]: small requests (up to SmallSize) and
// large ones keep to pools of their own, so that the small blocks that come
// and go do not break up the large segments. Under a cap (SetLimit,
// -max-memory) that can fail a request that would fit: a 784 KiB request
// of ResNet-20's step at batch 128 found no room for a new 2 MiB segment
// under a cap of 45 MiB while a large segment held a free block of 15 MiB.
// So a request that finds no room for a segment, after the cache was
// flushed, takes the best fitting free block of the other pool; the block
// stays its segment's, and returns to that segment's pool when freed.

// Note [exact segments]: PyTorch rounds a large request's segment up (to
// 20 MiB below 10 MiB, which the requests of 1 to 10 MiB then share) and
// fails when that segment does not fit, even if the request itself would.
// Under a cap (SetLimit, SetMemoryFraction, -max-memory) a large request
// here takes a segment of exactly its size (rounded as every request is),
// and any request that finds no room for its segment, after the cache was
// flushed, takes one of exactly its size: the shared 20 MiB segments break
// up as their blocks come and go, and near a cap the bytes between those
// blocks are what is short. ResNet-20's steps at batch 128 on the CPU
// (memory's TestCapsFitTheSteps replays them) fitted a cap 24.5% above
// their allocated peak with shared segments, with every block
// checkpointed, and 1.1% above with segments of their own. A segment of
// its own is a multiple of the source's granularity (Granular: a GPU's
// driver maps pages of 2 MiB), so that the cap counts what the device
// gives.

// SetLimit caps the bytes this allocator may reserve (segments held, cached
// or not) at bytes; 0 removes the cap. With SetMemoryFraction too, the lower
// cap holds.
func (a *Allocator) SetLimit(bytes int64) error {
	if bytes < 0 {
		return fmt.Errorf("memory: negative limit %d", bytes)
	}
	a.mu.Lock()
	a.limit = bytes
	a.mu.Unlock()
	return nil
}

// Limit is the cap SetLimit set (0: none).
func (a *Allocator) Limit() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.limit
}

// SetMemoryFraction caps the bytes this allocator may reserve at fraction of
// the Source's total, as torch.cuda.set_per_process_memory_fraction does.
// A fraction of 0 removes the cap.
func (a *Allocator) SetMemoryFraction(fraction float64) error {
	if fraction < 0 || fraction > 1 {
		return fmt.Errorf("memory: memory fraction %v is outside [0, 1]", fraction)
	}
	a.mu.Lock()
	a.fraction = fraction
	a.mu.Unlock()
	return nil
}

func (a *Allocator) limitLocked() int64 {
	limit := a.limit
	if a.fraction > 0 {
		_, total := a.src.MemInfo()
		if f := int64(a.fraction * float64(total)); limit == 0 || f < limit {
			limit = f
		}
	}
	return limit
}

// Stats returns a snapshot of the allocator's statistics.
func (a *Allocator) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

// WindowPeak returns the peaks of allocated and reserved bytes since the
// previous WindowPeak call (or the allocator's creation) and starts a new
// window at the current values. It leaves the Stats peaks alone, so a
// trainer can take each step's peak while Summary still shows the run's.
func (a *Allocator) WindowPeak() (allocated, reserved int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	allocated, reserved = a.window.allocated, a.window.reserved
	a.window = window{a.stats.Allocated[All].Current, a.stats.Reserved[All].Current}
	return allocated, reserved
}

// ResetPeak sets every peak statistic to its current value.
func (a *Allocator) ResetPeak() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stats.resetPeak()
}

// OOMError is the error of a request that could not be met. Its message gives
// what PyTorch's does: the request, the capacity and free bytes of the device,
// what is allocated and what is reserved but unallocated.
type OOMError struct {
	Device    string
	Requested int64 // rounded request size
	Capacity  int64 // the Source's total
	Free      int64 // the Source's free bytes when the request failed
	Allocated int64 // bytes in allocated blocks
	Reserved  int64 // bytes held in segments
	Limit     int64 // the memory-fraction cap in bytes, 0 if none
	Cause     error // the Source's (or the cap's) own error
}

func (e *OOMError) Error() string {
	msg := fmt.Sprintf("%s out of memory. Tried to allocate %s. %s has a total capacity of %s of which %s is free. "+
		"Of the allocated memory %s is allocated by leangrad, and %s is reserved by leangrad but unallocated.",
		e.Device, Bytes(e.Requested), e.Device, Bytes(e.Capacity), Bytes(e.Free),
		Bytes(e.Allocated), Bytes(e.Reserved-e.Allocated))
	if e.Limit > 0 {
		msg += fmt.Sprintf(" This process may reserve at most %s (its memory cap).", Bytes(e.Limit))
	}
	if e.Cause != nil {
		msg += fmt.Sprintf(" (The source said: %v.)", e.Cause)
	}
	if e.Reserved-e.Allocated > e.Requested {
		msg += " Reserved but unallocated memory is large: it is fragmented; EmptyCache or smaller batches may help."
	}
	return msg
}

// Unwrap makes errors.Is(err, ErrOutOfMemory) true.
func (e *OOMError) Unwrap() error { return ErrOutOfMemory }
