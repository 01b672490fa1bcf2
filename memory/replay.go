package memory

import (
	"fmt"
	"sync"
)

// addrSource hands out address ranges without backing memory: a pool over
// it keeps the books a real one would (Replay), and tests reserve gigabytes
// for free. It checks that only live segments are freed. Its granularity
// is unit's (Granular; 0: none), as the source it stands for has it.
type addrSource struct {
	mu   sync.Mutex
	next uintptr
	live map[uintptr]int64
	unit int64
}

func (s *addrSource) Granularity() int64 { return s.unit }

func newAddrSource() *addrSource { return &addrSource{next: 1 << 32, live: map[uintptr]int64{}} }

func (s *addrSource) Alloc(size int64) (Segment, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	addr := s.next
	s.next += uintptr(size) + 4096
	s.live[addr] = size
	return Segment{Addr: addr, Size: size}, nil
}

func (s *addrSource) Free(seg Segment) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live[seg.Addr] != seg.Size {
		return fmt.Errorf("memory: free of unknown segment %#x", seg.Addr)
	}
	delete(s.live, seg.Addr)
	return nil
}

func (s *addrSource) MemInfo() (int64, int64) { return 1 << 50, 1 << 50 }

// liveBytes is what the source has handed out and not had back.
func (s *addrSource) liveBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, sz := range s.live {
		n += sz
	}
	return n
}

// Work is what Replay runs a pool's books through: Standing allocated
// first, then the requests and releases of each of the Traces in turn,
// each buffer at its traced size (a buffer a trace leaves allocated,
// StopTraceLeaving, stays so), then, where Arena is not 0, a planned
// step's arena of that size, made as train's Step makes it: the cache
// emptied, a segment of its own (NewArena).
type Work struct {
	Standing []int64
	Traces   []*Trace
	Arena    int64
}

// Replay runs the books of a pool like a (its configuration, and its
// source's granularity, over no memory) through w under a cap of limit
// bytes (0: none). It returns the most the books had allocated and
// reserved during the last trace, or an error wrapping ErrOutOfMemory
// where a request (or the arena) found no room under the cap, as the work
// itself would in a pool like a that starts empty.
func (a *Allocator) Replay(limit int64, w Work) (allocated, reserved int64, err error) {
	src := newAddrSource()
	if g, ok := a.src.(Granular); ok {
		src.unit = g.Granularity()
	}
	cfg := a.cfg
	cfg.Device = "the books of " + cfg.Device
	books := New(src, cfg)
	if err := books.SetLimit(limit); err != nil {
		return 0, 0, err
	}
	for _, s := range w.Standing {
		if _, err := books.Alloc(s, 0); err != nil {
			return 0, 0, err
		}
	}
	for _, t := range w.Traces {
		books.WindowPeak()
		at := make([]int, t.Events) // the buffer each event requests (i+1) or releases (-(i+1))
		for i, b := range t.Buffers {
			at[b.Alloc] = i + 1
			if b.Free < t.Events {
				at[b.Free] = -(i + 1)
			}
		}
		blocks := make([]*Block, len(t.Buffers))
		for _, e := range at {
			switch {
			case e < 0:
				books.Free(blocks[-e-1])
			case e > 0:
				b := t.Buffers[e-1]
				size := b.Sizes[b.Taken]
				if len(b.Asked) == len(b.Sizes) {
					size = b.Asked[b.Taken]
				}
				if blocks[e-1], err = books.Alloc(size, 0); err != nil {
					return 0, 0, err
				}
			}
		}
	}
	allocated, reserved = books.WindowPeak()
	if w.Arena > 0 {
		books.EmptyCache()
		if _, err := books.NewArena(w.Arena); err != nil {
			return 0, 0, err
		}
	}
	return allocated, reserved, nil
}
