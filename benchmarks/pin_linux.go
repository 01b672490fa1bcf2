//go:build linux

package benchmarks

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// onCPUs runs f(cpu) with the calling goroutine locked to its thread and
// the thread pinned to each of the first max CPUs the process may run on,
// in turn (sched_setaffinity), then gives the thread its CPUs back. It
// reports false, having run nothing, when the thread cannot be pinned.
func onCPUs(max int, f func(cpu int)) bool {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var all unix.CPUSet
	if unix.SchedGetaffinity(0, &all) != nil {
		return false
	}
	defer unix.SchedSetaffinity(0, &all)
	for cpu, done := 0, 0; done < min(max, all.Count()); cpu++ {
		if !all.IsSet(cpu) {
			continue
		}
		var one unix.CPUSet
		one.Set(cpu)
		if unix.SchedSetaffinity(0, &one) != nil {
			return done > 0
		}
		f(cpu)
		done++
	}
	return true
}
