package memory

import (
	"errors"
	"fmt"
	"runtime"
	"syscall"
)

// Tracing, planning and arenas: how a fixed sequence of work (a training
// step whose shapes do not change) gets its memory from one planned
// reservation instead of from the caching pools.
//
//  1. StartTrace, run the work once, StopTrace: the Trace records every
//     buffer the work allocated, with its sizes and lifetime.
//  2. PlanTrace places the buffers at offsets of one arena (plan.go).
//  3. NewArena reserves the plan's Size; BeginPlanned(plan, arena) serves the
//     work's requests, in order, at their planned offsets; EndPlanned checks
//     that the work asked for exactly what was traced.
//
// While an arena is in use (between BeginPlanned and EndPlanned, and for
// each Replayed call) the statistics count it as one allocation of its whole
// size: its bytes are reserved once and the plan decides their use, so the
// step's peak allocated is the arena plus what lives outside it. Requests
// made while a plan is in use are all taken to be the plan's: other work on
// the same allocator must wait until EndPlanned.

// ErrPlanMismatch is wrapped by the errors of a planned run that did not
// repeat its trace: a request of another size, or in another order.
var ErrPlanMismatch = errors.New("the work did not repeat the traced allocations")

type traceState struct {
	buffers []TraceBuffer
	events  int
	phases  []TracePhase
	open    map[*Block]int
}

type plannedState struct {
	plan   *Plan
	arena  *Arena
	next   int
	events int
	open   map[*Block]int
	err    error
}

// StartTrace starts recording every allocation and free that the calling
// goroutine makes (see Note [the planner's goroutine]) as a Trace. Blocks
// allocated before it are not part of the trace; freeing them is ignored.
// The same goroutine calls StopTrace.
func (a *Allocator) StartTrace() {
	runtime.LockOSThread()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.trace = &traceState{open: map[*Block]int{}}
	a.owner = syscall.Gettid()
	a.tracing.Store(true)
}

// Note [the planner's goroutine]: tracing and planned serving concern the
// work of one goroutine, the one that called StartTrace or BeginPlanned,
// which stays on its OS thread until StopTrace or EndPlanned (the calls lock
// and unlock it). Requests from every other goroutine go to the pools as
// usual, unseen by the trace and untouched by the plan: a goroutine serving
// a model on a session of the same device may allocate while a training
// step is traced or planned, and neither disturbs the other's sequence of
// requests (a trace that took every request of the device would not repeat,
// and the planned step would fail with ErrPlanMismatch; train's
// TestTrainingBesideInference runs its steps planned beside such
// goroutines).

// mine reports whether the calling goroutine is the one tracing or planned.
// a.mu is held.
func (a *Allocator) mine() bool { return syscall.Gettid() == a.owner }

// StopTrace ends the recording. It fails when a traced buffer is still
// allocated: work that is to be planned must free everything it allocates.
func (a *Allocator) StopTrace() (*Trace, error) { return a.stopTrace(false) }

// StopTraceLeaving ends the recording of work that leaves some of what it
// allocated (a first training step, which makes the optimiser's state):
// the buffers still allocated are freed at the trace's last event, Events,
// in its record; only Replay takes such a trace.
func (a *Allocator) StopTraceLeaving() (*Trace, error) { return a.stopTrace(true) }

func (a *Allocator) stopTrace(leaving bool) (*Trace, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ts := a.trace
	if ts == nil {
		return nil, errors.New("memory: StopTrace without StartTrace")
	}
	a.trace, a.owner = nil, 0
	a.tracing.Store(false)
	defer runtime.UnlockOSThread() // StartTrace's lock
	if leaving {
		for _, i := range ts.open {
			ts.buffers[i].Free = ts.events
		}
	} else if len(ts.open) > 0 {
		var bytes int64
		for b := range ts.open {
			bytes += b.size
		}
		return nil, fmt.Errorf("memory: the traced work left %d buffers (%s) allocated; planned work must free all it allocates",
			len(ts.open), Bytes(bytes))
	}
	return &Trace{Buffers: ts.buffers, Events: ts.events, Phases: ts.phases}, nil
}

func (ts *traceState) alloc(b *Block, sizes, asked []int64, taken int) {
	ts.open[b] = len(ts.buffers)
	ts.buffers = append(ts.buffers, TraceBuffer{Sizes: sizes, Asked: asked, Taken: taken, Alloc: ts.events})
	ts.events++
}

func (ts *traceState) free(b *Block) {
	if i, ok := ts.open[b]; ok {
		ts.buffers[i].Free = ts.events
		ts.events++
		delete(ts.open, b)
	}
}

// Arena is one segment reserved for planned work.
type Arena struct {
	a   *Allocator
	seg *segment
}

// NewArena reserves size bytes (rounded up to MinBlockSize, and to the
// source's granularity: Granular) as one segment of its own, counted in the
// large pool's reserved bytes. It fails with an *OOMError when the source
// cannot provide them even after the cache is flushed.
func (a *Allocator) NewArena(size int64) (*Arena, error) {
	size = a.exact(RoundSize(max(size, 1)))
	a.mu.Lock()
	defer a.mu.Unlock()
	b, err := a.grow(&a.large, size, size, 0, false) // a segment of its own
	if err != nil {
		return nil, err
	}
	b.seg.arena = true
	return &Arena{a: a, seg: b.seg}, nil
}

// Size is the arena's size in bytes.
func (ar *Arena) Size() int64 { return ar.seg.Size }

// Release returns the arena's segment to the source.
func (ar *Arena) Release() error {
	a := ar.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if ar.seg == nil {
		return nil
	}
	if a.planned != nil && a.planned.arena == ar {
		return errors.New("memory: release of an arena in use")
	}
	if err := a.src.Free(ar.seg.Segment); err != nil {
		return err
	}
	a.stats.Segments.sub(Large, 1)
	a.stats.Reserved.sub(Large, ar.seg.Size)
	a.record(EventSegmentFree, ar.seg.Size)
	a.remember("segment_free", ar.seg.Addr, ar.seg.Size, nil)
	delete(a.segs, ar.seg)
	ar.seg = nil
	return nil
}

// BeginPlanned makes the allocator serve the calling goroutine's requests
// from plan inside arena, which must be at least plan.Size bytes, until it
// calls EndPlanned (Note [the planner's goroutine]).
func (a *Allocator) BeginPlanned(plan *Plan, arena *Arena) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.planned != nil:
		return errors.New("memory: BeginPlanned while a plan is already in use")
	case a.trace != nil:
		return errors.New("memory: BeginPlanned while tracing")
	case arena.seg == nil || arena.seg.Size < plan.Size:
		return fmt.Errorf("memory: arena too small for a plan of %s", Bytes(plan.Size))
	}
	runtime.LockOSThread()
	a.planned = &plannedState{plan: plan, arena: arena, open: map[*Block]int{}}
	a.owner = syscall.Gettid()
	a.useArena(arena.seg.Size, +1)
	return nil
}

// EndPlanned stops serving requests from the plan. It reports a mismatch if
// the work made other requests than the trace, or left planned buffers
// allocated.
func (a *Allocator) EndPlanned() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	ps := a.planned
	if ps == nil {
		return errors.New("memory: EndPlanned without BeginPlanned")
	}
	a.planned, a.owner = nil, 0
	defer runtime.UnlockOSThread() // BeginPlanned's lock
	a.useArena(ps.arena.seg.Size, -1)
	if ps.err != nil {
		return ps.err
	}
	if ps.next != len(ps.plan.Trace.Buffers) || len(ps.open) > 0 {
		return fmt.Errorf("memory: %d of %d planned buffers requested, %d still allocated: %w",
			ps.next, len(ps.plan.Trace.Buffers), len(ps.open), ErrPlanMismatch)
	}
	return nil
}

// Replayed accounts for one more run of planned work that made no requests
// of its own (a replayed CUDA graph): the arena counts as allocated and
// freed once, so that the peaks and totals show the run.
func (a *Allocator) Replayed(arena *Arena) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.useArena(arena.seg.Size, +1)
	a.useArena(arena.seg.Size, -1)
}

// useArena counts the arena as one allocation in use (dir +1) or not (-1).
func (a *Allocator) useArena(size int64, dir int64) {
	for _, s := range []*StatArray{&a.stats.Allocated, &a.stats.Active, &a.stats.Requested} {
		if dir > 0 {
			s.add(Large, size)
		} else {
			s.sub(Large, size)
		}
	}
	if dir > 0 {
		a.stats.Allocations.add(Large, 1)
		a.stats.ActiveBlocks.add(Large, 1)
		a.window.allocated = max(a.window.allocated, a.stats.Allocated[All].Current)
		a.record(EventAlloc, size)
	} else {
		a.stats.Allocations.sub(Large, 1)
		a.stats.ActiveBlocks.sub(Large, 1)
		a.record(EventFree, size)
	}
}

// plannedAlloc serves the next planned buffer (the caller holds the lock).
func (ps *plannedState) alloc(sizes []int64, stream Stream) (*Block, int, error) {
	if ps.err != nil {
		return nil, 0, ps.err
	}
	bs := ps.plan.Trace.Buffers
	if ps.next >= len(bs) {
		ps.err = fmt.Errorf("memory: request %d of a plan of %d buffers: %w", ps.next+1, len(bs), ErrPlanMismatch)
		return nil, 0, ps.err
	}
	i := ps.next
	tb := bs[i]
	if tb.Alloc != ps.events || !equalSizes(tb.Sizes, sizes) {
		ps.err = fmt.Errorf("memory: request %d is %v bytes at event %d, the trace has %v at event %d: %w",
			i+1, sizes, ps.events, tb.Sizes, tb.Alloc, ErrPlanMismatch)
		return nil, 0, ps.err
	}
	ps.next++
	ps.events++
	c := ps.plan.Choice[i]
	b := &Block{seg: ps.arena.seg, off: ps.plan.Offsets[i], size: tb.Sizes[c], stream: stream, allocated: true}
	ps.open[b] = i
	return b, c, nil
}

func (ps *plannedState) free(b *Block) {
	i, ok := ps.open[b]
	if !ok {
		if ps.err == nil {
			ps.err = fmt.Errorf("memory: free of a planned block that is not open: %w", ErrPlanMismatch)
		}
		return
	}
	delete(ps.open, b)
	if ps.err == nil && ps.plan.Trace.Buffers[i].Free != ps.events {
		ps.err = fmt.Errorf("memory: planned buffer %d freed at event %d, the trace frees it at %d: %w",
			i+1, ps.events, ps.plan.Trace.Buffers[i].Free, ErrPlanMismatch)
	}
	ps.events++
}

func equalSizes(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != RoundSize(b[i]) {
			return false
		}
	}
	return true
}

// WorkspacePolicy says which size AllocWorkspace gives outside a plan.
type WorkspacePolicy int

// The workspace policies.
const (
	WorkspaceAsAsked  WorkspacePolicy = iota // the caller's choice (its eager policy)
	WorkspaceSmallest                        // the smallest option: the least memory
)

// SetWorkspacePolicy sets the policy of AllocWorkspace outside a plan and
// returns the one before.
func (a *Allocator) SetWorkspacePolicy(p WorkspacePolicy) WorkspacePolicy {
	a.mu.Lock()
	defer a.mu.Unlock()
	old := a.wsPolicy
	a.wsPolicy = p
	return old
}

// WorkspaceOption is one size a workspace may take (the workspace of one
// algorithm), and how long that algorithm takes, in milliseconds as the
// caller measured it (0 if unknown).
type WorkspaceOption struct {
	Size int64
	Time float32
}

// AllocWorkspace returns scratch space that may take any of the sizes of
// options (a workspace whose algorithm is still to be chosen; the caller
// lists them fastest first), and the index of the option it got. Outside a
// plan it allocates options[eager], or the smallest under
// WorkspaceSmallest; while tracing it records every option; inside a plan
// it returns the one the plan chose.
func (a *Allocator) AllocWorkspace(options []WorkspaceOption, eager int, stream Stream) (*Block, int, error) {
	if len(options) == 0 || eager < 0 || eager >= len(options) {
		panic(fmt.Sprintf("memory: AllocWorkspace of options %v, eager choice %d", options, eager))
	}
	sizes := make([]int64, len(options))
	times := make([]float32, len(options))
	for i, o := range options {
		sizes[i], times[i] = o.Size, o.Time
	}
	a.mu.Lock()
	if ps := a.planned; ps != nil && a.mine() {
		defer a.mu.Unlock()
		return ps.alloc(sizes, stream)
	}
	if a.wsPolicy == WorkspaceSmallest {
		for i, s := range sizes {
			if s < sizes[eager] {
				eager = i
			}
		}
	}
	a.mu.Unlock()
	b, err := a.alloc(sizes[eager], stream, sizes, eager)
	if err == nil {
		a.mu.Lock()
		if a.trace != nil {
			if i, ok := a.trace.open[b]; ok { // traced: the tracing goroutine's
				a.trace.buffers[i].Times = times
				a.trace.buffers[i].Role = Role{Category: Workspace}
			}
		}
		a.mu.Unlock()
	}
	return b, eager, err
}
