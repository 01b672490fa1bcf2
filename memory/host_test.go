package memory

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// TestCgroupLimit: the lowest limit on the control group's path, in v2's
// and v1's layouts; "max", v1's unlimited and no file are no limit.
func TestCgroupLimit(t *testing.T) {
	for _, c := range []struct {
		name  string
		self  string
		files map[string]string // under the root
		want  int64
		ok    bool
	}{
		{"v2, the group's own", "0::/a/b\n", map[string]string{"a/b/memory.max": "1073741824\n", "a/memory.max": "max\n"}, 1 << 30, true},
		{"v2, a parent's lower", "0::/a/b\n", map[string]string{"a/b/memory.max": "max\n", "a/memory.max": "536870912\n"}, 1 << 29, true},
		{"v2, none", "0::/a\n", map[string]string{"a/memory.max": "max\n"}, 0, false},
		{"v1", "5:cpu,cpuacct:/x\n4:memory:/docker/c1\n", map[string]string{"memory/docker/c1/memory.limit_in_bytes": "2147483648\n", "memory/memory.limit_in_bytes": "9223372036854771712\n"}, 2 << 30, true},
		{"v1, unlimited", "4:memory:/\n", map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0, false},
		{"no file", "0::/gone\n", nil, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			self := filepath.Join(dir, "cgroup")
			root := filepath.Join(dir, "fs")
			os.WriteFile(self, []byte(c.self), 0o644)
			for name, v := range c.files {
				p := filepath.Join(root, name)
				os.MkdirAll(filepath.Dir(p), 0o755)
				os.WriteFile(p, []byte(v), 0o644)
			}
			if got, ok := cgroupLimit(self, root); got != c.want || ok != c.ok {
				t.Errorf("cgroupLimit = %d, %v; want %d, %v", got, ok, c.want, c.ok)
			}
		})
	}
	if h := HostMemory(); h <= 0 {
		t.Errorf("HostMemory() = %d", h)
	}
	if _, total := NewHeapSource().MemInfo(); total != HostMemory() {
		t.Errorf("the CPU pool's capacity %d is not HostMemory's %d", total, HostMemory())
	}
}

// TestHeapSourceCountsTheWholeHeap: a segment that would take the Go heap
// past HeapShare of the source's total fails with ErrOutOfMemory, naming
// what the rest of the process holds, even where the segments alone fit.
func TestHeapSourceCountsTheWholeHeap(t *testing.T) {
	runtime.GC()
	h := &HeapSource{total: int64(float64(goHeap()+96<<20) / HeapShare)} // room for 96 MiB more
	s, err := h.Alloc(32 << 20)
	if err != nil {
		t.Fatal(err)
	}
	elsewhere := make([]byte, 64<<20) // a host buffer outside the pool
	for i := range elsewhere {
		elsewhere[i] = 1
	}
	_, err = h.Alloc(32 << 20)
	if !errors.Is(err, ErrOutOfMemory) || !strings.Contains(err.Error(), "elsewhere in the Go heap") {
		t.Errorf("a segment past the heap's share: %v", err)
	}
	runtime.KeepAlive(elsewhere)
	elsewhere = nil
	h.Free(s)
	if s, err = h.Alloc(32 << 20); err != nil { // collected: room again
		t.Errorf("after the buffer was dropped: %v", err)
	}
	h.Free(s)
	// Page-locked memory is outside the Go heap, and counts as well.
	NoteOutsideHeap(80 << 20)
	_, err = h.Alloc(32 << 20)
	NoteOutsideHeap(-80 << 20)
	if !errors.Is(err, ErrOutOfMemory) || !strings.Contains(err.Error(), "less 83886080 page-locked") {
		t.Errorf("a segment past the heap's share beside 80 MiB page-locked: %v", err)
	}
	if s, err = h.Alloc(32 << 20); err != nil {
		t.Errorf("after the page-locked memory was given back: %v", err)
	}
	h.Free(s)
}

// TestLimitGoHeap: the Go runtime's limit is LimitGoHeap's less what is
// held outside the heap, as that changes, and is left alone once
// LimitGoHeap(0) gives it up; giving back more than was taken panics.
func TestLimitGoHeap(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(old)
	defer LimitGoHeap(0)
	const gib = 1 << 30
	base := OutsideHeap()
	LimitGoHeap(1024 * gib)
	for _, c := range []struct {
		delta, want int64
	}{
		{3 * gib, 1021*gib - base},
		{-2 * gib, 1023*gib - base},
		{-gib, 1024*gib - base},
	} {
		NoteOutsideHeap(c.delta)
		if got := debug.SetMemoryLimit(-1); got != c.want {
			t.Errorf("after %d bytes outside the heap: the runtime's limit is %d, want %d", c.delta, got, c.want)
		}
	}
	LimitGoHeap(0)
	debug.SetMemoryLimit(old)
	NoteOutsideHeap(gib)
	NoteOutsideHeap(-gib)
	if got := debug.SetMemoryLimit(-1); got != old {
		t.Errorf("unmanaged, the runtime's limit moved from %d to %d", old, got)
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "more host memory given back") {
			t.Errorf("giving back more than was taken: %v", r)
		}
	}()
	NoteOutsideHeap(-base - 1)
}
