package cpu_test

import (
	"testing"

	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/kernels/kerneltest"
)

// TestConformance runs the backend conformance suite on a second CPU backend:
// with outputs poisoned before every operation, it shows that each CPU
// operation writes every element of its output, and keeps the suite itself
// running on every CI run (the CUDA backend runs it against the CPU).
func TestConformance(t *testing.T) {
	kerneltest.Run(t, cpu.New())
}
