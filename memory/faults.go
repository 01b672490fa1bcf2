package memory

import (
	"fmt"
	"math/rand/v2"
	"sync"
)

// Faults says which allocations a FaultySource fails.
type Faults struct {
	// Every fails every Every-th allocation (0: none this way).
	Every int
	// Probability fails each allocation with this probability, drawn from
	// a generator seeded with Seed (0: none this way).
	Probability float64
	Seed        uint64
	// Burst fails this many calls in a row at each fault (0 or 1: one).
	// The Allocator retries a failed segment allocation after flushing its
	// cache, so a burst of 3 is what reaches its caller as an OOM.
	Burst int
	// Max stops injecting after Max faults (0: no end).
	Max int
}

// FaultySource is a Source that fails chosen allocations with an error
// wrapping ErrOutOfMemory, as an exhausted device would, and passes the
// others to the source it wraps. Tests drive out-of-memory recovery with
// it. It is safe for concurrent use.
type FaultySource struct {
	src      Source
	faults   Faults
	mu       sync.Mutex
	rng      *rand.Rand
	calls    int
	injected int // faults
	pending  int // calls of the current burst still to fail
}

// Inject wraps src so that the allocations f picks fail.
func Inject(src Source, f Faults) *FaultySource {
	s := &FaultySource{src: src}
	s.Set(f)
	return s
}

// Set replaces the faults, counting calls and faults from now on.
func (s *FaultySource) Set(f Faults) {
	if f.Every < 0 || f.Probability < 0 || f.Probability > 1 || f.Max < 0 || f.Burst < 0 {
		panic(fmt.Sprintf("memory: faults %+v", f))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults, s.calls, s.pending, s.injected = f, 0, 0, 0
	s.rng = rand.New(rand.NewPCG(f.Seed, f.Seed^0x9e3779b97f4a7c15))
}

// Alloc fails when the faults say so, and allocates from the wrapped source
// otherwise.
func (s *FaultySource) Alloc(size int64) (Segment, error) {
	s.mu.Lock()
	s.calls++
	if s.pending > 0 {
		s.pending--
		n, c := s.injected, s.calls
		s.mu.Unlock()
		return Segment{}, fmt.Errorf("injected fault %d (allocation %d of %d bytes): %w", n, c, size, ErrOutOfMemory)
	}
	fault := s.faults.Every > 0 && s.calls%s.faults.Every == 0
	if s.faults.Probability > 0 && s.rng.Float64() < s.faults.Probability {
		fault = true
	}
	if fault && (s.faults.Max == 0 || s.injected < s.faults.Max) {
		s.injected++
		s.pending = max(s.faults.Burst, 1) - 1
		n, c := s.injected, s.calls
		s.mu.Unlock()
		return Segment{}, fmt.Errorf("injected fault %d (allocation %d of %d bytes): %w", n, c, size, ErrOutOfMemory)
	}
	s.mu.Unlock()
	return s.src.Alloc(size)
}

// Free returns a segment to the wrapped source.
func (s *FaultySource) Free(seg Segment) error { return s.src.Free(seg) }

// MemInfo is the wrapped source's.
func (s *FaultySource) MemInfo() (free, total int64) { return s.src.MemInfo() }

// Injected is the number of faults injected so far (each a burst of failed
// calls), and of allocations asked for.
func (s *FaultySource) Injected() (faults, calls int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.injected, s.calls
}
