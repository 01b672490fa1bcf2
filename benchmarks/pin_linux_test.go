package benchmarks

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOnCPUs: f runs on each allowed CPU in turn (up to the limit), its
// thread allowed on that CPU alone, and the thread gets its CPUs back.
func TestOnCPUs(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var before unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil {
		t.Skip("no affinity here:", err)
	}
	var seen []int
	ok := onCPUs(2, func(cpu int) {
		var now unix.CPUSet
		if err := unix.SchedGetaffinity(0, &now); err != nil || now.Count() != 1 || !now.IsSet(cpu) || !before.IsSet(cpu) {
			t.Errorf("f(%d) ran allowed on %d CPUs (%v)", cpu, now.Count(), err)
		}
		seen = append(seen, cpu)
	})
	if want := min(2, before.Count()); !ok || len(seen) != want || (want == 2 && seen[0] >= seen[1]) {
		t.Errorf("onCPUs ran f on CPUs %v (ok %v), want the first %d allowed ones", seen, ok, want)
	}
	var after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &after); err != nil || after != before {
		t.Errorf("the thread's CPUs after onCPUs: %d, before: %d (%v)", after.Count(), before.Count(), err)
	}
}
