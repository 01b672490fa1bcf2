package memory

import (
	"cmp"
	"runtime"
	"slices"
	"strings"
	"time"
)

// The allocator's history is what a memory snapshot shows: every segment
// and block alive, where each was allocated, and the last events (allocs,
// frees, segment allocs and frees, OOMs) with the Go call sites that caused
// them, as PyTorch's torch.cuda.memory._record_memory_history records for
// its snapshots. WriteSnapshot writes it in the pickle format that PyTorch's
// memory viewer (pytorch.org/memory_viz) opens.

// HistoryLimit is how many events a history keeps: the latest, as
// PyTorch's max_entries does.
const HistoryLimit = 100_000

// maxFrames is how many call sites an event keeps.
const maxFrames = 24

// TraceEvent is one event of the history.
type TraceEvent struct {
	Action string // "alloc", "free_completed", "segment_alloc", "segment_free", "oom"
	Addr   uintptr
	Size   int64
	Time   time.Duration // since recording started
	Free   int64         // for "oom": the source's free bytes
	pcs    []uintptr
}

type history struct {
	start  time.Time
	events []TraceEvent // a ring of at most HistoryLimit
	next   int          // where the next event goes once the ring is full
}

// RecordHistory starts (on) or stops (off) recording the history that
// Snapshot returns. Starting discards an earlier history; stopping keeps it
// for Snapshot. While it records, every allocation takes its call stack
// (a few hundred nanoseconds).
func (a *Allocator) RecordHistory(on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case on:
		a.hist = &history{start: time.Now()}
		a.histOn = true
	default:
		a.histOn = false
	}
}

// callers is the call stack of an allocator call, outside package memory.
func callers() []uintptr {
	pcs := make([]uintptr, maxFrames)
	return pcs[:runtime.Callers(2, pcs)]
}

// remember records an event of the history, if it is being recorded.
func (a *Allocator) remember(action string, addr uintptr, size int64, pcs []uintptr) {
	if !a.histOn {
		return
	}
	h := a.hist
	e := TraceEvent{Action: action, Addr: addr, Size: size, Time: time.Since(h.start), pcs: pcs}
	if len(h.events) < HistoryLimit {
		h.events = append(h.events, e)
		return
	}
	h.events[h.next] = e
	h.next = (h.next + 1) % HistoryLimit
}

// Frame is one call site: the function, its file and line.
type Frame struct {
	Function string
	File     string
	Line     int
}

// Frames resolves the event's call stack, innermost first, leaving out the
// runtime's and this package's frames.
func (e TraceEvent) Frames() []Frame { return frames(e.pcs) }

func frames(pcs []uintptr) []Frame {
	if len(pcs) == 0 {
		return nil
	}
	var out []Frame
	fs := runtime.CallersFrames(pcs)
	for {
		f, more := fs.Next()
		inside := strings.HasPrefix(f.Function, "runtime.") ||
			strings.HasPrefix(f.Function, "github.com/leangrad/leangrad/memory.") && !strings.HasSuffix(f.File, "_test.go")
		if f.Function != "" && !inside {
			out = append(out, Frame{Function: f.Function, File: f.File, Line: f.Line})
		}
		if !more {
			return out
		}
	}
}

// SnapshotBlock is one block of a segment, in address order.
type SnapshotBlock struct {
	Addr      uintptr
	Size      int64
	Requested int64 // 0 when free
	Allocated bool
	Frames    []Frame // where it was allocated, if the history was recording then
}

// SnapshotSegment is one segment the allocator holds.
type SnapshotSegment struct {
	Addr   uintptr
	Size   int64
	Pool   PoolKind
	Arena  bool // a planned step's arena: its blocks are the plan's, shown as one
	Blocks []SnapshotBlock
	Frames []Frame // where it was obtained
}

// Snapshot is the allocator's state and its recent history.
type Snapshot struct {
	Device   string
	Segments []SnapshotSegment
	Trace    []TraceEvent // oldest first
}

// Snapshot returns every segment with its blocks, and the history recorded
// (RecordHistory), oldest event first.
func (a *Allocator) Snapshot() Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := Snapshot{Device: a.cfg.Device}
	for seg := range a.segs {
		ss := SnapshotSegment{Addr: seg.Addr, Size: seg.Size, Pool: seg.pool.kind, Arena: seg.arena, Frames: frames(seg.pcs)}
		if seg.arena {
			ss.Blocks = []SnapshotBlock{{Addr: seg.Addr, Size: seg.Size, Requested: seg.Size, Allocated: true, Frames: ss.Frames}}
		} else {
			for b := seg.first; b != nil; b = b.next {
				ss.Blocks = append(ss.Blocks, SnapshotBlock{Addr: b.Addr(), Size: b.size, Requested: b.requested,
					Allocated: b.allocated, Frames: frames(b.pcs)})
			}
		}
		s.Segments = append(s.Segments, ss)
	}
	sortSegments(s.Segments)
	if h := a.hist; h != nil {
		s.Trace = append(append(s.Trace, h.events[h.next:]...), h.events[:h.next]...)
	}
	return s
}

func sortSegments(ss []SnapshotSegment) {
	slices.SortFunc(ss, func(x, y SnapshotSegment) int { return cmp.Compare(x.Addr, y.Addr) })
}
