package benchmarks

import (
	"sort"
	"time"

	"github.com/leangrad/leangrad/kernels"
)

// hostProfiler times each operation a synchronous backend (the CPU's) runs,
// by kind of operation and dtype: there the host time of a call is the
// operation's run time. It is the profiler of backends without a device
// profiler; Profile runs the steps on a device over it, and
// kernels.Observed makes sure no operation passes by untimed.
type hostProfiler struct {
	kernels.Observed
	by map[string]*kernels.OpTime // nil when not profiling
}

func newHostProfiler(b kernels.Backend) *hostProfiler {
	h := &hostProfiler{}
	h.B, h.Hook = b, h.time
	return h
}

// time starts timing an operation op on operands of dtype dt; the
// function it returns ends it.
func (h *hostProfiler) time(_, op string, dt kernels.DType) func() {
	if h.by == nil {
		return nil
	}
	name := op + " " + dt.String()
	t0 := time.Now()
	return func() {
		t := h.by[name]
		if t == nil {
			t = &kernels.OpTime{Op: name}
			h.by[name] = t
		}
		t.Count++
		t.MS += float64(time.Since(t0).Nanoseconds()) / 1e6
	}
}

// StartProfile starts timing operations.
func (h *hostProfiler) StartProfile() { h.by = map[string]*kernels.OpTime{} }

// StopProfile returns each kind of operation's time since StartProfile, the
// most first.
func (h *hostProfiler) StopProfile() ([]kernels.OpTime, error) {
	out := make([]kernels.OpTime, 0, len(h.by))
	for _, t := range h.by {
		out = append(out, *t)
	}
	h.by = nil
	sort.Slice(out, func(i, j int) bool { return out[i].MS > out[j].MS })
	return out, nil
}

// Delay does nothing: a synchronous backend has no queue to fill.
func (h *hostProfiler) Delay(time.Duration) {}
