package memory

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// outside is the host memory the process holds outside the Go heap
// (page-locked segments: NoteOutsideHeap), which the Go runtime's memory
// limit does not see; goLimit is what LimitGoHeap was given (0: the
// runtime's limit is left alone).
var outside struct {
	mu      sync.Mutex
	bytes   int64
	goLimit int64
}

// NoteOutsideHeap records delta bytes of host memory taken by the process
// outside the Go heap (page-locked memory; negative: given back). The Go
// heap's limit (LimitGoHeap) and the CPU pool's room (HeapSource) shrink by
// what is held there, so that the Go heap's garbage and the page-locked
// memory beside it cannot together pass the host's memory.
func NoteOutsideHeap(delta int64) {
	outside.mu.Lock()
	defer outside.mu.Unlock()
	if outside.bytes+delta < 0 {
		panic(fmt.Sprintf("memory: %d bytes of host memory given back outside the Go heap, where %d were held: more host memory given back than was taken", -delta, outside.bytes))
	}
	outside.bytes += delta
	applyGoLimit()
}

// OutsideHeap is the host memory the process holds outside the Go heap
// (NoteOutsideHeap).
func OutsideHeap() int64 {
	outside.mu.Lock()
	defer outside.mu.Unlock()
	return outside.bytes
}

// LimitGoHeap sets the Go runtime's memory limit to bytes, less the host
// memory held outside the Go heap, and keeps it so as that changes: the
// garbage collector collects before the process as a whole passes bytes.
// The commands call it with a share of HostMemory; bytes <= 0 leaves the
// runtime's limit alone from here on.
func LimitGoHeap(bytes int64) {
	outside.mu.Lock()
	defer outside.mu.Unlock()
	outside.goLimit = bytes
	applyGoLimit()
}

// applyGoLimit sets the runtime's limit from outside (locked), at least
// 64 MiB so that the runtime is never left without room.
func applyGoLimit() {
	if outside.goLimit > 0 {
		debug.SetMemoryLimit(max(outside.goLimit-outside.bytes, 64<<20))
	}
}

// HostMemory is the memory this process may use on its host: the
// machine's physical memory, or less where a control group (a container's
// limit: cgroup v2's memory.max, v1's memory.limit_in_bytes, the lowest on
// the group's path) caps it. The CPU's pool has this capacity, so that a
// container gets the pool's out-of-memory error rather than the kernel's
// kill.
func HostMemory() int64 {
	total := int64(1) << 40
	var info syscall.Sysinfo_t
	if syscall.Sysinfo(&info) == nil {
		total = int64(info.Totalram) * int64(info.Unit)
	}
	if limit, ok := cgroupLimit("/proc/self/cgroup", "/sys/fs/cgroup"); ok && limit < total {
		return limit
	}
	return total
}

// cgroupLimit is the lowest memory limit on the path of the control group
// that the file self (/proc/self/cgroup's format) names, under the
// controllers mounted at root; ok is false when none is set.
func cgroupLimit(self, root string) (limit int64, ok bool) {
	f, err := os.Open(self)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "0::/path" (v2), "4:memory:/path" (v1)
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var dir, file string
		switch {
		case parts[0] == "0" && parts[1] == "":
			dir, file = root, "memory.max"
		case containsController(parts[1], "memory"):
			dir, file = filepath.Join(root, "memory"), "memory.limit_in_bytes"
		default:
			continue
		}
		for p := filepath.Join(dir, parts[2]); ; p = filepath.Dir(p) {
			if v, err := readLimit(filepath.Join(p, file)); err == nil && (!ok || v < limit) {
				limit, ok = v, true
			}
			if p == dir || len(p) <= len(dir) {
				break
			}
		}
	}
	return limit, ok
}

// containsController says whether a v1 line's list names c.
func containsController(list, c string) bool {
	for _, x := range strings.Split(list, ",") {
		if x == c {
			return true
		}
	}
	return false
}

// readLimit reads a limit file: a byte count; "max" (v2) and v1's
// unlimited (a number near 2^63) are no limit, an error.
func readLimit(path string) (int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(data))
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v <= 0 || v >= 1<<62 {
		return 0, os.ErrNotExist
	}
	return v, nil
}
