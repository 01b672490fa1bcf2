package cuda

import (
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
// itself. It keeps the address ranges it handed out, so that Read and
// WritePinned can tell its memory from the Go heap's, and it counts them
// against the host's memory (memory.HostMemory).
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

// WritePinned queues one direct copy of src, page-locked memory from
// PinnedSource, into dst (kernels.PinnedCopier).
func (b *Backend) WritePinned(dst kernels.Buf, src []byte) {
	if int64(len(src)) != dst.Bytes() {
		panic(fmt.Sprintf("cuda: write of %d bytes into a %d-byte buffer", len(src), dst.Bytes()))
	}
	if !b.pinned.holds(src) {
		panic(fmt.Sprintf("cuda: WritePinned of %d bytes that are not this backend's page-locked memory", len(src)))
	}
	b.enter()
	defer b.exit()
	b.notCapturing("write of host bytes")
	b.queued("memcpy host to device")
	b.d.must("cuMemcpyHtoDAsync", b.d.memcpyHtoDAsync(ptrOf(dst), unsafe.Pointer(unsafe.SliceData(src)), uintptr(len(src)), b.stream))
}
