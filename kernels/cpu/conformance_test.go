package cpu_test

import (
	"testing"

	"github.com/leangrad/leangrad/internal/race"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/kernels/kerneltest"
	"github.com/leangrad/leangrad/memory"
)

// TestConformance runs the backend conformance suite on a second CPU backend.
// The suite's reference is the CPU backend itself, so this run checks no
// arithmetic: that is cpu_test.go's and rest_test.go's job, which hold every
// operation to a float64 reference written from its definition. With outputs
// poisoned before every operation, it shows that each CPU operation writes
// every element of its output, and keeps the suite running on every CI run
// (the CUDA backend runs it against the CPU). It runs without the race
// detector, under which it takes three minutes on two cores where the
// operations' concurrency is already held to it by cpu_test.go's and
// rest_test.go's cases: CI runs it in a step of its own.
func TestConformance(t *testing.T) {
	race.Skip(t, "go test ./kernels/cpu -run TestConformance")
	kerneltest.Run(t, cpu.New())
}

// TestOperationsOutOfMemory fails each allocation of each operation of the
// conformance suite in turn and checks that it gives back what it took
// (Note [operations out of memory]): on the CPU, the channels-last
// convolutions' channels-first copies.
func TestOperationsOutOfMemory(t *testing.T) {
	src := memory.Inject(memory.NewHeapSource(), memory.Faults{})
	be := cpu.NewWithAllocator(memory.New(src, memory.Config{Device: "cpu", NoCaching: true}))
	if n := kerneltest.RunOOM(t, be, src, kerneltest.Options{}, "conv"); n == 0 {
		t.Error("no convolution failed: the sweep reached none of their allocations")
	}
	if got := be.Allocator().Stats().Allocated[memory.All].Current; got != 0 {
		t.Errorf("%d bytes allocated after the cases' buffers were freed", got)
	}
}
