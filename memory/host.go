package memory

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

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
