package cuda

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"unsafe"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/memory"
)

var _ kernels.PinnedCopier = (*Backend)(nil)

// pinnedSource is a raw allocator of page-locked host memory
// (cuMemHostAlloc) for a CPU pool: the host side of direct copies. Like
// deviceSource it takes no backend lock and makes the context current
// itself. It keeps the address ranges it handed out, so that Read,
// StartRead and StartWrite can tell its memory from the Go heap's, and it
// counts them against the host's memory (memory.HostMemory).
type pinnedSource struct {
	b      *Backend
	mu     sync.Mutex
	ranges []pinnedRange // sorted by start
	used   int64
	total  int64
}

type pinnedRange struct{ start, end uintptr }

// PinnedSource is the backend's allocator of page-locked host memory (one
// per backend: its segments must be freed before Close).
func (b *Backend) PinnedSource() memory.Source {
	b.pinnedOnce.Do(func() { b.pinned = &pinnedSource{b: b, total: memory.HostMemory()} })
	return b.pinned
}

func (s *pinnedSource) Alloc(size int64) (memory.Segment, error) {
	if size <= 0 {
		return memory.Segment{}, fmt.Errorf("cuda: page-locked segment of %d bytes", size)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used+size > s.total {
		return memory.Segment{}, fmt.Errorf("cuda: %d bytes of page-locked host memory requested, %d of the host's %d in use: %w",
			size, s.used, s.total, memory.ErrOutOfMemory)
	}
	var p unsafe.Pointer
	var err error
	s.b.withContext(func() {
		err = s.b.d.check("cuMemHostAlloc", s.b.d.memHostAlloc(unsafe.Pointer(&p), uintptr(size), 0))
	})
	if isOOM(err) {
		return memory.Segment{}, fmt.Errorf("cuda: %d bytes of page-locked host memory: %v: %w", size, err, memory.ErrOutOfMemory)
	}
	if err != nil {
		return memory.Segment{}, err
	}
	r := pinnedRange{uintptr(p), uintptr(p) + uintptr(size)}
	i := sort.Search(len(s.ranges), func(i int) bool { return s.ranges[i].start > r.start })
	s.ranges = append(s.ranges, pinnedRange{})
	copy(s.ranges[i+1:], s.ranges[i:])
	s.ranges[i] = r
	s.used += size
	memory.NoteOutsideHeap(size)
	return memory.Segment{Addr: uintptr(p), Size: size, Host: unsafe.Slice((*byte)(p), size)}, nil
}

func (s *pinnedSource) Free(seg memory.Segment) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := sort.Search(len(s.ranges), func(i int) bool { return s.ranges[i].start >= seg.Addr })
	if i == len(s.ranges) || s.ranges[i].start != seg.Addr {
		panic(fmt.Sprintf("cuda: freeing page-locked memory at %#x that this backend did not allocate", seg.Addr))
	}
	s.ranges = append(s.ranges[:i], s.ranges[i+1:]...)
	s.used -= seg.Size
	memory.NoteOutsideHeap(-seg.Size)
	var err error
	s.b.withContext(func() {
		err = s.b.d.check("cuMemFreeHost", s.b.d.memFreeHost(unsafe.Pointer(unsafe.SliceData(seg.Host))))
	})
	return err
}

// MemInfo reports the host's memory not yet pinned by this source, and the
// host's total.
func (s *pinnedSource) MemInfo() (free, total int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total - s.used, s.total
}

// holds reports whether mem lies wholly in one of the source's segments.
func (s *pinnedSource) holds(mem []byte) bool {
	if s == nil || len(mem) == 0 {
		return false
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	end := start + uintptr(len(mem))
	s.mu.Lock()
	defer s.mu.Unlock()
	i := sort.Search(len(s.ranges), func(i int) bool { return s.ranges[i].start > start }) - 1
	return i >= 0 && end <= s.ranges[i].end
}

// copyStreams are the streams StartRead and StartWrite queue their copies
// on, made at the first (Note [copies beside the stream] in kernels), with
// the events that order them.
type copyStreams struct {
	down, up uintptr // device to host, host to device
	fork     uintptr // recorded on the backend's stream: what a copy waits for
	join     uintptr // recorded on up: what JoinWrites makes the backend's stream wait for
	written  bool    // a write was queued since the last JoinWrites

	mu   sync.Mutex
	free []uintptr // events of reads waited for or joined
}

// copies returns the copy streams, making them at the first call (with
// the backend entered).
func (b *Backend) copyStreams() *copyStreams {
	if b.copies != nil {
		return b.copies
	}
	c, d := &copyStreams{}, b.d
	for _, s := range []*uintptr{&c.down, &c.up} {
		d.must("cuStreamCreate", d.streamCreate(unsafe.Pointer(s), cuStreamNonBlocking))
	}
	for _, ev := range []*uintptr{&c.fork, &c.join} {
		d.must("cuEventCreate", d.eventCreate(unsafe.Pointer(ev), cuEventDisableTiming))
	}
	b.copies = c
	return c
}

// after makes stream wait for the work queued so far on the backend's.
func (b *Backend) after(stream uintptr) {
	c := b.copies
	b.d.must("cuEventRecord", b.d.eventRecord(c.fork, b.stream))
	b.d.must("cuStreamWaitEvent", b.d.streamWaitEvent(stream, c.fork, 0))
}

// checkPinned panics unless host, n bytes to or from buf, is page-locked
// memory from PinnedSource.
func (b *Backend) checkPinned(what string, host []byte, buf kernels.Buf) {
	if int64(len(host)) != buf.Bytes() {
		panic(fmt.Sprintf("cuda: %s of %d host bytes for a %d-byte buffer", what, len(host), buf.Bytes()))
	}
	if b.pinned == nil || !b.pinned.holds(host) {
		panic(fmt.Sprintf("cuda: %s of %d bytes that are not this backend's page-locked memory", what, len(host)))
	}
}

// copyBeside queues a direct copy between host, page-locked memory from
// PinnedSource, and buf on the copy stream down (or up), after the work
// queued so far on the backend's stream: queue issues it, with the backend
// entered (Note [copies beside the stream] in kernels).
func (b *Backend) copyBeside(what string, host []byte, buf kernels.Buf, up bool, queue func(c *copyStreams, stream uintptr)) {
	b.checkPinned(what, host, buf)
	b.enter()
	defer b.exit()
	c := b.copyStreams()
	stream := c.down
	if up {
		stream = c.up
	}
	b.after(stream)
	b.launches++ // not queued: a profile's events are on the backend's stream
	queue(c, stream)
}

// StartRead queues one direct copy of src into dst, page-locked memory from
// PinnedSource, on the copy stream down, after the work queued so far
// (kernels.PinnedCopier).
func (b *Backend) StartRead(dst []byte, src kernels.Buf) kernels.Transfer {
	var r *read
	b.copyBeside("StartRead", dst, src, false, func(c *copyStreams, down uintptr) {
		b.d.must("cuMemcpyDtoHAsync", b.d.memcpyDtoHAsync(unsafe.Pointer(unsafe.SliceData(dst)), ptrOf(src), uintptr(len(dst)), down))
		c.mu.Lock()
		var ev uintptr
		if n := len(c.free); n > 0 {
			ev, c.free = c.free[n-1], c.free[:n-1]
		}
		c.mu.Unlock()
		if ev == 0 {
			b.d.must("cuEventCreate", b.d.eventCreate(unsafe.Pointer(&ev), cuEventDisableTiming))
		}
		b.d.must("cuEventRecord", b.d.eventRecord(ev, down))
		r = &read{b: b, ev: ev}
	})
	return r
}

// read is a StartRead's copy: its event, recorded after it on the stream
// down, goes back to the free list once waited for or joined (a wait on
// an event is on its last record when it is queued: the event's next
// record, for another copy, does not move it).
type read struct {
	b    *Backend
	once sync.Once
	ev   uintptr
}

// Wait waits for the copy without the backend's lock, so that other
// goroutines queue work meanwhile.
func (r *read) Wait() {
	r.once.Do(func() {
		if r.b.Capturing() {
			panic("cuda: a read into host memory waited for on the host while capturing a graph: Join it")
		}
		r.b.withContext(func() { r.b.d.must("cuEventSynchronize", r.b.d.eventSynchronize(r.ev)) })
		r.free()
	})
}

// Join makes the backend's stream wait for the copy (kernels.Transfer).
func (r *read) Join() {
	r.once.Do(func() {
		b := r.b
		b.enter()
		b.d.must("cuStreamWaitEvent", b.d.streamWaitEvent(b.stream, r.ev, 0))
		b.exit()
		r.free()
	})
}

// free gives the read's event back to the free list.
func (r *read) free() {
	c := r.b.copies
	c.mu.Lock()
	c.free = append(c.free, r.ev)
	c.mu.Unlock()
}

// StartWrite queues one direct copy of src, page-locked memory from
// PinnedSource, into dst on the copy stream up, after the work queued so
// far (kernels.PinnedCopier).
func (b *Backend) StartWrite(dst kernels.Buf, src []byte) {
	b.copyBeside("StartWrite", src, dst, true, func(c *copyStreams, up uintptr) {
		b.d.must("cuMemcpyHtoDAsync", b.d.memcpyHtoDAsync(ptrOf(dst), unsafe.Pointer(unsafe.SliceData(src)), uintptr(len(src)), up))
		c.written = true
	})
}

// JoinWrites makes the backend's stream wait for the writes queued on the
// copy stream up (kernels.PinnedCopier).
func (b *Backend) JoinWrites() {
	b.enter()
	defer b.exit()
	c := b.copies
	if c == nil || !c.written {
		return
	}
	b.d.must("cuEventRecord", b.d.eventRecord(c.join, c.up))
	b.d.must("cuStreamWaitEvent", b.d.streamWaitEvent(b.stream, c.join, 0))
	c.written = false
}

// closeCopies waits for the copy streams and destroys them and their
// events (with the backend entered, from Close).
func (b *Backend) closeCopies() error {
	c := b.copies
	if c == nil {
		return nil
	}
	d := b.d
	var errs []error
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, s := range []uintptr{c.down, c.up} {
		keep(d.check("cuStreamSynchronize", d.streamSynchronize(s)))
		keep(d.check("cuStreamDestroy", d.streamDestroy(s)))
	}
	c.mu.Lock()
	for _, ev := range append(c.free, c.fork, c.join) {
		keep(d.check("cuEventDestroy", d.eventDestroy(ev)))
	}
	c.mu.Unlock()
	b.copies = nil
	return errors.Join(errs...)
}
