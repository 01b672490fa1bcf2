package memory

import (
	"fmt"
	"sort"
)

// Category is what a traced buffer holds, in the terms of PyTorch's memory
// profiler: the work that made the buffer says so (Allocator.SetRole), and
// a report of what a step holds at its peak adds the buffers up by it.
type Category uint8

// The categories. Parameters, optimiser state and the batch live before
// a step starts, outside its trace.
const (
	Temporary         Category = iota // nothing said: temporaries, the loss, metrics
	Activation                        // saved for the backward
	Gradient                          // a gradient the backward passes on
	ParameterGradient                 // a parameter's gradient, kept for the optimiser
	Workspace                         // one call's scratch (AllocWorkspace)
)

var categoryNames = [...]string{"temporary", "activation", "gradient", "parameter gradient", "workspace"}

// String is the category in the report's words ("parameter gradient").
func (c Category) String() string {
	if int(c) < len(categoryNames) {
		return categoryNames[c]
	}
	return fmt.Sprintf("Category(%d)", int(c))
}

// Role is what a traced buffer holds and for which operation.
type Role struct {
	Category Category
	// Op is the operation that saved the buffer (Activation) or whose
	// backward made it (Gradient).
	Op string
	// Recomputed: a checkpoint's recomputation made it.
	Recomputed bool
}

// TracePhase marks where in the traced work an event falls.
type TracePhase struct {
	Event int    // the first event of the phase
	Name  string // what the work was doing ("the backward of conv2d")
}

// Tracing reports whether some goroutine is recording a trace: callers
// check it before building the arguments of SetRole and Phase.
func (a *Allocator) Tracing() bool { return a.tracing.Load() }

// SetRole says what b holds, for the trace being recorded: it does nothing
// unless the calling goroutine traces and b is one of its buffers. The
// first role given stands, unless replace.
func (a *Allocator) SetRole(b *Block, r Role, replace bool) {
	if b == nil || !a.tracing.Load() {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.trace == nil || !a.mine() {
		return
	}
	if i, ok := a.trace.open[b]; ok {
		tb := &a.trace.buffers[i]
		if replace || tb.Role == (Role{}) {
			tb.Role = r
		}
	}
}

// Phase marks that the traced work enters the phase name, which lasts
// until the next mark (Trace.PhaseAt); it does nothing unless the calling
// goroutine traces.
func (a *Allocator) Phase(name string) {
	if !a.tracing.Load() {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if ts := a.trace; ts != nil && a.mine() {
		if n := len(ts.phases); n > 0 && ts.phases[n-1].Event == ts.events {
			ts.phases[n-1].Name = name // no event in between
			return
		}
		ts.phases = append(ts.phases, TracePhase{Event: ts.events, Name: name})
	}
}

// Peak is the event at which the most bytes are live with every buffer
// at the given size choice (nil: each buffer's first size), and those
// bytes (MaxLive). Of equal peaks it returns the first.
func (t *Trace) Peak(choice []int) (event int, live int64) {
	delta := make([]int64, t.Events+1)
	for i, b := range t.Buffers {
		s := b.Sizes[choiceOf(choice, i)]
		delta[b.Alloc] += s
		delta[b.Free] -= s
	}
	var now int64
	for e, d := range delta {
		now += d
		if now > live {
			event, live = e, now
		}
	}
	return event, live
}

func choiceOf(choice []int, i int) int {
	if choice == nil {
		return 0
	}
	return choice[i]
}

// LiveAt lists the buffers live at event, in the order of their requests.
func (t *Trace) LiveAt(event int) []int {
	var live []int
	for i, b := range t.Buffers {
		if b.Alloc <= event && event < b.Free {
			live = append(live, i)
		}
	}
	return live
}

// PhaseAt is the name of the phase event falls in ("" before the first).
func (t *Trace) PhaseAt(event int) string {
	k := sort.Search(len(t.Phases), func(k int) bool { return t.Phases[k].Event > event })
	if k == 0 {
		return ""
	}
	return t.Phases[k-1].Name
}
