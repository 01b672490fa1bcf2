package tensor

import (
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

var (
	debug    atomic.Bool
	nextID   atomic.Uint64
	liveN    atomic.Int64
	leaks    atomic.Int64
	registry sync.Map // *handle -> *liveInfo, debug mode only

	pendingMu sync.Mutex
	pending   []*handle    // leaked handles waiting to be freed on a tensor-making goroutine
	pendingN  atomic.Int32 // len(pending), read without the lock on every tensor creation
)

// SetDebug turns debug mode on or off. In debug mode every new tensor
// records its creation site, which LiveTensors and use-after-release panics
// report.
func SetDebug(on bool) { debug.Store(on) }

// LiveTensor describes one tensor that has not been released.
type LiveTensor struct {
	ID     uint64
	Desc   string // dtype, shape and device
	Bytes  int64
	Site   string // creation site: the first caller outside leangrad's own packages
	Leaked bool   // collected by the garbage collector without Release
}

type liveInfo = LiveTensor

func track(t *Tensor) {
	liveN.Add(1)
	if !debug.Load() {
		return
	}
	info := &liveInfo{ID: nextID.Add(1), Desc: t.desc(), Bytes: t.Bytes(), Site: callerSite()}
	t.h.info = info
	registry.Store(t.h, info)
}

func untrack(h *handle) {
	liveN.Add(-1)
	if h.info != nil {
		registry.Delete(h)
	}
}

// callerSite names the first stack frame outside leangrad's tensor, autograd
// and nn internals: the user code that created the tensor.
func callerSite() string {
	pcs := make([]uintptr, 32)
	n := runtime.Callers(3, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	var first string
	for {
		f, more := frames.Next()
		site := fmt.Sprintf("%s (%s:%d)", f.Function, f.File, f.Line)
		if first == "" {
			first = site
		}
		if !internalFrame(f.Function) {
			return site
		}
		if !more {
			return first
		}
	}
}

func internalFrame(fn string) bool {
	for _, p := range []string{"leangrad/tensor.", "leangrad/autograd.", "leangrad/nn.", "leangrad/optim.", "runtime."} {
		if strings.Contains(fn, p) && !strings.Contains(fn, "_test.") && !strings.Contains(fn, ".Test") {
			return true
		}
	}
	return false
}

// collectLeak runs when the garbage collector finds a tensor that was never
// released. It counts the leak and queues the handle; the memory goes back to
// the pool at the next tensor creation (or CollectLeaks), on a goroutine that
// may touch autograd state.
func collectLeak(h *handle) {
	leaks.Add(1)
	if h.info != nil {
		h.info.Leaked = true
	}
	pendingMu.Lock()
	pending = append(pending, h)
	pendingN.Store(int32(len(pending)))
	pendingMu.Unlock()
}

func drainLeaked() {
	if pendingN.Load() == 0 {
		return
	}
	pendingMu.Lock()
	hs := pending
	pending = nil
	pendingN.Store(0)
	pendingMu.Unlock()
	for _, h := range hs {
		if h.refs.Swap(0) > 0 {
			h.free()
		}
	}
}

// CollectLeaks runs the garbage collector and returns the memory of every
// tensor it finds unreferenced and unreleased to the pool. It returns the
// total number of leaks seen so far.
func CollectLeaks() int64 {
	for i := 0; i < 2; i++ {
		runtime.GC()
	}
	// Cleanups run on their own goroutine after the collection; give them a moment.
	for i := 0; i < 100; i++ {
		if pendingN.Load() > 0 {
			break
		}
		runtime.Gosched()
	}
	drainLeaked()
	return leaks.Load()
}

// Leaks is the number of tensors the garbage collector found unreleased.
func Leaks() int64 { return leaks.Load() }

// LiveCount is the number of tensor handles not yet released.
func LiveCount() int64 { return liveN.Load() }

// LiveTensors lists the tensors created in debug mode and not yet released,
// largest first. Tensors created with debug mode off are not listed.
func LiveTensors() []LiveTensor {
	var out []LiveTensor
	registry.Range(func(_, v any) bool {
		out = append(out, *v.(*liveInfo))
		return true
	})
	sort.Slice(out, func(i, j int) bool {
		if out[i].Bytes != out[j].Bytes {
			return out[i].Bytes > out[j].Bytes
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// LiveReport formats LiveTensors grouped by creation site, largest total first.
func LiveReport() string {
	type group struct {
		site  string
		n     int
		bytes int64
		desc  string
	}
	groups := map[string]*group{}
	for _, t := range LiveTensors() {
		g := groups[t.Site]
		if g == nil {
			g = &group{site: t.Site, desc: t.Desc}
			groups[t.Site] = g
		}
		g.n++
		g.bytes += t.Bytes
	}
	var gs []*group
	for _, g := range groups {
		gs = append(gs, g)
	}
	sort.Slice(gs, func(i, j int) bool { return gs[i].bytes > gs[j].bytes })
	var b strings.Builder
	for _, g := range gs {
		fmt.Fprintf(&b, "%10d bytes in %5d tensors (e.g. %s) created at %s\n", g.bytes, g.n, g.desc, g.site)
	}
	return b.String()
}
