package cuda

import (
	"errors"
	"sort"
	"time"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
)

// Profiling: with StartProfile on, an event is recorded on the stream before
// every operation the backend queues (kernel, library call, copy, memset),
// and StopProfile attributes the device time between consecutive events to
// the operation that started there. The stream runs one operation at a
// time, so the times add up to the device time of the work, and to the
// stream's idle time after each read into host memory or synchronization,
// which counts as kernels.IdleOp. Recording an event per operation adds
// host time: profile to see where device time goes, not to time a step.
// A graph's replay counts as one operation.

type profiler struct {
	events []uintptr
	names  []string
	spare  []uintptr
}

// queued counts an operation about to be queued, and marks its start.
func (b *Backend) queued(op string) {
	b.launches++
	b.mark(op)
}

// mark records where op starts on the stream when profiling (not while
// capturing: a graph records no events of ours).
func (b *Backend) mark(op string) {
	p := b.prof
	if p == nil || b.capturing {
		return
	}
	var ev uintptr
	if n := len(p.spare); n > 0 {
		ev, p.spare = p.spare[n-1], p.spare[:n-1]
	} else {
		b.d.must("cuEventCreate", b.d.eventCreate(unsafe.Pointer(&ev), 0))
	}
	b.d.must("cuEventRecord", b.d.eventRecord(ev, b.stream))
	p.events, p.names = append(p.events, ev), append(p.names, op)
}

// StartProfile starts attributing device time to operations.
func (b *Backend) StartProfile() {
	b.enter()
	defer b.exit()
	b.prof = &profiler{}
}

// StopProfile waits for the stream and returns the device time of each kind
// of operation queued since StartProfile, the most first.
func (b *Backend) StopProfile() ([]kernels.OpTime, error) {
	b.enter()
	defer b.exit()
	p := b.prof
	if p == nil {
		return nil, errors.New("cuda: StopProfile without StartProfile")
	}
	b.prof = nil
	var end uintptr
	b.d.must("cuEventCreate", b.d.eventCreate(unsafe.Pointer(&end), 0))
	p.events = append(p.events, end)
	b.d.must("cuEventRecord", b.d.eventRecord(end, b.stream))
	defer func() {
		for _, ev := range append(p.events, p.spare...) {
			b.d.eventDestroy(ev)
		}
	}()
	if err := b.d.check("cuEventSynchronize", b.d.eventSynchronize(end)); err != nil {
		return nil, err
	}
	by := map[string]*kernels.OpTime{}
	for i, name := range p.names {
		var ms float32
		if err := b.d.check("cuEventElapsedTime", b.d.eventElapsedTime(unsafe.Pointer(&ms), p.events[i], p.events[i+1])); err != nil {
			return nil, err
		}
		t := by[name]
		if t == nil {
			t = &kernels.OpTime{Op: name}
			by[name] = t
		}
		t.Count++
		t.MS += float64(ms)
	}
	out := make([]kernels.OpTime, 0, len(by))
	for _, t := range by {
		out = append(out, *t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].MS > out[j].MS })
	return out, nil
}

type spinArgs struct{ Ns int64 }

var kSpin = declareKernel[spinArgs]("spin")

// Delay queues a kernel that keeps the stream busy for d.
func (b *Backend) Delay(d time.Duration) {
	b.enter()
	defer b.exit()
	kSpin.launch(b, 0, dims{1, 1, 1}, spinArgs{int64(d)})
}
