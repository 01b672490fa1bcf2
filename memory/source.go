package memory

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/metrics"
	"sync"
	"unsafe"
)

// ErrOutOfMemory is returned (wrapped) by a Source that cannot provide a
// segment because its memory is exhausted, and by Allocator.Alloc when a
// request cannot be met even after the cache was flushed. Test with errors.Is.
var ErrOutOfMemory = errors.New("out of memory")

// Segment is one contiguous region obtained from a Source: a cudaMalloc'd
// range on a GPU, a Go heap slab on the CPU.
type Segment struct {
	// Addr is the segment's base address in the source's address space
	// (a device pointer for CUDA; the slab's address on the host).
	Addr uintptr
	// Size is the segment's length in bytes.
	Size int64
	// Host is the segment's memory when it lives on the Go heap, nil otherwise.
	Host []byte
}

// Source is a raw allocator: the layer under the caching Allocator that really
// obtains and returns memory. Implementations must be safe for concurrent use.
type Source interface {
	// Alloc obtains a segment of exactly size bytes. When the source has no
	// memory left it returns an error wrapping ErrOutOfMemory.
	Alloc(size int64) (Segment, error)
	// Free returns a segment obtained from Alloc.
	Free(Segment) error
	// MemInfo reports the source's free and total bytes, as the driver sees
	// them (cuMemGetInfo on a GPU).
	MemInfo() (free, total int64)
}

// A Granular source hands out memory in units of Granularity bytes: a
// segment of another size takes the next multiple (a GPU's driver maps
// whole pages of 2 MiB). A pool under a cap asks it for such multiples
// when it sizes a segment to a request (Note [exact segments]), so that the
// cap counts what the device gives. A source that is not Granular hands out
// what is asked.
type Granular interface {
	Granularity() int64
}

// HeapSource is the CPU's raw allocator: segments are Go heap slabs. Go's
// garbage collector does not move heap objects, so a slab's address is stable
// for as long as the Segment holding it is referenced.
type HeapSource struct {
	mu    sync.Mutex
	used  int64
	total int64
}

// NewHeapSource returns a Source of Go heap slabs whose total is
// HostMemory: the machine's physical memory, or its control group's limit.
func NewHeapSource() *HeapSource {
	return &HeapSource{total: HostMemory()}
}

// HeapShare is the share of HostMemory that the process's Go heap and the
// host memory it holds outside it (OutsideHeap: page-locked segments) may
// reach with a new segment: the rest is for the runtime, the program and
// the kernel's accounting of it, so that a container's limit is met by the
// pool's error rather than the kernel's kill.
const HeapShare = 0.9

// HostShare is HeapShare of HostMemory: the host memory a run may plan to
// hold, in the Go heap and page-locked together.
func HostShare() int64 { return int64(float64(HostMemory()) * HeapShare) }

// Alloc returns a zeroed Go heap slab of size bytes. It fails with
// ErrOutOfMemory when the segments would pass the source's total, or when
// the Go heap as a whole (the segments and everything else the program
// holds: datasets, host buffers) and the memory held outside the heap
// would pass HeapShare of it even after a garbage collection.
func (h *HeapSource) Alloc(size int64) (Segment, error) {
	if size <= 0 {
		return Segment{}, fmt.Errorf("memory: heap segment of %d bytes", size)
	}
	h.mu.Lock()
	if h.used+size > h.total {
		h.mu.Unlock()
		return Segment{}, fmt.Errorf("heap: %d bytes requested, %d of %d in use: %w", size, h.used, h.total, ErrOutOfMemory)
	}
	heap := int64(float64(h.total)*HeapShare) - OutsideHeap()
	if goHeap()+size > heap {
		runtime.GC() // the segments freed since the last collection
		if g := goHeap(); g+size > heap {
			h.mu.Unlock()
			return Segment{}, fmt.Errorf("heap: %d bytes requested, %d in the pool and %d elsewhere in the Go heap, of the %d it may hold (%.0f%% of %d, less %d page-locked): %w",
				size, h.used, max(g-h.used, 0), heap, 100*HeapShare, h.total, OutsideHeap(), ErrOutOfMemory)
		}
	}
	h.used += size
	h.mu.Unlock()
	buf := make([]byte, size)
	return Segment{Addr: uintptr(unsafe.Pointer(&buf[0])), Size: size, Host: buf}, nil
}

// goHeap is the bytes of the Go heap's objects, live or not yet swept.
func goHeap() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// Free forgets the slab; the garbage collector reclaims it.
func (h *HeapSource) Free(s Segment) error {
	h.mu.Lock()
	h.used -= s.Size
	h.mu.Unlock()
	return nil
}

// MemInfo reports the bytes not yet handed out and the machine's total.
func (h *HeapSource) MemInfo() (free, total int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.total - h.used, h.total
}

// LimitedSource caps another Source at a fixed capacity. Tests use it to drive
// out-of-memory, retry and fragmentation paths deterministically.
type LimitedSource struct {
	src      Source
	mu       sync.Mutex
	used     int64
	capacity int64
	allocs   int
	frees    int
}

// Limit returns src capped at capacity bytes.
func Limit(src Source, capacity int64) *LimitedSource {
	return &LimitedSource{src: src, capacity: capacity}
}

// Alloc fails with ErrOutOfMemory when size would exceed the capacity.
func (l *LimitedSource) Alloc(size int64) (Segment, error) {
	l.mu.Lock()
	if l.used+size > l.capacity {
		used := l.used
		l.mu.Unlock()
		return Segment{}, fmt.Errorf("limited source: %d bytes requested, %d of %d in use: %w", size, used, l.capacity, ErrOutOfMemory)
	}
	l.used += size
	l.allocs++
	l.mu.Unlock()
	s, err := l.src.Alloc(size)
	if err != nil {
		l.mu.Lock()
		l.used -= size
		l.allocs--
		l.mu.Unlock()
	}
	return s, err
}

// Free returns the segment to the underlying source.
func (l *LimitedSource) Free(s Segment) error {
	l.mu.Lock()
	l.used -= s.Size
	l.frees++
	l.mu.Unlock()
	return l.src.Free(s)
}

// MemInfo reports capacity minus use, and the capacity.
func (l *LimitedSource) MemInfo() (free, total int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.capacity - l.used, l.capacity
}

// Counts reports how many segments were obtained and returned so far.
func (l *LimitedSource) Counts() (allocs, frees int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.allocs, l.frees
}
